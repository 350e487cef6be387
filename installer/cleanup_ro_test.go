package installer

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

const mountNSEnv = "NFTMESH_TEST_IN_MOUNT_NS"

// inPrivateMountNS runs the calling test again in a child process with a
// mount namespace of its own, so its mounts never reach the machine's; it
// returns true in the child (which runs the test body) and false in the
// parent, which has checked the child's result.
func inPrivateMountNS(t *testing.T) bool {
	t.Helper()
	if os.Getenv(mountNSEnv) == t.Name() {
		if err := unix.Mount("", "/", "", unix.MS_PRIVATE|unix.MS_REC, ""); err != nil {
			t.Fatalf("making the test's mounts private: %v", err)
		}
		return true
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root for a mount namespace")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^"+regexp.QuoteMeta(t.Name())+"$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), mountNSEnv+"="+t.Name())
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS}
	out, err := cmd.CombinedOutput()
	t.Logf("in a private mount namespace:\n%s", out)
	if err != nil {
		t.Fatalf("the test failed in its mount namespace: %v", err)
	}
	if !bytes.Contains(out, []byte("--- PASS: "+t.Name())) {
		t.Fatal("the test did not pass in its mount namespace")
	}
	return false
}

// At SIGTERM the conf dir is read-only (a read-only hostPath, a remounted
// /etc): our entry cannot leave the config, so the plugin binary and its
// kubeconfig must stay, or every new pod on the node fails; the error says
// why. Once the dir is writable again, cleanup completes.
func TestCleanupReadOnlyConfDirKeepsPlugin(t *testing.T) {
	if !inPrivateMountNS(t) {
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
