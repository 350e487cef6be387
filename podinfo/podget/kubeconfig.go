package podget

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/nftmesh/nftmesh/redirect/quote"
)

// Kubeconfig is what a pod GET needs from a kubeconfig file: the current
// context's server and how to trust it, and its user's credentials.
type Kubeconfig struct {
	Path       string // the file it was read from
	Server     string // https://host:port (or http://)
	ServerName string // tls-server-name
	CAData     []byte // PEM; nil means the system's roots
	Insecure   bool   // insecure-skip-tls-verify
	ProxyURL   string
	Token      string
	CertData   []byte // client certificate, PEM
	KeyData    []byte // client key, PEM
}

// The file's shape: clientcmd's v1 Config, only the fields a pod GET uses,
// plus those whose presence makes the file one this client cannot honour.
type kubeconfigFile struct {
	CurrentContext string `json:"current-context"`
	Clusters       []struct {
		Name    string `json:"name"`
		Cluster struct {
			Server                   string `json:"server"`
			TLSServerName            string `json:"tls-server-name"`
			InsecureSkipTLSVerify    bool   `json:"insecure-skip-tls-verify"`
			CertificateAuthority     string `json:"certificate-authority"`
			CertificateAuthorityData []byte `json:"certificate-authority-data"`
			ProxyURL                 string `json:"proxy-url"`
		} `json:"cluster"`
	} `json:"clusters"`
	Users []struct {
		Name string `json:"name"`
		User struct {
			Token                 string          `json:"token"`
			TokenFile             string          `json:"tokenFile"`
			ClientCertificate     string          `json:"client-certificate"`
			ClientCertificateData []byte          `json:"client-certificate-data"`
			ClientKey             string          `json:"client-key"`
			ClientKeyData         []byte          `json:"client-key-data"`
			Username              string          `json:"username"`
			Exec                  json.RawMessage `json:"exec"`
			AuthProvider          json.RawMessage `json:"auth-provider"`
			As                    string          `json:"as"`
		} `json:"user"`
	} `json:"users"`
	Contexts []struct {
		Name    string `json:"name"`
		Context struct {
			Cluster string `json:"cluster"`
			User    string `json:"user"`
		} `json:"context"`
	} `json:"contexts"`
}

// maxKubeconfig bounds what LoadKubeconfig reads: a kubeconfig with a CA
// bundle and client certificates is a few KiB.
const maxKubeconfig = 4 << 20

// LoadKubeconfig reads the current context of a kubeconfig file in JSON
// (as the agent writes it), with files it names read relative to the kubeconfig's directory
// as kubectl does. Credentials this client does not implement (exec and
// auth-provider plugins, basic auth, impersonation) are an error naming the
// field: the caller fails closed rather than reading pods as somebody else.
func LoadKubeconfig(path string) (*Kubeconfig, error) {
	fail := func(format string, args ...any) error {
		return fmt.Errorf("loading kubeconfig %s: %s", path, fmt.Sprintf(format, args...))
	}
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("loading kubeconfig %s: %w", path, err)
	}
	if st.Size() > maxKubeconfig {
		return nil, fail("%d bytes, over the %d-byte limit", st.Size(), maxKubeconfig)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("loading kubeconfig %s: %w", path, err)
	}
	return parseKubeconfig(path, data)
}

