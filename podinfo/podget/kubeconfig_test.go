package podget

import (
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const goodKubeconfig = `{
  "apiVersion": "v1",
  "kind": "Config",
  "clusters": [
    {"name": "local", "cluster": {"server": "https://198.51.100.1:6443/", "certificate-authority-data": "Q0E=", "tls-server-name": "api.example"}}
  ],
  "users": [
    {"name": "nftmesh-cni", "user": {"token": "tok"}}
  ],
  "contexts": [
    {"name": "nftmesh-cni", "context": {"cluster": "local", "user": "nftmesh-cni"}}
  ],
  "current-context": "nftmesh-cni"
}
`

func writeKC(t *testing.T, dir, content string) string {
	t.Helper()
	p := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestLoadKubeconfig: what the agent writes is read; files named by a
// relative path are read beside the kubeconfig, as kubectl does.
func TestLoadKubeconfig(t *testing.T) {
	dir := t.TempDir()
	kc, err := LoadKubeconfig(writeKC(t, dir, goodKubeconfig))
	if err != nil {
		t.Fatal(err)
	}
	if kc.Server != "https://198.51.100.1:6443" || string(kc.CAData) != "CA" || kc.Token != "tok" || kc.ServerName != "api.example" {
		t.Fatalf("read %+v", kc)
	}
	for name, content := range map[string]string{"ca.crt": "CA2", "token": " tok2\n", "c.crt": "CERT", "c.key": "KEY"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	kc, err = LoadKubeconfig(writeKC(t, dir, `{"current-context":"x","contexts":[{"name":"x","context":{"cluster":"c","user":"u"}}],
"clusters":[{"name":"c","cluster":{"server":"https://h:1","certificate-authority":"ca.crt"}}],
"users":[{"name":"u","user":{"tokenFile":"token","client-certificate":"c.crt","client-key":"`+filepath.Join(dir, "c.key")+`"}}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if string(kc.CAData) != "CA2" || kc.Token != "tok2" || string(kc.CertData) != "CERT" || string(kc.KeyData) != "KEY" {
		t.Fatalf("read %+v", kc)
	}
}

// TestLoadKubeconfigBad: every problem is an error naming the file and the
// field (bounded), never a client that reads pods some other way.
func TestLoadKubeconfigBad(t *testing.T) {
	huge := strings.Repeat("x", 1<<20)
	swap := func(old, new string) string {
		if !strings.Contains(goodKubeconfig, old) {
			t.Fatalf("test case swaps %q, which the good kubeconfig does not hold", old)
		}
		return strings.Replace(goodKubeconfig, old, new, 1)
	}
	for _, tc := range []struct {
		name, content, want string
	}{
		{"not JSON", `{"clusters": [`, "kubeconfig"},
		{"YAML", "apiVersion: v1\nclusters: []\n", "not a JSON kubeconfig"},
		{"wrong type", `{"clusters": 3}`, "kubeconfig"},
		{"no current context", swap(`"current-context": "nftmesh-cni"`, `"current-context": ""`), "current-context is not set"},
		{"unknown context", swap(`"current-context": "nftmesh-cni"`, `"current-context": "other"`), `current-context "other"`},
		{"huge context name", swap(`"current-context": "nftmesh-cni"`, `"current-context": "`+huge+`"`), "bytes cut"},
		{"unknown cluster", swap(`{"cluster": "local",`, `{"cluster": "remote",`), `cluster "remote"`},
		{"unknown user", swap(`"user": "nftmesh-cni"}`, `"user": "bob"}`), `user "bob"`},
		{"no server", swap(`"server": "https://198.51.100.1:6443/"`, `"server": ""`), "server"},
		{"not a URL", swap(`"server": "https://198.51.100.1:6443/"`, `"server": "198.51.100.1:6443"`), `server "198.51.100.1:6443"`},
		{"a path on the server", swap(`"server": "https://198.51.100.1:6443/"`, `"server": "https://h/api"`), `server "https://h/api"`},
		{"ftp", swap(`"server": "https://198.51.100.1:6443/"`, `"server": "ftp://h"`), "not an http(s) URL"},
		{"bad proxy", swap(`"tls-server-name": "api.example"`, `"proxy-url": "::"`), "proxy-url"},
		{"exec plugin", swap(`"token": "tok"`, `"exec": {"command": "/bin/true", "apiVersion": "client.authentication.k8s.io/v1"}`), "exec credential plugins are not supported"},
		{"auth provider", swap(`"token": "tok"`, `"auth-provider": {"name": "gcp"}`), "auth-provider is not supported"},
		{"basic auth", swap(`"token": "tok"`, `"username": "admin"`), "basic auth is not supported"},
		{"impersonation", swap(`"token": "tok"`, `"token": "tok", "as": "admin"`), "impersonation"},
		{"missing CA file", swap(`"certificate-authority-data": "Q0E="`, `"certificate-authority": "nope.crt"`), "certificate-authority"},
		{"missing token file", swap(`"token": "tok"`, `"tokenFile": "/nonexistent/token"`), "tokenFile"},
		{"certificate without key", swap(`"token": "tok"`, `"client-certificate-data": "`+base64.StdEncoding.EncodeToString([]byte("C"))+`"`), "needs its key"},
		{"token with a line break", swap(`"token": "tok"`, `"token": "a\nb"`), "line break"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := writeKC(t, t.TempDir(), tc.content)
			_, err := LoadKubeconfig(path)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), path) || len(err.Error()) > 2048 {
				t.Fatalf("LoadKubeconfig = %.2100v, want an error naming %s and %q, bounded", err, path, tc.want)
			}
		})
	}
	if _, err := LoadKubeconfig(filepath.Join(t.TempDir(), "none")); err == nil {
		t.Fatal("a missing kubeconfig loaded")
	}
}

// FuzzLoadKubeconfig: any file gives a usable config or an error, bounded,
// never a panic; a loaded config always has an http(s) server.
func FuzzLoadKubeconfig(f *testing.F) {
	f.Add([]byte(goodKubeconfig))
	f.Add([]byte(`{"current-context":"x","contexts":[{"name":"x","context":{"cluster":"c"}}],"clusters":[{"name":"c","cluster":{"server":"http://h"}}]}`))
	f.Add([]byte(`{"clusters": 3}`))
	f.Add([]byte("clusters: 3"))
	path := filepath.Join(f.TempDir(), "kubeconfig")
	f.Fuzz(func(t *testing.T, data []byte) {
		kc, err := parseKubeconfig(path, data)
		if err != nil {
			if len(err.Error()) > 8192 {
				t.Fatalf("error of %d bytes", len(err.Error()))
			}
			return
		}
		if !strings.HasPrefix(kc.Server, "https://") && !strings.HasPrefix(kc.Server, "http://") {
			t.Fatalf("loaded a server %q", kc.Server)
		}
	})
}
