package capture

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

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

// Exported for the external tests of the fallback lock.
var (
	HoldAsNobody = holdAsNobody
	WedgeWait    = wedgeWait
)

// TestLockInstead: the removal's fallback lock is an exclusive flock on
// the deepest directory on the lock file's path that exists: a second
// fallback waits for it, and so does a verb making an entry there
// (createIn's shared flock). A removal that waited for such a verb finds
// its entry and goes back to the file's own lock (nil, no error), and so
// does one that finds the file.
func TestLockInstead(t *testing.T) {
	ctx := context.Background()
	run := filepath.Join(t.TempDir(), "run")
	file := filepath.Join(run, lockSubdir, "netns-4-99.lock")
	mk := func(path string) error {
		if path == file {
			return os.WriteFile(file, nil, 0o600)
		}
		return os.Mkdir(path, 0o700)
	}
	// Each step leaves the next entry made, for the next step.
	for _, tc := range []struct{ name, locked, next string }{
		{"no run dir", filepath.Dir(run), run},
		{"no lock directory", run, filepath.Join(run, lockSubdir)},
		{"no lock file", filepath.Join(run, lockSubdir), file},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lk, err := lockInstead(ctx, file)
			if err != nil || lk == nil || lk.path != tc.locked || lk.fd < 0 {
				t.Fatalf("lockInstead = %+v, %v; want a flock held on %s", lk, err, tc.locked)
			}
			short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
			defer cancel()
			if l2, err := lockInstead(short, file); !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "waiting for the lock of directory "+tc.locked) {
				t.Fatalf("second fallback while the first holds = %+v, %v", l2, err)
			}
			dfd, err := unix.Open(tc.locked, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer unix.Close(dfd)
			if err := createIn(short, dfd, tc.locked, func() error { return mk(tc.next) }); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("making %s during the fallback = %v, want a wait", tc.next, err)
			}
			lk.unlock(true)
			// A verb making the entry holds a shared flock: the removal
			// waits, then finds the entry.
			sh, err := flockDir(ctx, dfd, tc.locked, unix.LOCK_SH)
			if err != nil || sh < 0 {
				t.Fatalf("shared flock on %s: %d, %v", tc.locked, sh, err)
			}
			got := make(chan error, 1)
			go func() {
				l, err := lockInstead(ctx, file)
				if l != nil {
					l.unlock(false)
					err = fmt.Errorf("took the fallback lock on %s though %s was made meanwhile", l.path, tc.next)
				}
				got <- err
			}()
			time.Sleep(30 * time.Millisecond)
			select {
			case err := <-got:
				t.Fatalf("the removal did not wait for the verb making %s: %v", tc.next, err)
			default:
			}
			if err := mk(tc.next); err != nil {
				t.Fatal(err)
			}
			unflock(sh)
			if err := <-got; err != nil {
				t.Fatal(err)
			}
		})
	}
	if lk, err := lockInstead(ctx, file); lk != nil || err != nil {
		t.Fatalf("lockInstead with the file there = %+v, %v; want nil (the file's own lock)", lk, err)
	}
}
