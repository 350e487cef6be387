package capture

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nftmesh/nftmesh/internal/hostns"
	"github.com/nftmesh/nftmesh/iptables"
	"github.com/nftmesh/nftmesh/nft"
	"github.com/nftmesh/nftmesh/redirect"
	"github.com/nftmesh/nftmesh/testkit/scenarios"
)

func open(t *testing.T, path string) *Netns {
	t.Helper()
	n, err := Linux().Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

// TestApplyConcurrent: two Applies of one plan into one fresh netns at
// once, 40 rounds each for REDIRECT and TPROXY, with either backend
// setting: the per-netns lock serializes them, so both succeed and the
// namespace holds exactly the plan.
func TestApplyConcurrent(t *testing.T) {
	ctx := context.Background()
	runDir := t.TempDir()
	for _, sc := range []string{"defaults", "tproxy"} {
		p := scenarios.MustPlan(t, sc)
		for i := range 40 {
			path := freshNetns(t)
			o := Options{Backend: []string{NFTables, Auto}[i%2], RunDir: runDir}
			var wg sync.WaitGroup
			errs := make([]error, 2)
			start := make(chan struct{})
			for j := range errs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					n, err := Linux().Open(path)
					if err != nil {
						errs[j] = err
						return
					}
					defer n.Close()
					<-start
					_, errs[j] = Linux().Apply(ctx, n, p, o)
				}()
			}
			close(start)
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				t.Fatalf("%s round %d: %v", sc, i, err)
			}
			if err := nft.New().Check(ctx, path, p); err != nil {
				t.Fatalf("%s round %d: %v", sc, i, err)
			}
		}
	}
}

