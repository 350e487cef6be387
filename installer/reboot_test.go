package installer

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/rs/zerolog"
)

// userConf is a primary config as its owner left it in the conf dir: what
// uninstall must give back, under its name, with its bytes, mode, owner
// and link.
type userConf struct {
	name     string
	data     []byte
	mode     fs.FileMode
	uid, gid int    // -1: not checked (the test cannot choose an owner without root)
	link     string // the symlink the name was, or ""
}

// rebootKinds are the primaries a rewrite treats differently: a
// single-plugin .conf (converted to a .conflist), the same as a symlink
// into another dir, and a .conflist (rewritten in place).
var rebootKinds = []string{"conf", "linked-conf", "conflist"}

// putUserConf lays out a primary of kind, owned by 1234:2345 when the test
// is root, and returns what uninstall must give back.
func (h *host) putUserConf(t *testing.T, kind string) userConf {
	t.Helper()
	var u userConf
	switch kind {
	case "conf":
		p, b := h.put(t, "10-bridge.conf", 0o600)
		u = userConf{name: filepath.Base(p), data: b, mode: 0o600}
	case "linked-conf":
		b, err := os.ReadFile(filepath.Join(testConfDir, "10-bridge.conf"))
		if err != nil {
			t.Fatal(err)
		}
		target := filepath.Join(h.root, "shared", "bridge.conf")
		if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(target, b, 0o640); err != nil {
			t.Fatal(err)
		}
		u = userConf{name: "10-bridge.conf", data: b, mode: 0o640, link: "../../../shared/bridge.conf"}
		if err := os.Symlink(u.link, filepath.Join(h.conf, u.name)); err != nil {
			t.Fatal(err)
		}
	case "conflist":
		p, b := h.put(t, "10-calico.conflist", 0o640)
		u = userConf{name: filepath.Base(p), data: b, mode: 0o640}
	default:
		t.Fatalf("no primary of kind %q", kind)
	}
	u.uid, u.gid = -1, -1
	if os.Geteuid() == 0 {
		u.uid, u.gid = 1234, 2345
		if err := os.Chown(filepath.Join(h.conf, u.name), u.uid, u.gid); err != nil {
			t.Fatal(err)
		}
	}
	return u
}

// assertGivenBack checks that the conf dir holds the user's file and
// nothing else (no .conflist twin, no undo record, no temp file), as it was.
func (h *host) assertGivenBack(t *testing.T, u userConf) {
	t.Helper()
	assertOnly(t, h.conf, u.name)
	p := filepath.Join(h.conf, u.name)
	if u.link != "" {
		if got, err := os.Readlink(p); err != nil || got != u.link {
			t.Errorf("%s is not the link to %s it was: %q (%v)", p, u.link, got, err)
		}
	} else if fi, err := os.Lstat(p); err != nil || !fi.Mode().IsRegular() {
		t.Errorf("%s is not the regular file it was (%v)", p, err)
	}
	got, err := os.ReadFile(p)
	if err != nil || !bytes.Equal(got, u.data) {
		t.Errorf("%s is not given back byte for byte (%v):\n%s", p, err, got)
	}
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != u.mode {
		t.Errorf("%s mode %v, want %v", p, fi.Mode().Perm(), u.mode)
	}
	st := fi.Sys().(*syscall.Stat_t)
	if u.uid >= 0 && (int(st.Uid) != u.uid || int(st.Gid) != u.gid) {
		t.Errorf("%s owned by %d:%d, want %d:%d", p, st.Uid, st.Gid, u.uid, u.gid)
	}
}

// reboot empties the run dir, as a reboot empties its tmpfs (/var/run).
func (h *host) reboot(t *testing.T) {
	t.Helper()
	if err := os.RemoveAll(h.run); err != nil {
		t.Fatal(err)
	}
}

