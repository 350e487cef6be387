package podget

import (
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

// goodYAML is a kubeconfig as kubectl and most tools write it: YAML.
const goodYAML = `apiVersion: v1
kind: Config
clusters:
- name: local
  cluster:
    server: https://198.51.100.1:6443/
    certificate-authority-data: Q0E=
    tls-server-name: api.example
users:
- name: nftmesh-cni
  user:
    token: tok
contexts:
- name: nftmesh-cni
  context:
    cluster: local
    user: nftmesh-cni
current-context: nftmesh-cni
`

// TestLoadKubeconfig: what the agent writes (JSON) and what kubectl writes
// (YAML) are both read; files named by a relative path are read beside the
// kubeconfig, as kubectl does. Before, the YAML one failed with "not a JSON
// kubeconfig".
func TestLoadKubeconfig(t *testing.T) {
	for name, content := range map[string]string{"JSON": goodKubeconfig, "YAML": goodYAML} {
		kc, err := LoadKubeconfig(writeKC(t, t.TempDir(), content))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if kc.Host != "https://198.51.100.1:6443/" || string(kc.CAData) != "CA" || kc.BearerToken != "tok" || kc.ServerName != "api.example" {
			t.Fatalf("%s: read %+v", name, kc)
		}
	}
	dir := t.TempDir()
	for name, content := range map[string]string{"ca.crt": "CA2", "token": " tok2\n", "c.crt": "CERT", "c.key": "KEY"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	kc, err := LoadKubeconfig(writeKC(t, dir, `{"current-context":"x","contexts":[{"name":"x","context":{"cluster":"c","user":"u"}}],
"clusters":[{"name":"c","cluster":{"server":"https://h:1","certificate-authority":"ca.crt"}}],
"users":[{"name":"u","user":{"tokenFile":"token","client-certificate":"c.crt","client-key":"`+filepath.Join(dir, "c.key")+`"}}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if kc.CAFile != filepath.Join(dir, "ca.crt") || kc.BearerTokenFile != filepath.Join(dir, "token") || kc.CertFile != filepath.Join(dir, "c.crt") || kc.KeyFile != filepath.Join(dir, "c.key") {
		t.Fatalf("read %+v", kc)
	}
}

// TestLoadKubeconfigBad: every problem is an error naming the file (and
// what clientcmd found wrong), bounded, never a client that reads pods
// some other way.
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
		{"not YAML", "clusters: [\n", "kubeconfig"},
		{"wrong type", `{"clusters": 3}`, "kubeconfig"},
		{"no current context", swap(`"current-context": "nftmesh-cni"`, `"current-context": ""`), "no context chosen"},
		{"unknown context", swap(`"current-context": "nftmesh-cni"`, `"current-context": "other"`), `context was not found for specified context: other`},
		{"huge context name", swap(`"current-context": "nftmesh-cni"`, `"current-context": "`+huge+`"`), "bytes cut"},
		{"unknown cluster", swap(`{"cluster": "local",`, `{"cluster": "remote",`), `cluster "remote"`},
		{"unknown user", swap(`"user": "nftmesh-cni"}`, `"user": "bob"}`), `user "bob"`},
		{"no server", swap(`"server": "https://198.51.100.1:6443/"`, `"server": ""`), "no server found"},
		{"exec plugin", swap(`"token": "tok"`, `"exec": {"command": "/bin/true", "apiVersion": "client.authentication.k8s.io/v1"}`), "exec credential plugins are not supported"},
		{"auth provider", swap(`"token": "tok"`, `"auth-provider": {"name": "gcp"}`), "auth-provider is not supported"},
		{"missing CA file", swap(`"certificate-authority-data": "Q0E="`, `"certificate-authority": "nope.crt"`), "nope.crt"},
		{"missing token file", swap(`"token": "tok"`, `"tokenFile": "/nonexistent/token"`), "/nonexistent/token"},
		{"token and basic auth", swap(`"token": "tok"`, `"token": "s3cret-token", "username": "admin", "password": "pw"`), "more than one authentication method"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := writeKC(t, t.TempDir(), tc.content)
			_, err := LoadKubeconfig(path)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), path) || len(err.Error()) > 2048 {
				t.Fatalf("LoadKubeconfig = %.2100v, want an error naming %s and %q, bounded", err, path, tc.want)
			}
			if strings.Contains(err.Error(), "s3cret-token") {
				t.Fatalf("the error holds the token: %v", err)
			}
		})
	}
	if _, err := LoadKubeconfig(filepath.Join(t.TempDir(), "none")); err == nil {
		t.Fatal("a missing kubeconfig loaded")
	}
}

// FuzzLoadKubeconfig: any file gives a usable config or an error, bounded,
// never a panic; a loaded config always names a server.
func FuzzLoadKubeconfig(f *testing.F) {
	f.Add([]byte(goodKubeconfig))
	f.Add([]byte(goodYAML))
	f.Add([]byte(`{"current-context":"x","contexts":[{"name":"x","context":{"cluster":"c"}}],"clusters":[{"name":"c","cluster":{"server":"http://h"}}]}`))
	f.Add([]byte(`{"clusters": 3}`))
	f.Add([]byte("clusters: 3"))
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte) {
		path := filepath.Join(dir, "kubeconfig")
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		kc, err := LoadKubeconfig(path)
		if err != nil {
			if len(err.Error()) > 8192 {
				t.Fatalf("error of %d bytes", len(err.Error()))
			}
			return
		}
		if kc.Host == "" {
			t.Fatalf("loaded a config without a server: %+v", kc)
		}
	})
}
