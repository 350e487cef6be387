package installer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/nftmesh/nftmesh/installer/conflist"
	"github.com/nftmesh/nftmesh/installer/metrics"
	"github.com/nftmesh/nftmesh/internal/atomicfile"
	"github.com/nftmesh/nftmesh/testkit/cnitest"
	"github.com/nftmesh/nftmesh/testkit/nstest"
)

// TestUpgradeRemovesLegacyTLSSessions: TLS session files an older plugin
// kept in the run dir are removed when the agent starts, also when the
// kubeconfig it finds is already the one it would write (an upgrade with
// the same token and CA). Before, they stayed until the kubeconfig changed.
func TestUpgradeRemovesLegacyTLSSessions(t *testing.T) {
	for _, src := range cnitest.RealWorld(t) {
		if filepath.Ext(src) != ".conflist" {
			continue
		}
		h := newHost(t)
		h.put(t, filepath.Base(src), 0o640)
		cfg := h.config(t)
		kc, err := RenderKubeconfig(cfg.KubeAPIServer, cfg.ServiceAccountDir, cfg.KubeCAFile)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(h.run, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(cfg.KubeconfigPath(), kc, KubeconfigMode); err != nil {
			t.Fatal(err)
		}
		session := filepath.Join(h.run, legacyTLSSessionPrefix+"0123abcd")
		if err := os.WriteFile(session, []byte("ticket"), 0o600); err != nil {
			t.Fatal(err)
		}
		a := startAgent(t, cfg)
		a.waitReady(t)
		assertGone(t, session)
		return
	}
	t.Fatal("no real-world conflist")
}

func TestRunChainedRealWorldAndCleanup(t *testing.T) {
	for _, src := range cnitest.RealWorld(t) {
		if filepath.Ext(src) != ".conflist" {
			continue
		}
		t.Run(filepath.Base(src), func(t *testing.T) {
			h := newHost(t)
			p, orig := h.put(t, filepath.Base(src), 0o640)
			cfg := h.config(t)
			a := startAgent(t, cfg)
			a.waitReady(t)

			h.assertInstalled(t, cfg)
			l, err := libcni.ConfListFromFile(p)
			if err != nil {
				t.Fatalf("installed config does not load: %v", err)
			}
			if last := l.Plugins[len(l.Plugins)-1]; last.Network.Type != PluginName {
				t.Errorf("last plugin %s", last.Network.Type)
			}
			if m := modeOf(t, p); m != 0o640 {
				t.Errorf("mode %v, want the primary's 0640", m)
			}
			kc, err := clientcmd.LoadFromFile(cfg.KubeconfigPath())
			if err != nil {
				t.Fatal(err)
			}
			if s := kc.Clusters["local"].Server; s != "https://[fd00:10:96::1]:443" {
				t.Errorf("server %q, want the bracketed IPv6 URL", s)
			}
			if kc.AuthInfos[PluginName].Token != "token-1" {
				t.Errorf("token %q", kc.AuthInfos[PluginName].Token)
			}

			// An older plugin's TLS session file goes with the kubeconfig.
			session := filepath.Join(h.run, legacyTLSSessionPrefix+"0123")
			if err := os.WriteFile(session, []byte("x"), 0o600); err != nil {
				t.Fatal(err)
			}
			a.stop()
			if err := a.in.Cleanup(); err != nil {
				t.Fatal(err)
			}
			assertGone(t, session)
			got, _ := os.ReadFile(p)
			if !bytes.Equal(got, orig) {
				t.Errorf("cleanup did not restore the original bytes:\n%s", got)
			}
			if m := modeOf(t, p); m != 0o640 {
				t.Errorf("mode after cleanup %v", m)
			}
			h.assertBinariesGone(t)
			assertGone(t, cfg.KubeconfigPath())
			assertGone(t, filepath.Join(h.run, legacyStateName))
			assertGone(t, filepath.Join(h.conf, UndoDirName))
			entries, _ := os.ReadDir(h.conf)
			if len(entries) != 1 {
				t.Errorf("conf dir has %d entries after cleanup, want only the primary", len(entries))
			}
		})
	}
}

func TestConfToConflistAndRestore(t *testing.T) {
	h := newHost(t)
	p, orig := h.put(t, "10-bridge.conf", 0o600)
	cfg := h.config(t)
	a := startAgent(t, cfg)
	a.waitReady(t)

	lp := filepath.Join(h.conf, "10-bridge.conflist")
	assertGone(t, p)
	l, err := libcni.ConfListFromFile(lp)
	if err != nil {
		t.Fatal(err)
	}
	if l.CNIVersion != "0.4.0" || len(l.Plugins) != 2 || l.Plugins[0].Network.Type != "bridge" {
		t.Errorf("converted list: version %s, %d plugins", l.CNIVersion, len(l.Plugins))
	}
	if m := modeOf(t, lp); m != 0o600 {
		t.Errorf("converted list mode %v, want the .conf's 0600", m)
	}
	a.stop()
	if err := a.in.Cleanup(); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(p)
	if err != nil || !bytes.Equal(got, orig) {
		t.Fatalf("the .conf was not restored byte for byte: %v\n%s", err, got)
	}
	if m := modeOf(t, p); m != 0o600 {
		t.Errorf("restored mode %v", m)
	}
	assertGone(t, lp)
}

// The primary rewrites its file 100 times in a row, alternating in-place
// writes and atomic replacements; each time the real watch loop puts our
// entry back, and the fight is detected and counted.
func TestReinsertAfterPrimaryRewrites(t *testing.T) {
	h := newHost(t)
	p, orig := h.put(t, "10-calico.conflist", 0o644)
	cfg := h.config(t, "--fight-threshold", "5", "--fight-window", "1h")
	a := startAgent(t, cfg)
	a.waitReady(t)
	ours := cfg.PluginConf().JSON()

	const rewrites = 100
	for i := range rewrites {
		if i%2 == 0 {
			if err := os.WriteFile(p, orig, 0o644); err != nil {
				t.Fatal(err)
			}
		} else {
			tmp := filepath.Join(h.conf, ".calico-tmp")
			if err := os.WriteFile(tmp, orig, 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(tmp, p); err != nil {
				t.Fatal(err)
			}
		}
		a.waitFor(t, fmt.Sprintf("re-insert %d", i+1), func() bool { return conflist.VerifyInstalled(p, ours) == nil })
	}
	a.waitReady(t)
	m := a.in.m
	if got := testutil.ToFloat64(m.Reinserts); got != rewrites {
		t.Errorf("reinserts_total = %v, want %d", got, rewrites)
	}
	if got := testutil.ToFloat64(m.Fights); got != rewrites-5 {
		t.Errorf("fights_total = %v, want %d (every re-insert beyond the threshold of 5)", got, rewrites-5)
	}
	l, err := libcni.ConfListFromFile(p)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, pl := range l.Plugins {
		if pl.Network.Type == PluginName {
			n++
		}
	}
	if n != 1 {
		t.Errorf("%d copies of our entry after the fight", n)
	}
	a.stop()
	if err := a.in.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(p); !bytes.Equal(got, orig) {
		t.Errorf("not restored after the fight:\n%s", got)
	}
}

func TestStandalone(t *testing.T) {
	h := newHost(t)
	p, orig := h.put(t, "10-calico.conflist", 0o644)
	cfg := h.config(t, "--chained=false", "--cni-conf-file-name", "nftmesh-cni.conf")
	a := startAgent(t, cfg)
	a.waitReady(t)

	own := filepath.Join(h.conf, "nftmesh-cni.conf")
	//lint:ignore SA1019 kubelet and containerd still load single-plugin .conf files; libcni reads them only through these
	c, err := libcni.ConfFromFile(own)
	if err != nil {
		t.Fatal(err)
	}
	if c.Network.Type != PluginName || c.Network.CNIVersion != StandaloneCNIVersion {
		t.Errorf("standalone conf: %s", c.Bytes)
	}
	if got, _ := os.ReadFile(p); !bytes.Equal(got, orig) {
		t.Error("standalone mode touched the primary config")
	}
	// Someone deletes it: it comes back.
	_ = os.Remove(own)
	a.waitFor(t, "standalone file back", func() bool { _, err := os.Stat(own); return err == nil && a.in.Ready() == nil })

	a.stop()
	if err := a.in.Cleanup(); err != nil {
		t.Fatal(err)
	}
	assertGone(t, own)
	if got, _ := os.ReadFile(p); !bytes.Equal(got, orig) {
		t.Error("primary changed")
	}
}

// On OpenShift Istio's injector names the Multus network default/istio-cni:
// Multus finds a NetworkAttachmentDefinition without a config by the name
// inside the files of its conf dir, so the standalone file must carry that
// name. A file of Istio's own agent (type istio-cni) in the conf dir, under
// our file name or another, is never overwritten: the agent refuses and
// says why (two capture plugins would fight over every pod) until it is
// gone, then writes its own; when Istio's comes back (a rollback), ours is
// taken out and Istio's kept.
func TestStandaloneNamedForIstioInjector(t *testing.T) {
	h := newHost(t)
	left := filepath.Join(h.conf, "istio-cni.conf")
	istio := []byte(`{"cniVersion":"0.3.1","name":"istio-cni","type":"istio-cni"}`)
	if err := os.WriteFile(left, istio, 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := h.config(t, "--chained=false", "--cni-conf-file-name", "istio-cni.conf", "--cni-network-name", "istio-cni")
	a := startAgent(t, cfg)
	var fe *ForeignCaptureError
	a.waitFor(t, "the refusal", func() bool { return errors.As(a.in.Ready(), &fe) })
	if !fe.Standalone || fe.File != left || fe.Plugin != "istio-cni" || !strings.Contains(fe.Error(), "two capture plugins") {
		t.Errorf("refusal: %+v: %v", fe, fe)
	}
	if got := mustRead(t, left); !bytes.Equal(got, istio) {
		t.Fatalf("Istio's standalone config was overwritten:\n%s", got)
	}

	// Istio's agent is uninstalled and takes its file with it: ours comes.
	if err := os.Remove(left); err != nil {
		t.Fatal(err)
	}
	a.waitReady(t)
	//lint:ignore SA1019 the lookup by network name Multus does for a NetworkAttachmentDefinition without a config
	c, err := libcni.LoadConf(h.conf, "istio-cni")
	if err != nil {
		t.Fatal(err)
	}
	if c.Network.Type != PluginName || c.Network.Name != "istio-cni" {
		t.Errorf("the istio-cni network is %s", c.Bytes)
	}

	// Rolled back: Istio's agent writes its file again, under a name of
	// its own. Ours is taken out; Istio's stays.
	istios := filepath.Join(h.conf, "02-istio-cni.conf")
	if err := os.WriteFile(istios, istio, 0o644); err != nil {
		t.Fatal(err)
	}
	a.waitFor(t, "the second refusal", func() bool {
		_, err := os.Stat(left)
		return errors.As(a.in.Ready(), &fe) && fe.Removed && os.IsNotExist(err)
	})
	a.stop()
	if err := a.in.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if got := mustRead(t, istios); !bytes.Equal(got, istio) {
		t.Errorf("Istio's config changed: %s", got)
	}
}

func TestInvalidFilesSkippedAndUntouched(t *testing.T) {
	h := newHost(t)
	inv, _ := filepath.Glob(filepath.Join(testConfDir, "invalid", "*"))
	want := map[string][]byte{}
	for _, f := range inv {
		_, b := h.put(t, filepath.Join("invalid", filepath.Base(f)), 0o644)
		want[filepath.Base(f)] = b
	}
	cfg := h.config(t)
	a := startAgent(t, cfg)
	a.waitFor(t, "no primary", func() bool { return errors.Is(a.in.Ready(), errNoPrimary) })
	// The primary appears: we are woken by the watch and install.
	p, _ := h.put(t, "10-flannel.conflist", 0o644)
	a.waitReady(t)
	if err := conflist.VerifyInstalled(p, cfg.PluginConf().JSON()); err != nil {
		t.Fatal(err)
	}
	for n, b := range want {
		if got, _ := os.ReadFile(filepath.Join(h.conf, n)); !bytes.Equal(got, b) {
			t.Errorf("invalid file %s was modified", n)
		}
	}
}

func TestNamedConfAndPreemption(t *testing.T) {
	h := newHost(t)
	calico, corig := h.put(t, "10-calico.conflist", 0o644)
	flannel, forig := h.put(t, "10-flannel.conflist", 0o644)
	cfg := h.config(t, "--cni-conf-file-name", "10-flannel.conflist")
	a := startAgent(t, cfg)
	a.waitReady(t)
	ours := cfg.PluginConf().JSON()
	if err := conflist.VerifyInstalled(flannel, ours); err != nil {
		t.Fatalf("named file: %v", err)
	}
	if got, _ := os.ReadFile(calico); !bytes.Equal(got, corig) {
		t.Error("touched an unnamed file")
	}
	a.stop()
	if err := a.in.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(flannel); !bytes.Equal(got, forig) {
		t.Error("named file not restored")
	}

	// Discovery: a new, lexically earlier primary takes over (Cilium
	// replacing Calico); we follow it and clean both on exit.
	h2 := newHost(t)
	calico, corig = h2.put(t, "10-calico.conflist", 0o644)
	cfg2 := h2.config(t)
	a2 := startAgent(t, cfg2)
	a2.waitReady(t)
	cilium, ciorig := h2.put(t, "05-cilium.conflist", 0o644)
	ours2 := cfg2.PluginConf().JSON()
	a2.waitFor(t, "insert into the new primary", func() bool { return conflist.VerifyInstalled(cilium, ours2) == nil })
	a2.stop()
	if err := a2.in.Cleanup(); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string][]byte{calico: corig, cilium: ciorig} {
		if got, _ := os.ReadFile(p); !bytes.Equal(got, want) {
			t.Errorf("%s not restored", p)
		}
	}
}

func TestBinaryReplacedIsReinstalled(t *testing.T) {
	h := newHost(t)
	h.put(t, "10-kindnet.conflist", 0o644)
	cfg := h.config(t)
	a := startAgent(t, cfg)
	a.waitReady(t)
	dst := filepath.Join(h.bin2, PluginName)
	if err := os.WriteFile(dst, []byte("tampered"), 0o755); err != nil {
		t.Fatal(err)
	}
	a.waitFor(t, "binary restored", func() bool {
		b, _ := os.ReadFile(dst)
		src, _ := os.ReadFile(h.plugin)
		return bytes.Equal(b, src) && a.in.Ready() == nil
	})
	_ = os.Remove(filepath.Join(h.bin, PluginName))
	a.waitFor(t, "binary back", func() bool { return sameBytes(filepath.Join(h.bin, PluginName), h.plugin) && a.in.Ready() == nil })
	// Leftover temp files of a crashed copy are cleaned on the next install.
	left := filepath.Join(h.bin, atomicfile.TempPrefix+PluginName+"-123"+atomicfile.TempSuffix)
	_ = os.WriteFile(left, []byte("x"), 0o644)
	_ = os.Remove(filepath.Join(h.bin, PluginName))
	a.waitFor(t, "leftover removed", func() bool { _, err := os.Stat(left); return err != nil && a.in.Ready() == nil })
}

func TestTokenRotationRewritesKubeconfig(t *testing.T) {
	h := newHost(t)
	h.put(t, "10-calico.conflist", 0o644)
	cfg := h.config(t)
	a := startAgent(t, cfg)
	a.waitReady(t)
	token := func() string {
		kc, err := clientcmd.LoadFromFile(cfg.KubeconfigPath())
		if err != nil {
			return ""
		}
		return kc.AuthInfos[PluginName].Token
	}
	for i := 2; i <= 4; i++ {
		// Let the agent settle first: the event of its own last write
		// of the kubeconfig must not be what makes it read the token
		// again (it did, and the test passed without the watch of the
		// service-account dir).
		a.settle(t)
		want := fmt.Sprintf("token-%d", i)
		h.rotateToken(t, want)
		a.waitFor(t, "rotated token "+want, func() bool { return token() == want })
		if m := modeOf(t, cfg.KubeconfigPath()); m != 0o600 {
			t.Fatalf("kubeconfig mode %v after rotation", m)
		}
	}
	// Deleted by someone: rewritten.
	_ = os.Remove(cfg.KubeconfigPath())
	a.waitFor(t, "kubeconfig back", func() bool { return token() == "token-4" })
}

func TestCleanupKeepsForeignChanges(t *testing.T) {
	h := newHost(t)
	p, _ := h.put(t, "10-calico.conflist", 0o644)
	cfg := h.config(t)
	a := startAgent(t, cfg)
	a.waitReady(t)
	a.stop()
	// After our write, an operator adds a plugin and keeps ours.
	b, _ := os.ReadFile(p)
	edited := strings.Replace(string(b), `"type": "bandwidth"`, `"type": "bandwidth", "operator": "edit"`, 1)
	if edited == string(b) {
		t.Fatal("edit did not apply")
	}
	_ = os.WriteFile(p, []byte(edited), 0o644)
	if err := a.in.Cleanup(); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(p)
	if conflist.HasPlugin(p, got) {
		t.Error("our entry survived cleanup")
	}
	if !strings.Contains(string(got), `"operator": "edit"`) {
		t.Errorf("the operator's edit was lost:\n%s", got)
	}
}

// An agent killed without cleanup leaves its state in the run dir; the next
// agent still restores the primary's exact bytes.
func TestRestartKeepsOriginalBytes(t *testing.T) {
	h := newHost(t)
	p, orig := h.put(t, "10-aws.conflist", 0o644)
	cfg := h.config(t)
	a := startAgent(t, cfg)
	a.waitReady(t)
	a.stop() // no Cleanup: a crash

	cfg2 := h.config(t, "--log-level", "debug") // a changed entry forces a rewrite
	b := startAgent(t, cfg2)
	b.waitReady(t)
	if err := conflist.VerifyInstalled(p, cfg2.PluginConf().JSON()); err != nil {
		t.Fatal(err)
	}
	b.stop()
	if err := b.in.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(p); !bytes.Equal(got, orig) {
		t.Errorf("original bytes lost across a restart:\n%s", got)
	}
}

// A read-only bin dir fails the install with an error that names the chart
// values, the dir and the binary being written: the companion, which goes
// first, or the front when the companion is already there.
func TestReadOnlyBinDir(t *testing.T) {
	if !nstest.InPrivateMountNS(t) {
		return
	}
	h := newHost(t)
	h.put(t, "10-calico.conflist", 0o644)
	cfg := h.config(t)
	reconcileInto := func(want string) {
		t.Helper()
		in, err := New(cfg, zerolog.New(io.Discard), nil)
		if err != nil {
			t.Fatal(err)
		}
		// Run prepares the directories before its first reconcile.
		if err := in.prepare(); err != nil {
			t.Fatal(err)
		}
		_, result, err := in.reconcile(context.Background(), partAll)
		var ro *ReadOnlyError
		if !errors.As(err, &ro) || result != metrics.ResultCopyBinaries {
			t.Fatalf("want a ReadOnlyError, got %v (%s)", err, result)
		}
		if !strings.Contains(err.Error(), "cniBinDir") || !strings.Contains(err.Error(), h.bin2) || !strings.Contains(err.Error(), "platform (gke: /home/kubernetes/bin") {
			t.Errorf("error does not name the chart values and dir: %v", err)
		}
		if ro.Binary != want || !strings.Contains(err.Error(), "installing "+want+" into "+h.bin2) {
			t.Errorf("the error names %q, want %s: %v", ro.Binary, want, err)
		}
	}

	if err := unix.Mount("tmpfs", h.bin2, "tmpfs", unix.MS_RDONLY, "size=1m"); err != nil {
		t.Fatalf("mounting a read-only tmpfs: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(h.bin2, unix.MNT_DETACH) })
	reconcileInto(StandaloneName)

	// The companion is there (installed while the dir was writable), the
	// front is not.
	if err := unix.Mount("tmpfs", h.bin2, "tmpfs", unix.MS_REMOUNT, ""); err != nil {
		t.Fatalf("remounting the bin dir read-write: %v", err)
	}
	b, _ := os.ReadFile(h.companion)
	if err := os.WriteFile(filepath.Join(h.bin2, StandaloneName), b, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", h.bin2, "tmpfs", unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
		t.Fatalf("remounting the bin dir read-only: %v", err)
	}
	reconcileInto(PluginName)
}

var testConfDir = cnitest.ConfDir()

// An agent started over the install an earlier one left is not ready
// before its first reconcile (the files on disk are not yet its own
// check), and that reconcile, which writes nothing, still counts a
// successful install and says so.
func TestRestartOverEarlierInstall(t *testing.T) {
	h := newHost(t)
	h.put(t, "10-calico.conflist", 0o644)
	cfg := h.config(t)
	first := startAgent(t, cfg)
	first.waitReady(t)
	first.stop()

	var log lockedBuf
	in, err := New(cfg, zerolog.New(&log), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := in.Ready(); err == nil {
		t.Fatal("ready before its first reconcile")
	}
	ctx, cancel := context.WithCancel(context.Background())
	a := &agent{in: in, cancel: cancel, done: make(chan error, 1)}
	go func() { a.done <- in.Run(ctx) }()
	t.Cleanup(a.stop)
	a.waitReady(t)
	if got := testutil.ToFloat64(in.m.Installs.WithLabelValues(metrics.ResultSuccess)); got != 1 {
		t.Errorf("successful installs counted %v, want 1", got)
	}
	if !log.has(PluginName + " installed and valid") {
		t.Errorf("no %q line in:\n%s", "installed and valid", log.String())
	}
}
