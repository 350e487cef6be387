package capture_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nftmesh/nftmesh/capture"
	"github.com/nftmesh/nftmesh/redirect"
	"github.com/nftmesh/nftmesh/testkit/capturetest"
	"github.com/nftmesh/nftmesh/testkit/nstest"
	"github.com/nftmesh/nftmesh/testkit/scenarios"
)

const otherNS = "/run/netns/other"

// freeInodes removes n of fillInodes' files.
func freeInodes(t *testing.T, dir string, n int) {
	t.Helper()
	for i := range n {
		if err := os.Remove(filepath.Join(dir, fmt.Sprintf("filler-%d", i))); err != nil {
			t.Fatal(err)
		}
	}
}

// TestRemovalFallbackExcludes: a removal on a run dir out of inodes, for a
// namespace with capture but no lock file (captured through another run
// dir), holds the fallback lock while it removes; when room comes back
// meanwhile, an Apply on the same namespace, which must make the lock file
// (or the lock directory), waits until the removal is over, and then
// writes: DEL then ADD, never the two at once, nothing half removed. A
// verb whose lock file exists (another namespace) does not wait. Where
// the run dir had no lock directory yet, the run dir is what is locked.
func TestRemovalFallbackExcludes(t *testing.T) {
	if !nstest.InPrivateMountNS(t) {
		return
	}
	ctx := context.Background()
	p := scenarios.MustPlan(t, "defaults")
	for _, tc := range []struct {
		name    string
		lockDir bool // the node ran verbs before: a lock directory and a file of another namespace
	}{
		{"lock directory", true},
		{"no lock directory", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, pl, o := fake(t)
			f.AddNetns(otherNS, podV4)
			o.RunDir = mountTmpfs(t, "size=1m,nr_inodes=32,mode=0700")
			locked := o.RunDir
			if tc.lockDir {
				if _, err := pl.Apply(ctx, open(t, pl, otherNS), p, o); err != nil {
					t.Fatal(err)
				}
				locked = filepath.Join(o.RunDir, "netns-locks")
			}
			f.Install(podNS, capture.NFTables, p)
			fillInodes(t, o.RunDir)

			entered, release := f.Block(capturetest.OpRemove, "")
			defer release()
			removed := make(chan error, 1)
			go func() {
				_, err := pl.Remove(ctx, open(t, pl, podNS), o)
				removed <- err
			}()
			select {
			case <-entered:
			case err := <-removed:
				t.Fatalf("Remove on a full run dir ended before removing: %v", err)
			}
			freeInodes(t, o.RunDir, 2) // a lock directory and a file
			short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
			defer cancel()
			if _, err := pl.Apply(short, open(t, pl, podNS), p, o); err == nil || !strings.Contains(err.Error(), "waiting for the lock of directory "+locked+" ") {
				t.Fatalf("Apply during the removal = %v, want it to wait for the lock of %s", err, locked)
			}
			if tc.lockDir {
				short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
				defer cancel()
				if _, err := pl.Check(short, open(t, pl, otherNS), p, o); err != nil {
					t.Errorf("Check of a namespace whose lock file exists, during the removal: %v", err)
				}
			}
			applied := make(chan error, 1)
			go func() {
				_, err := pl.Apply(ctx, open(t, pl, podNS), p, o)
				applied <- err
			}()
			time.Sleep(50 * time.Millisecond)
			select {
			case err := <-applied:
				t.Fatalf("Apply ran during the removal: %v", err)
			default:
			}
			release()
			if err := <-removed; err != nil {
				t.Fatalf("Remove: %v", err)
			}
			if err := <-applied; err != nil {
				t.Fatalf("Apply after the removal: %v", err)
			}
			calls := f.Calls()
			if r, a := slices.Index(calls, capturetest.OpRemove+" "+capture.NFTables+" "+podNS), slices.Index(calls, capturetest.OpApply+" "+capture.NFTables+" "+podNS); r < 0 || a < r {
				t.Errorf("calls %v: want the removal before the Apply", calls)
			}
			if got := f.Backends(podNS); !slices.Equal(got, []string{capture.NFTables}) {
				t.Errorf("after DEL then ADD, capture in %v, want nftables:\n%s", got, f.Dump(podNS))
			}
		})
	}
}

