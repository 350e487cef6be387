package capture

import (
	"context"
	"errors"
	"github.com/nftmesh/nftmesh/internal/hostns"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nftmesh/nftmesh/iptables"
	"github.com/nftmesh/nftmesh/nft"
	"github.com/nftmesh/nftmesh/redirect"
	"github.com/nftmesh/nftmesh/testkit/scenarios"
)

func open(t *testing.T, path string) *Netns {
	t.Helper()
	n, err := Open(path)
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
					n, err := Open(path)
					if err != nil {
						errs[j] = err
						return
					}
					defer n.Close()
					<-start
					_, errs[j] = Apply(ctx, n, p, o)
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

// TestLock: a namespace is locked on its own inode: a second holder, by
// another path to the same namespace, waits and gives up when its context
// ends, gets the lock once the first lets go, and no file is written
// anywhere for it.
func TestLock(t *testing.T) {
	dir := t.TempDir()
	n, err := OpenForReading("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	other, err := OpenForReading("/proc/thread-self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	ctx := context.Background()
	l1, err := lockNetns(ctx, dir, n, "own")
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := lockNetns(short, dir, other, "own"); !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "another nftmesh run") {
		t.Fatalf("second lock while held: %v", err)
	}
	// The holder's own descriptor may go: the lock has its own.
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
	defer l2.unlock(false)
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("locking a namespace wrote %v in the run dir", entries)
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
	run := filepath.Join(t.TempDir(), "a", "b")
	dir, err := lockDir(run)
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(dir)
	if err != nil || !st.IsDir() || st.Mode().Perm() != 0o700 || dir != filepath.Join(run, lockSubdir) {
		t.Fatalf("lockDir(%s) = %s (%v, %v), want a 0700 directory %s", run, dir, st, err, filepath.Join(run, lockSubdir))
	}
	if again, err := lockDir(run); err != nil || again != dir {
		t.Fatalf("lockDir on an existing directory = %s, %v", again, err)
	}
	file := t.TempDir()
	if err := os.WriteFile(filepath.Join(file, lockSubdir), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := lockDir(file); err == nil || !strings.Contains(err.Error(), lockSubdir) {
		t.Fatalf("lockDir with a file in the way = %v, want an error naming it", err)
	}
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
	rem, err := Remove(ctx, n, o)
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
	again, err := Remove(ctx, n, o)
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
	rem, err := Remove(ctx, open(t, path), Options{Backend: Legacy, RunDir: t.TempDir()})
	if err != nil || len(rem) != 1 || rem[0].Backend != Legacy {
		t.Fatalf("Remove(iptables-legacy) = %v, %v", rem, err)
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
	if _, err := Apply(ctx, n, bad, o); err == nil {
		t.Fatal("Apply of a broken plan succeeded")
	}
	if left, err := nft.New().List(ctx, path); err != nil || !left.Empty() {
		t.Fatalf("a failed first Apply left rules (%v)", err)
	}
	if _, err := Apply(ctx, n, good, o); err != nil {
		t.Fatal(err)
	}
	if _, err := Apply(ctx, n, bad, o); err == nil {
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
		_, err := Open(p)
		var ne *NotNetnsError
		if !errors.As(err, &ne) || !strings.Contains(err.Error(), p) {
			t.Errorf("Open(%s) = %v", p, err)
		}
	}
	if os.Geteuid() == 0 {
		if _, err := Open("/proc/self/ns/net"); !errors.Is(err, ErrHostNetns) {
			t.Errorf("Open(own netns) = %v, want ErrHostNetns", err)
		}
	}
}