// TestLock: a namespace is locked on a file in the run dir's lock
// directory named by its identity: a second holder, by another path to the
// same namespace, waits and gives up when its context ends, and gets the
// lock once the first lets go (the first holder's namespace descriptor may
// go meanwhile).
func TestLock(t *testing.T) {
	dir := t.TempDir()
	n, err := Linux().OpenForReading("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	other, err := Linux().OpenForReading("/proc/thread-self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	ctx := context.Background()
	l1, err := lockNetns(ctx, dir, n, "own")
	if err != nil {
		t.Fatal(err)
	}
	want := filepath.Join(dir, lockSubdir, fmt.Sprintf("netns-%d-%d.lock", n.ID.Dev, n.ID.Ino))
	if st, err := os.Lstat(want); err != nil || !st.Mode().IsRegular() || st.Mode().Perm() != 0o600 {
		t.Fatalf("lock file %s: %v, %v; want a 0600 file", want, st, err)
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := lockNetns(short, dir, other, "own"); !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "another nftmesh run") {
		t.Fatalf("second lock while held: %v", err)
	}
	n.Close()
	got := make(chan *netnsLock)
	go func() {
		l, err := lockNetns(ctx, dir, other, "own")
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	time.Sleep(20 * time.Millisecond)
	select {
	case <-got:
		t.Fatal("the waiter got the lock while it was held")
	default:
	}
	l1.unlock(false)
	l2 := <-got
	if l2 == nil {
		return
	}
	l2.unlock(true)
	if _, err := os.Lstat(want); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("lock file after an unlock that removes it: %v", err)
	}
}

// TestLockStub: a stub namespace (no descriptor) is locked on a file in the
// run dir: a second holder waits, gives up when its context ends, and after
// the first holder removed the file (DEL) locks the new file.
func TestLockStub(t *testing.T) {
	dir := t.TempDir()
	n := hostns.Stub("stub", hostns.ID{Dev: 4, Ino: 77})
	ctx := context.Background()
	l1, err := lockNetns(ctx, dir, n, "stub")
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := lockNetns(short, dir, n, "stub"); !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "another nftmesh run") {
		t.Fatalf("second lock while held: %v", err)
	}
	got := make(chan *netnsLock)
	go func() {
		l, err := lockNetns(ctx, dir, n, "stub")
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	time.Sleep(20 * time.Millisecond)
	l1.unlock(true)
	l2 := <-got
	if l2 == nil {
		return
	}
	defer l2.unlock(false)
	if _, err := os.Stat(l2.path); err != nil {
		t.Fatalf("the waiter holds a lock file that is gone: %v", err)
	}
	short2, cancel2 := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel2()
	if _, err := lockNetns(short2, dir, n, "stub"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("third lock while the waiter holds the new file: %v", err)
	}
}

// TestLockDir: the run dir's lock directory is created when missing
// (parents too, mode 0700), taken as it is when present, and a file in its
// place is an error naming it.
func TestLockDir(t *testing.T) {
	base := t.TempDir()
	run := filepath.Join(base, "a", "b")
	fd, dir, err := lockDir(context.Background(), run)
	if err != nil {
		t.Fatal(err)
	}
	unix.Close(fd)
	if dir != filepath.Join(run, lockSubdir) {
		t.Fatalf("lockDir(%s) = %s, want %s", run, dir, filepath.Join(run, lockSubdir))
	}
	for _, d := range []string{filepath.Join(base, "a"), run, dir} {
		if st, err := os.Lstat(d); err != nil || !st.IsDir() || st.Mode().Perm() != 0o700 {
			t.Fatalf("%s: %v, %v; want a 0700 directory", d, st, err)
		}
	}
	fd, again, err := lockDir(context.Background(), run)
	if err != nil || again != dir {
		t.Fatalf("lockDir on an existing directory = %s, %v", again, err)
	}
	unix.Close(fd)
	file := t.TempDir()
	if err := os.WriteFile(filepath.Join(file, lockSubdir), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := lockDir(context.Background(), file); err == nil || !strings.Contains(err.Error(), lockSubdir) {
		t.Fatalf("lockDir with a file in the way = %v, want an error naming it", err)
	}
}

// TestLockDirRefused: a lock directory, run dir or created parent that
// another user could write, or a symlink in its place, is refused with an
// error naming it and why, and nothing is locked; so is a temp-dir fallback
// (/tmp/nftmesh-<uid>) made ahead of us. Before the fix, each was used.
func TestLockDirRefused(t *testing.T) {
	ctx := context.Background()
	stub := hostns.Stub("stub", hostns.ID{Dev: 4, Ino: 78})
	mkdir := func(t *testing.T, path string, mode os.FileMode) {
		t.Helper()
		if err := os.MkdirAll(path, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(path, mode); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name  string
		root  bool // needs root (chown)
		setup func(t *testing.T, base string) (runDir string)
		bad   string // the path refused, relative to base
		why   string
	}{
		{name: "world-writable lock dir", bad: "run/" + lockSubdir, why: "others can write", setup: func(t *testing.T, base string) string {
			mkdir(t, filepath.Join(base, "run", lockSubdir), 0o777)
			return filepath.Join(base, "run")
		}},
		{name: "group-writable run dir", bad: "run", why: "group or others can write", setup: func(t *testing.T, base string) string {
			mkdir(t, filepath.Join(base, "run"), 0o770)
			return filepath.Join(base, "run")
		}},
		{name: "symlink for the lock dir", bad: "run/" + lockSubdir, why: "is a symlink", setup: func(t *testing.T, base string) string {
			mkdir(t, filepath.Join(base, "elsewhere"), 0o700)
			mkdir(t, filepath.Join(base, "run"), 0o700)
			if err := os.Symlink(filepath.Join(base, "elsewhere"), filepath.Join(base, "run", lockSubdir)); err != nil {
				t.Fatal(err)
			}
			return filepath.Join(base, "run")
		}},
		{name: "symlink for the run dir", bad: "run", why: "is a symlink", setup: func(t *testing.T, base string) string {
			mkdir(t, filepath.Join(base, "elsewhere"), 0o700)
			if err := os.Symlink(filepath.Join(base, "elsewhere"), filepath.Join(base, "run")); err != nil {
				t.Fatal(err)
			}
			return filepath.Join(base, "run")
		}},
		{name: "lock dir of another user", root: true, bad: "run/" + lockSubdir, why: "owned by uid 65534", setup: func(t *testing.T, base string) string {
			mkdir(t, filepath.Join(base, "run", lockSubdir), 0o700)
			if err := os.Chown(filepath.Join(base, "run", lockSubdir), 65534, 65534); err != nil {
				t.Fatal(err)
			}
			return filepath.Join(base, "run")
		}},
		{name: "temp-dir fallback made by another user", root: true, bad: fmt.Sprintf("nftmesh-%d", os.Geteuid()), why: "owned by uid 65534", setup: func(t *testing.T, base string) string {
			// The default run dir cannot be made (a file is in the way):
			// the lock directory falls back to $TMPDIR/nftmesh-<uid>,
			// which another user made first.
			noDefaultRunDir(t, base)
			mkdir(t, filepath.Join(base, fmt.Sprintf("nftmesh-%d", os.Geteuid())), 0o700)
			if err := os.Chown(filepath.Join(base, fmt.Sprintf("nftmesh-%d", os.Geteuid())), 65534, 65534); err != nil {
				t.Fatal(err)
			}
			return ""
		}},
		{name: "world-writable temp-dir fallback", bad: fmt.Sprintf("nftmesh-%d", os.Geteuid()), why: "others can write", setup: func(t *testing.T, base string) string {
			noDefaultRunDir(t, base)
			mkdir(t, filepath.Join(base, fmt.Sprintf("nftmesh-%d", os.Geteuid())), 0o777)
			return ""
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.root && os.Geteuid() != 0 {
				t.Skip("needs root: makes a directory owned by another user")
			}
			base := t.TempDir()
			runDir := tc.setup(t, base)
			l, err := lockNetns(ctx, runDir, stub, "stub")
			if err == nil {
				l.unlock(true)
				t.Fatalf("locked in %s", tc.bad)
			}
			var insecure *insecureDirError
			if !errors.As(err, &insecure) || !strings.Contains(err.Error(), filepath.Join(base, tc.bad)+":") || !strings.Contains(err.Error(), tc.why) {
				t.Fatalf("lock = %v, want a refusal of %s that says it %s", err, filepath.Join(base, tc.bad), tc.why)
			}
		})
	}
	// A usable fallback is made private.
	base := t.TempDir()
	noDefaultRunDir(t, base)
	l, err := lockNetns(ctx, "", stub, "stub")
	if err != nil {
		t.Fatal(err)
	}
	l.unlock(true)
	if st, err := os.Lstat(filepath.Join(base, fmt.Sprintf("nftmesh-%d", os.Geteuid()))); err != nil || st.Mode().Perm() != 0o700 {
		t.Fatalf("temp-dir fallback: %v, %v; want a 0700 directory", st, err)
	}
}

// noDefaultRunDir makes the default run dir impossible to create (a file
// is in its way) and the temp dir base, for the rest of t: the lock
// directory falls back to base/nftmesh-<uid>.
func noDefaultRunDir(t *testing.T, base string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(base, "file"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	d := defaultRunDir
	t.Cleanup(func() { defaultRunDir = d })
	defaultRunDir = filepath.Join(base, "file", "run")
	t.Setenv("TMPDIR", base)
}

func ipnetns(t *testing.T, path, stdin string, args ...string) string {
	t.Helper()
	cmd := exec.Command("nsenter", append([]string{"--net=" + path}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %v\n%s", args, err, out)
	}
	return string(out)
}

func legacySave(t *testing.T, path string) string {
	t.Helper()
	var keep []string
	for _, l := range strings.Split(ipnetns(t, path, "", "iptables-legacy-save")+ipnetns(t, path, "", "ip6tables-legacy-save"), "\n") {
		if !strings.HasPrefix(l, "#") {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n")
}

// TestRemoveEveryBackend: with auto, Remove takes nftmesh's rules out of
// both backends when both hold them (and the routes and ::6), says what it
// removed from which, leaves foreign rules (another installer's ISTIO_*
// chains, other tables) alone, and then finds nothing to remove.
func TestRemoveEveryBackend(t *testing.T) {
	if iptables.LegacyAvailable() != nil && os.Geteuid() == 0 {
		t.Skip("kernel without legacy x_tables")
	}
	ctx := context.Background()
	path := freshNetns(t)
	p := scenarios.MustPlan(t, "tproxy")
	if err := nft.New().Apply(ctx, path, p); err != nil {
		t.Fatal(err)
	}
	if err := iptables.New().Apply(ctx, path, p); err != nil {
		t.Fatal(err)
	}
	ipnetns(t, path, "", "iptables-legacy", "-t", "nat", "-N", "ISTIO_FOREIGN")
	ipnetns(t, path, "", "iptables-legacy", "-t", "nat", "-A", "ISTIO_FOREIGN", "-p", "tcp", "--dport", "7", "-j", "RETURN")
	ipnetns(t, path, "table ip other {\n chain c {\n  type filter hook input priority 0; policy accept;\n }\n}\n", "nft", "-f", "-")

	n := open(t, path)
	o := Options{RunDir: t.TempDir()}
	rem, err := Linux().Remove(ctx, n, o)
	if err != nil {
		t.Fatal(err)
	}
	got := rem.String()
	for _, want := range []string{"nftables: table inet nftmesh (", "iptables-legacy: ", "routes: ip rule fwmark 1337 lookup 133 (ipv4)", "::6 on lo"} {
		if !strings.Contains(got, want) {
			t.Errorf("Removal %q does not say %q", got, want)
		}
	}
	for _, b := range []redirect.Backend{nft.New(), iptables.New()} {
		if left, err := b.List(ctx, path); err != nil || !left.Empty() {
			t.Errorf("%s still holds rules of ours after Remove (%v):\n%s", b.Name(), err, strings.Join(redirect.Describe(left), "\n"))
		}
	}
	saved := legacySave(t, path)
	if !strings.Contains(saved, ":ISTIO_FOREIGN") || !strings.Contains(saved, "-A ISTIO_FOREIGN -p tcp -m tcp --dport 7 -j RETURN") {
		t.Errorf("the foreign ISTIO_FOREIGN chain was removed:\n%s", saved)
	}
	if !strings.Contains(ipnetns(t, path, "", "nft", "list", "tables"), "table ip other") {
		t.Errorf("the foreign nftables table was removed")
	}
	again, err := Linux().Remove(ctx, n, o)
	if err != nil || len(again) != 0 || again.String() != "nothing to remove" {
		t.Errorf("second Remove = %q, %v; want nothing to remove", again, err)
	}
	if after := legacySave(t, path); after != saved {
		t.Errorf("a Remove with nothing to remove changed the tables")
	}
}

// TestRemoveNamedBackend: an explicit backend removes only its own rules.
func TestRemoveNamedBackend(t *testing.T) {
	if iptables.LegacyAvailable() != nil && os.Geteuid() == 0 {
		t.Skip("kernel without legacy x_tables")
	}
	ctx := context.Background()
	path := freshNetns(t)
	p := scenarios.MustPlan(t, "ipv4-only")
	if err := nft.New().Apply(ctx, path, p); err != nil {
		t.Fatal(err)
	}
	if err := iptables.New().Apply(ctx, path, p); err != nil {
		t.Fatal(err)
	}
	rem, err := Linux().Remove(ctx, open(t, path), Options{Backend: Legacy, RunDir: t.TempDir()})
	if err != nil || len(rem) != 1 || rem[0].Backend != Legacy {
		t.Fatalf("Linux().Remove(iptables-legacy) = %v, %v", rem, err)
	}
	if err := nft.New().Check(ctx, path, p); err != nil {
		t.Errorf("the nftables rules were touched: %v", err)
	}
}

// TestFailedApplyKeepsEarlierRules: an Apply that fails after an earlier
// run installed the pod's rules must not remove them (it did not create
// them); into a namespace without rules of ours, a failure leaves nothing.
func TestFailedApplyKeepsEarlierRules(t *testing.T) {
	ctx := context.Background()
	path := freshNetns(t)
	n := open(t, path)
	o := Options{Backend: NFTables, RunDir: t.TempDir()}
	good := scenarios.MustPlan(t, "ipv4-only")
	// A chain without a hook in a table the backend does not know fails
	// while encoding, before anything is sent.
	bad := good
	bad.Tables = append([]redirect.Table{{Name: "nosuchtable", Chains: []redirect.Chain{{Name: "x"}}}}, good.Tables...)
	if _, err := Linux().Apply(ctx, n, bad, o); err == nil {
		t.Fatal("Apply of a broken plan succeeded")
	}
	if left, err := nft.New().List(ctx, path); err != nil || !left.Empty() {
		t.Fatalf("a failed first Apply left rules (%v)", err)
	}
	if _, err := Linux().Apply(ctx, n, good, o); err != nil {
		t.Fatal(err)
	}
	if _, err := Linux().Apply(ctx, n, bad, o); err == nil {
		t.Fatal("Apply of a broken plan succeeded")
	}
	if err := nft.New().Check(ctx, path, good); err != nil {
		t.Fatalf("a failed Apply removed the rules an earlier run installed: %v", err)
	}
}

// TestOpenRefusals: what every front end gets for a path that is not a
// pod's network namespace: an error naming the path, at once.
func TestOpenRefusals(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := exec.Command("mkfifo", fifo).Run(); err != nil {
		t.Skip("mkfifo:", err)
	}
	for _, p := range []string{fifo, dir, "/dev/null"} {
		_, err := Linux().Open(p)
		var ne *NotNetnsError
		if !errors.As(err, &ne) || !strings.Contains(err.Error(), p) {
			t.Errorf("Linux().Open(%s) = %v", p, err)
		}
	}
	if os.Geteuid() == 0 {
		if _, err := Linux().Open("/proc/self/ns/net"); !errors.Is(err, ErrHostNetns) {
			t.Errorf("Linux().Open(own netns) = %v, want ErrHostNetns", err)
		}
	}
}