// TestRemovalFallbackNotWedged: on a run dir out of inodes without a lock
// directory, the fallback locks the run dir, which others can open (mode
// 0755): a process of another user (nobody) holding a flock on it delays
// the removal by capture's bound (WedgeWait) twice, no more (trying to
// make the lock directory, then the fallback lock), and the removal
// completes.
func TestRemovalFallbackNotWedged(t *testing.T) {
	if !nstest.InPrivateMountNS(t) {
		return
	}
	f, pl, o := fake(t)
	o.RunDir = mountTmpfs(t, "size=1m,nr_inodes=16,mode=0755")
	// nobody must reach the run dir: the test's temp dirs are root's.
	for d := filepath.Dir(o.RunDir); d != os.TempDir(); d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if !capture.HoldAsNobody(t, o.RunDir) {
		t.Fatalf("nobody could not flock %s", o.RunDir)
	}
	f.Install(podNS, capture.NFTables, scenarios.MustPlan(t, "defaults"))
	fillInodes(t, o.RunDir)
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := pl.Remove(ctx, open(t, pl, podNS), o)
	took := time.Since(start)
	if err != nil || len(r) == 0 {
		t.Fatalf("Remove while nobody holds a flock on the run dir = %v, %v after %v", r, err, took)
	}
	if d := f.Dump(podNS); d != "" {
		t.Fatalf("left:\n%s", d)
	}
	if took < capture.WedgeWait || took > 2*capture.WedgeWait+time.Second {
		t.Errorf("Remove took %v, want at most twice %v (the bound on a flock others can hold)", took, capture.WedgeWait)
	}
	t.Logf("Remove took %v while nobody held a flock on the run dir", took.Round(time.Millisecond))
}

// TestRemoveNothingWritesNothing: Remove of a namespace with nothing of
// ours (a pod never captured, a repeated DEL) looks without the lock and
// creates nothing in the run dir, not even the lock directory; with rules
// of ours (routes alone included) it locks and removes them. Before, every
// Remove made the lock directory and file first.
func TestRemoveNothingWritesNothing(t *testing.T) {
	ctx := context.Background()
	p := scenarios.MustPlan(t, "tproxy")
	for _, tc := range []struct {
		name    string
		install redirect.Plan
	}{
		{name: "nothing"},
		{"rules", p},
		{"routes alone", redirect.Plan{Routes: p.Routes, LoopbackAddrs: p.LoopbackAddrs}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, pl, o := fake(t)
			some := len(tc.install.Routes) > 0
			if some {
				f.Install(podNS, capture.NFTables, tc.install)
			}
			r, err := pl.Remove(ctx, open(t, pl, podNS), o)
			if err != nil || (len(r) > 0) != some {
				t.Fatalf("Remove = %v, %v", r, err)
			}
			if d := f.Dump(podNS); d != "" {
				t.Fatalf("left:\n%s", d)
			}
			entries, err := os.ReadDir(o.RunDir)
			if err != nil {
				t.Fatal(err)
			}
			if (len(entries) > 0) != some {
				t.Errorf("run dir after Remove: %v", entries)
			}
			// Again, as containerd's second DEL: nothing written.
			if r, err := pl.Remove(ctx, open(t, pl, podNS), o); err != nil || len(r) != 0 {
				t.Fatalf("second Remove = %v, %v", r, err)
			}
			if locks, _ := filepath.Glob(filepath.Join(o.RunDir, "netns-locks", "*")); len(locks) != 0 {
				t.Errorf("lock files after the second Remove: %v", locks)
			}
		})
	}
}