// parseKubeconfig reads data, the content of the kubeconfig at path (whose
// directory relative file names are read from).
func parseKubeconfig(path string, data []byte) (*Kubeconfig, error) {
	fail := func(format string, args ...any) error {
		return fmt.Errorf("loading kubeconfig %s: %s", path, fmt.Sprintf(format, args...))
	}
	var f kubeconfigFile
	var err error
	if t := bytes.TrimSpace(data); len(t) > 0 && t[0] != '{' {
		// The agent writes JSON (kubectl reads it too); the plugin links
		// no YAML parser, whose start-up every run would pay.
		return nil, fail("not a JSON kubeconfig (the nftmesh agent writes it as JSON: a YAML one here was written by something else; restarting the agent rewrites it)")
	}
	if err = json.Unmarshal(data, &f); err != nil {
		// The decoder's message may quote the file's content: bounded.
		return nil, fail("%s", quote.Text(err.Error()))
	}
	if f.CurrentContext == "" {
		return nil, fail("current-context is not set")
	}
	var cluster, user string
	found := false
	for _, c := range f.Contexts {
		if c.Name == f.CurrentContext {
			cluster, user, found = c.Context.Cluster, c.Context.User, true
		}
	}
	if !found {
		return nil, fail("current-context %s names no context", quote.Value(f.CurrentContext))
	}
	kc := &Kubeconfig{Path: path}
	dir := filepath.Dir(path)
	file := func(field, p string) ([]byte, error) {
		if !filepath.IsAbs(p) {
			p = filepath.Join(dir, p)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("loading kubeconfig %s: %s: %w", path, field, err)
		}
		return b, nil
	}
	found = false
	for _, c := range f.Clusters {
		if c.Name != cluster {
			continue
		}
		found = true
		cl := c.Cluster
		kc.Server, kc.ServerName, kc.Insecure, kc.CAData, kc.ProxyURL = strings.TrimRight(cl.Server, "/"), cl.TLSServerName, cl.InsecureSkipTLSVerify, cl.CertificateAuthorityData, cl.ProxyURL
		if len(kc.CAData) == 0 && cl.CertificateAuthority != "" {
			if kc.CAData, err = file("certificate-authority", cl.CertificateAuthority); err != nil {
				return nil, err
			}
		}
	}
	if !found {
		return nil, fail("context %s names cluster %s, which is not in the file", quote.Value(f.CurrentContext), quote.Value(cluster))
	}
	u, err := url.Parse(kc.Server)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || (u.Path != "" && u.Path != "/") {
		return nil, fail("server %s is not an http(s) URL of a host", quote.Value(kc.Server))
	}
	if kc.ProxyURL != "" {
		if p, err := url.Parse(kc.ProxyURL); err != nil || p.Host == "" {
			return nil, fail("proxy-url %s is not a URL", quote.Value(kc.ProxyURL))
		}
	}
	found = user == ""
	for _, us := range f.Users {
		if us.Name != user {
			continue
		}
		found = true
		a := us.User
		switch {
		case len(a.Exec) > 0 && string(a.Exec) != "null":
			return nil, fail("user %s: exec credential plugins are not supported by nftmesh-cni (use a token or client certificate)", quote.Value(user))
		case len(a.AuthProvider) > 0 && string(a.AuthProvider) != "null":
			return nil, fail("user %s: auth-provider is not supported by nftmesh-cni (use a token or client certificate)", quote.Value(user))
		case a.Username != "":
			return nil, fail("user %s: basic auth is not supported by nftmesh-cni (use a token or client certificate)", quote.Value(user))
		case a.As != "":
			return nil, fail("user %s: impersonation (as) is not supported by nftmesh-cni", quote.Value(user))
		}
		kc.Token = a.Token
		if kc.Token == "" && a.TokenFile != "" {
			b, err := file("tokenFile", a.TokenFile)
			if err != nil {
				return nil, err
			}
			kc.Token = strings.TrimSpace(string(b))
		}
		kc.CertData, kc.KeyData = a.ClientCertificateData, a.ClientKeyData
		if len(kc.CertData) == 0 && a.ClientCertificate != "" {
			if kc.CertData, err = file("client-certificate", a.ClientCertificate); err != nil {
				return nil, err
			}
		}
		if len(kc.KeyData) == 0 && a.ClientKey != "" {
			if kc.KeyData, err = file("client-key", a.ClientKey); err != nil {
				return nil, err
			}
		}
		if (len(kc.CertData) == 0) != (len(kc.KeyData) == 0) {
			return nil, fail("user %s: a client certificate needs its key and the other way round", quote.Value(user))
		}
	}
	if !found {
		return nil, fail("context %s names user %s, which is not in the file", quote.Value(f.CurrentContext), quote.Value(user))
	}
	if strings.ContainsAny(kc.Token, "\r\n") {
		return nil, errors.New("loading kubeconfig " + path + ": the token holds a line break")
	}
	return kc, nil
}
