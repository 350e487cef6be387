package installer

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// host is a fake node file system in a temp dir. plugin and companion are
// the image's two binaries (random bytes, different from each other).
type host struct {
	root, bin, bin2, conf, run, sa, plugin, companion string
	saGen                                             int
}

func newHost(t *testing.T) *host {
	t.Helper()
	r := t.TempDir()
	h := hostAt(r)
	for _, d := range []string{h.bin, h.bin2, h.conf, h.sa, filepath.Join(r, "image")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []string{h.plugin, h.companion} {
		bin := make([]byte, 256<<10)
		_, _ = rand.Read(bin)
		if err := os.WriteFile(p, bin, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	h.rotateToken(t, "token-1")
	return h
}

// hostAt is the layout of a host rooted at r (newHost fills it), so a
// child process can take over a parent test's host.
func hostAt(r string) *host {
	h := &host{
		root: r,
		bin:  filepath.Join(r, "opt/cni/bin"),
		bin2: filepath.Join(r, "home/kubernetes/bin"),
		conf: filepath.Join(r, "etc/cni/net.d"),
		run:  filepath.Join(r, "var/run/nftmesh"),
		sa:   filepath.Join(r, "sa"),
	}
	h.plugin = filepath.Join(r, "image", PluginName)
	h.companion = filepath.Join(r, "image", StandaloneName)
	return h
}

// rotateToken lays the service-account dir out like kubelet's projected
// volume: files are links into ..data, which is swapped atomically.
func (h *host) rotateToken(t *testing.T, token string) {
	t.Helper()
	h.saGen++
	gen := fmt.Sprintf("..2026_01_01_00_00_%02d.%d", h.saGen, h.saGen)
	if err := os.Mkdir(filepath.Join(h.sa, gen), 0o755); err != nil {
		t.Fatal(err)
	}
	_ = os.WriteFile(filepath.Join(h.sa, gen, "token"), []byte(token), 0o644)
	_ = os.WriteFile(filepath.Join(h.sa, gen, "ca.crt"), []byte("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"), 0o644)
	_ = os.WriteFile(filepath.Join(h.sa, gen, "namespace"), []byte("nftmesh-system"), 0o644)
	tmp := filepath.Join(h.sa, "..data_tmp")
	if err := os.Symlink(gen, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(h.sa, "..data")); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"token", "ca.crt", "namespace"} {
		_ = os.Symlink(filepath.Join("..data", f), filepath.Join(h.sa, f))
	}
}

func testEnv(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func (h *host) config(t *testing.T, extra ...string) *Config {
	t.Helper()
	args := append([]string{
		"--cni-bin-dir", h.bin, "--cni-bin-dir", h.bin2,
		"--cni-conf-dir", h.conf, "--agent-run-dir", h.run,
		"--plugin-binary", h.plugin, "--service-account-dir", h.sa,
		"--pod-namespace", "nftmesh-system", "--reinstall-rate", "100000", "--reinstall-burst", "1000",
	}, extra...)
	c, err := ParseConfig(args, testEnv(map[string]string{"KUBERNETES_SERVICE_HOST": "fd00:10:96::1", "KUBERNETES_SERVICE_PORT": "443"}))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func (h *host) put(t *testing.T, sample string, mode fs.FileMode) (string, []byte) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(testConfDir, sample))
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(h.conf, filepath.Base(sample))
	if err := os.WriteFile(p, b, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
	return p, b
}

type agent struct {
	in     *Installer
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
}

func startAgent(t *testing.T, cfg *Config) *agent {
	t.Helper()
	log := zerolog.New(io.Discard)
	if testing.Verbose() {
		log = zerolog.New(zerolog.NewTestWriter(t))
	}
	in, err := New(cfg, log, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	a := &agent{in: in, cancel: cancel, done: make(chan error, 1)}
	go func() { a.done <- in.Run(ctx) }()
	t.Cleanup(a.stop)
	return a
}

func (a *agent) stop() {
	a.once.Do(func() {
		a.cancel()
		select {
		case err := <-a.done:
			if err != nil {
				panic(err)
			}
		case <-time.After(10 * time.Second):
			panic("agent did not stop")
		}
	})
}

// waitFor waits, reconcile by reconcile, until cond holds.
func (a *agent) waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for !cond() {
		select {
		case <-a.in.Reconciled:
		case <-time.After(50 * time.Millisecond): // a reconcile may have happened before we waited
		case <-deadline:
			t.Fatalf("timed out waiting for %s (ready: %v)", what, a.in.Ready())
		}
	}
}

func (a *agent) waitReady(t *testing.T) {
	t.Helper()
	a.waitFor(t, "ready", func() bool { return a.in.Ready() == nil })
}

func modeOf(t *testing.T, p string) fs.FileMode {
	t.Helper()
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode().Perm()
}

// assertBinariesGone checks that no bin dir holds either binary.
func (h *host) assertBinariesGone(t *testing.T) {
	t.Helper()
	for _, d := range []string{h.bin, h.bin2} {
		assertGone(t, filepath.Join(d, PluginName))
		assertGone(t, filepath.Join(d, StandaloneName))
	}
}

func assertGone(t *testing.T, p string) {
	t.Helper()
	if _, err := os.Lstat(p); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("%s still exists (%v)", p, err)
	}
}

func (h *host) assertInstalled(t *testing.T, cfg *Config) {
	t.Helper()
	for name, from := range map[string]string{PluginName: h.plugin, StandaloneName: h.companion} {
		src, _ := os.ReadFile(from)
		for _, d := range []string{h.bin, h.bin2} {
			got, err := os.ReadFile(filepath.Join(d, name))
			if err != nil || !bytes.Equal(got, src) {
				t.Errorf("%s in %s missing or different (%v)", name, d, err)
				continue
			}
			if m := modeOf(t, filepath.Join(d, name)); m != 0o755 {
				t.Errorf("%s mode %v, want 0755", name, m)
			}
		}
	}
	if m := modeOf(t, cfg.KubeconfigPath()); m != 0o600 {
		t.Errorf("kubeconfig mode %v, want 0600", m)
	}
}
