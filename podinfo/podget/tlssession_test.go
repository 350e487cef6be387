package podget

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/nftmesh/nftmesh/internal/kubeconf"
)

func TestSessionFileRoundTrip(t *testing.T) {
	b := encodeSession("127.0.0.1:6443", []byte("ticket"), []byte("state\x00bytes"))
	k, ticket, state, err := decodeSession(b)
	if err != nil || k != "127.0.0.1:6443" || string(ticket) != "ticket" || string(state) != "state\x00bytes" {
		t.Fatalf("round trip: %q %q %q %v", k, ticket, state, err)
	}
	good := encodeSession("k", []byte("t"), []byte("s"))
	for name, in := range map[string][]byte{
		"empty":            nil,
		"other magic":      append([]byte("nftmesh-tls-session/2\n"), good[len(sessionMagic):]...),
		"magic only":       []byte(sessionMagic),
		"truncated":        good[:len(good)-1],
		"trailing":         append(bytes.Clone(good), 0),
		"huge length":      append([]byte(sessionMagic), 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01),
		"bad varint":       append([]byte(sessionMagic), 0x80),
		"empty ticket":     encodeSession("k", nil, []byte("s")),
		"empty state":      encodeSession("k", []byte("t"), nil),
		"length past data": append([]byte(sessionMagic), 5, 'k'),
		// 0x80 0x00 reads as 0: a second encoding of the same file.
		"padded key length":    []byte(sessionMagic + "\x80\x00\x01t\x01s"),
		"padded ticket length": []byte(sessionMagic + "\x01k\x81\x00t\x01s"),
	} {
		if _, _, _, err := decodeSession(in); err == nil {
			t.Errorf("%s: decoded without error", name)
		}
	}
}

func FuzzDecodeSession(f *testing.F) {
	f.Add(encodeSession("k", []byte("t"), []byte("s")))
	f.Add([]byte(sessionMagic))
	f.Add([]byte("garbage"))
	f.Fuzz(func(t *testing.T, b []byte) {
		k, ticket, state, err := decodeSession(b)
		if err != nil {
			return
		}
		if !bytes.Equal(encodeSession(k, ticket, state), b) {
			t.Fatalf("decode/encode is not the identity for %q", b)
		}
	})
}

func TestSessionFileNameSeparatesTrust(t *testing.T) {
	base := sessionFileName("/run", "https://a:6443", "", []byte("ca1"))
	for _, other := range []string{
		sessionFileName("/run", "https://b:6443", "", []byte("ca1")),
		sessionFileName("/run", "https://a:6443", "kubernetes", []byte("ca1")),
		sessionFileName("/run", "https://a:6443", "", []byte("ca2")),
		// Field boundaries count: no two splits of the same bytes collide.
		sessionFileName("/run", "https://a:644", "3", []byte("ca1")),
	} {
		if other == base {
			t.Errorf("%s names two different trust settings", other)
		}
	}
	if !strings.HasPrefix(filepath.Base(base), SessionFilePrefix) || filepath.Dir(base) != "/run" {
		t.Errorf("session file %s", base)
	}
}