// uninstallAfterReboot is the agent the node starts after the reboot (run
// until ready, as its pod does, unless runFirst is false: a SIGTERM before
// its first reconcile), then helm uninstall's SIGTERM: Cleanup.
func uninstallAfterReboot(t *testing.T, cfg *Config, runFirst bool) {
	t.Helper()
	var in *Installer
	if runFirst {
		a := startAgent(t, cfg)
		a.waitReady(t)
		a.stop()
		in = a.in
	} else {
		var err error
		if in, err = New(cfg, zerolog.New(zerolog.NewTestWriter(t)), nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := in.Cleanup(); err != nil {
		t.Fatalf("cleanup after the reboot: %v", err)
	}
}

// A node reboots after the agent chained itself into the primary's config
// (issue 29 item 3): the run dir comes back empty, the agent starts again,
// and helm uninstall gives back the user's file byte for byte under its
// own name, mode, owner and link. Before the undo record, the state was in
// the run dir only, and a .conf came back as a reformatted .conflist.
func TestRebootThenUninstallGivesBackPrimary(t *testing.T) {
	for _, kind := range rebootKinds {
		for _, runFirst := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/run-first=%v", kind, runFirst), func(t *testing.T) {
				h := newHost(t)
				u := h.putUserConf(t, kind)
				cfg := h.config(t)
				a := startAgent(t, cfg)
				a.waitReady(t)
				a.stop() // no cleanup: the node went down
				h.reboot(t)
				uninstallAfterReboot(t, cfg, runFirst)
				h.assertGivenBack(t, u)
				h.assertBinariesGone(t)
			})
		}
	}
}

// crashEnv carries a child process's part of TestKilledAtEveryStepThenReboot:
// phase:k:host root.
const crashEnv = "NFTMESH_TEST_CRASH"

// crashPoints is how many points between two changes that reach the disk
// each phase has: install writes the record, the list, and removes a
// converted .conf; cleanup puts the .conf back (a link is made before the
// first point), removes the list, then the record.
var crashPoints = map[string]map[string]int{
	"conf":        {"install": 3, "cleanup": 3},
	"linked-conf": {"install": 3, "cleanup": 2},
	"conflist":    {"install": 2, "cleanup": 2},
}

// The agent is killed (SIGKILL, no deferred code runs) at every point
// between two changes it makes on disk, during the install and during the
// cleanup; then the node reboots (run dir emptied), the agent starts again
// and is uninstalled: every time, the user's file comes back exactly.
func TestKilledAtEveryStepThenReboot(t *testing.T) {
	if spec := os.Getenv(crashEnv); spec != "" {
		crashChild(t, spec)
		return
	}
	for _, kind := range rebootKinds {
		for _, phase := range []string{"install", "cleanup"} {
			t.Run(kind+"/"+phase, func(t *testing.T) {
				points := 0
				for k := 1; k <= 10; k++ {
					done := false
					t.Run(fmt.Sprintf("killed-at-%d", k), func(t *testing.T) {
						h := newHost(t)
						u := h.putUserConf(t, kind)
						cfg := h.config(t)
						if phase == "cleanup" {
							a := startAgent(t, cfg)
							a.waitReady(t)
							a.stop()
						}
						if !runKilledAt(t, phase, k, h.root) {
							done = true // finished before a k-th point
							return
						}
						points++
						h.reboot(t)
						uninstallAfterReboot(t, cfg, true)
						h.assertGivenBack(t, u)
					})
					if done || t.Failed() {
						break
					}
				}
				if want := crashPoints[kind][phase]; points != want && !t.Failed() {
					t.Errorf("%d points between changes on disk, want %d", points, want)
				}
			})
		}
	}
}

// runKilledAt runs phase in a child process that kills itself at its k-th
// point between two changes on disk; killed is false when it finished
// first.
func runKilledAt(t *testing.T, phase string, k int, root string) (killed bool) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestKilledAtEveryStepThenReboot$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s:%d:%s", crashEnv, phase, k, root))
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL {
			return true
		}
	}
	if err != nil || !bytes.Contains(out, []byte("--- PASS: TestKilledAtEveryStepThenReboot")) {
		t.Fatalf("the %s child failed: %v\n%s", phase, err, out)
	}
	return false
}

// crashChild is the child's part: the agent over the parent's host,
// installing (phase install) or starting over an install and cleaning up
// (phase cleanup), killed at the k-th point.
func crashChild(t *testing.T, spec string) {
	parts := strings.SplitN(spec, ":", 3)
	k, err := strconv.Atoi(parts[1])
	if len(parts) != 3 || err != nil {
		t.Fatalf("bad %s %q", crashEnv, spec)
	}
	h := hostAt(parts[2])
	cfg := h.config(t)
	var n atomic.Int32
	setBeforeSwap(t, func(string) {
		if int(n.Add(1)) == k {
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		}
	})
	a := startAgent(t, cfg)
	a.waitReady(t)
	a.stop()
	if parts[0] == "cleanup" {
		if err := a.in.Cleanup(); err != nil {
			t.Fatal(err)
		}
	}
}
