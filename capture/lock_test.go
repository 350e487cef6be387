package capture

import (
	"bufio"
	"context"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/nftmesh/nftmesh/nft"
	"github.com/nftmesh/nftmesh/redirect"
	"github.com/nftmesh/nftmesh/testkit/scenarios"
)

// holdAsNobody starts `flock -x path` as uid/gid 65534 without groups,
// holding the lock until the test ends (the process group it leads is
// killed by its PID), and returns once the lock is held. It reports
// whether flock could open path at all.
func holdAsNobody(t *testing.T, path string) bool {
	t.Helper()
	cmd := exec.Command("flock", "-x", path, "sh", "-c", "echo locked; exec sleep 600")
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Credential: &syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{}},
		Setpgid:    true,
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	t.Cleanup(func() {
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		_ = cmd.Wait()
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	return err == nil && line == "locked\n"
}

// TestLockNotHeldByOthers: a process of another user (nobody) holding an
// exclusive flock on the namespace file, which everyone can open, does not
// block Apply, Check or Remove (the ADD, CHECK and DEL of the plugin, the
// agent's repair, `redirect apply/clean`), and cannot open the lock file
// the pipeline takes instead. Before the fix every verb waited on the
// holder until its context ended.
func TestLockNotHeldByOthers(t *testing.T) {
	path := freshNetns(t)
	if !holdAsNobody(t, path) {
		t.Fatalf("nobody could not flock %s", path)
	}
	runDir := t.TempDir()
	o := Options{RunDir: runDir}
	p := scenarios.MustPlan(t, "defaults")
	n := open(t, path)
	verb := func(name string, f func(ctx context.Context) error) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		if err := f(ctx); err != nil {
			t.Fatalf("%s while nobody holds a flock on %s: %v", name, path, err)
		}
	}
	verb("Apply", func(ctx context.Context) error { _, err := Linux().Apply(ctx, n, p, o); return err })
	verb("Check", func(ctx context.Context) error { _, err := Linux().Check(ctx, n, p, o); return err })
	// Our own lock file is out of nobody's reach.
	locks, _ := filepath.Glob(filepath.Join(runDir, lockSubdir, "*.lock"))
	if len(locks) != 1 {
		t.Fatalf("lock files after Apply: %v, want one", locks)
	}
	if holdAsNobody(t, locks[0]) {
		t.Fatalf("nobody holds the lock file %s", locks[0])
	}
	verb("Remove", func(ctx context.Context) error {
		r, err := Linux().Remove(ctx, n, o)
		if err == nil && len(r) == 0 {
			t.Errorf("Remove after Apply removed nothing")
		}
		return err
	})
	if err := nft.New().Check(context.Background(), path, redirect.Plan{}); err != nil {
		t.Fatalf("after Remove: %v", err)
	}
	if locks, _ := filepath.Glob(filepath.Join(runDir, lockSubdir, "*.lock")); len(locks) != 0 {
		t.Errorf("lock files after Remove: %v, want none", locks)
	}
}