// TestTLSSessionResumption runs the session file against a real API server,
// each client with its own transport as separate plugin processes would
// have: the first run does a full handshake and keeps the session (0600),
// the next one resumes it; a damaged file costs a full handshake and
// nothing else; a session is never offered under another CA; and a server
// the configured CA does not vouch for is refused even with a session in
// the file.
func TestTLSSessionResumption(t *testing.T) {
	api, reader, token := startWithPod(t)
	ctx := context.Background()
	runDir := t.TempDir()
	kc := filepath.Join(runDir, "kubeconfig")
	if b, err := os.ReadFile(reader); err != nil || os.WriteFile(kc, b, 0o600) != nil {
		t.Fatalf("copying the kubeconfig into the run dir: %v", err)
	}

	run := func(kubeconfig string, timeout ...time.Duration) (*Client, error) {
		t.Helper()
		c, err := NewFromFile(kubeconfig, Options{SessionDir: runDir})
		if err != nil {
			t.Fatal(err)
		}
		if c.sessions == nil {
			t.Fatal("no session cache for a token kubeconfig over https")
		}
		d := 3 * time.Second
		if len(timeout) > 0 {
			d = timeout[0]
		}
		_, err = c.GetPod(ctx, "shop", "web-1", "", d)
		return c, err
	}
	sessionFiles := func() []string {
		m, _ := filepath.Glob(filepath.Join(runDir, SessionFilePrefix+"*"))
		return m
	}

	first, err := run(kc)
	if err != nil {
		t.Fatal(err)
	}
	if first.sessions.resumed {
		t.Fatal("the first run resumed a session out of nowhere")
	}
	files := sessionFiles()
	if len(files) != 1 || files[0] != first.sessions.path {
		t.Fatalf("session files %v, want exactly %s", files, first.sessions.path)
	}
	fi, err := os.Stat(files[0])
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("session file mode: %v %v", fi, err)
	}
	kept, _ := os.ReadFile(files[0])

	second, err := run(kc)
	if err != nil {
		t.Fatal(err)
	}
	if !second.sessions.resumed {
		t.Fatal("the second run did a full handshake despite the kept session")
	}
	if now, _ := os.ReadFile(files[0]); !bytes.Equal(now, kept) {
		t.Error("a resumed run rewrote a fresh session file")
	}

	// A damaged file: full handshake, GET works, the file is good again.
	if err := os.WriteFile(files[0], []byte("damaged"), 0o600); err != nil {
		t.Fatal(err)
	}
	third, err := run(kc)
	if err != nil {
		t.Fatalf("GET with a damaged session file: %v", err)
	}
	if third.sessions.resumed {
		t.Fatal("resumed from a damaged file")
	}
	if b, _ := os.ReadFile(files[0]); bytes.Equal(b, []byte("damaged")) {
		t.Error("the damaged session file was not replaced")
	}
	if fourth, err := run(kc); err != nil || !fourth.sessions.resumed {
		t.Fatalf("after repair: resumed=%v err=%v", fourth != nil && fourth.sessions.resumed, err)
	}

	// Another CA: another file, so no session is offered; the server's
	// certificate is checked and refused. Then plant the good session under
	// the other CA's name: still refused, crypto/tls re-checks the trust.
	wrongCA := filepath.Join(t.TempDir(), "kubeconfig")
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["c"] = &clientcmdapi.Cluster{Server: api.Host, CertificateAuthorityData: selfSignedPEM(t)}
	cfg.AuthInfos["u"] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["x"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "u"}
	cfg.CurrentContext = "x"
	b, err := kubeconf.JSON(*cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(wrongCA, b, 0o600); err != nil {
		t.Fatal(err)
	}
	wrong, err := run(wrongCA, 200*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("GET under a CA that did not sign the server's certificate: %v, want a certificate error", err)
	}
	if wrong.sessions.path == files[0] {
		t.Fatal("two CAs share a session file")
	}
	if err := os.WriteFile(wrong.sessions.path, kept, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := run(wrongCA, 200*time.Millisecond); err == nil {
		t.Fatal("a planted session let a client resume with a server its CA does not vouch for")
	}

	if err := RemoveTLSSessions(runDir); err != nil {
		t.Fatal(err)
	}
	if left := sessionFiles(); len(left) != 0 {
		t.Errorf("RemoveTLSSessions left %v", left)
	}
	if _, err := os.Stat(kc); err != nil {
		t.Errorf("RemoveTLSSessions touched the kubeconfig: %v", err)
	}
}

// TestTLSSessionPlainHTTP: a server over plain HTTP has no session to
// keep.
func TestTLSSessionPlainHTTP(t *testing.T) {
	c, err := New(&Kubeconfig{Server: "http://127.0.0.1:8080", Token: "t"}, Options{SessionDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if c.sessions != nil {
		t.Error("session cache installed for plain HTTP")
	}
}

func selfSignedPEM(t *testing.T) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "other-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}
