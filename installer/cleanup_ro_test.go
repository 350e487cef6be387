package installer

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/nftmesh/nftmesh/testkit/nstest"
)

// At SIGTERM the conf dir is read-only (a read-only hostPath, a remounted
// /etc): our entry cannot leave the config, so the plugin binary and its
// kubeconfig must stay, or every new pod on the node fails; the error says
// why. Once the dir is writable again, cleanup completes.
func TestCleanupReadOnlyConfDirKeepsPlugin(t *testing.T) {
	if !nstest.InPrivateMountNS(t) {
		return
	}
	h := newHost(t)
	if err := unix.Mount("tmpfs", h.conf, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatalf("mounting a tmpfs on the conf dir: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(h.conf, unix.MNT_DETACH) })
	p, orig := h.put(t, "10-calico.conflist", 0o644)
	cfg := h.config(t)
	a := startAgent(t, cfg)
	a.waitReady(t)
	a.stop()
	installed, _ := os.ReadFile(p)

	if err := unix.Mount("tmpfs", h.conf, "tmpfs", unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
		t.Fatalf("remounting the conf dir read-only: %v", err)
	}
	err := a.in.Cleanup()
	if err == nil {
		t.Fatal("cleanup reported success with our entry still in the read-only config")
	}
	for _, want := range []string{"keeping", p, "read-only file system"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error does not say %q: %v", want, err)
		}
	}
	if got, _ := os.ReadFile(p); !bytes.Equal(got, installed) {
		t.Fatalf("the read-only config changed:\n%s", got)
	}
	h.assertInstalled(t, cfg)
	if _, err := os.Stat(filepath.Join(h.conf, UndoDirName, UndoFileName)); err != nil {
		t.Errorf("the undo record for a later restore is gone: %v", err)
	}

	// Writable again (the next agent start, or a retry): all goes.
	if err := unix.Mount("tmpfs", h.conf, "tmpfs", unix.MS_REMOUNT, ""); err != nil {
		t.Fatalf("remounting the conf dir read-write: %v", err)
	}
	if err := a.in.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(p); !bytes.Equal(got, orig) {
		t.Errorf("not restored:\n%s", got)
	}
	h.assertBinariesGone(t)
	assertGone(t, cfg.KubeconfigPath())
}
