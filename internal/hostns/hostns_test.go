package hostns

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nftmesh/nftmesh/testkit/notnetns"
)

// refuse is g's Refuse for a path, opened just for the check; any error
// opening it is returned too.
func refuse(g Guard, path string) error {
	n, err := g.Open(path)
	if err != nil {
		return err
	}
	return n.Close()
}

// TestGuardsDiffer: two guards in one process, one allowing its own
// namespace and one not, each refuses as configured, whichever was made
// or used last, and at once from many goroutines. With the allowance a
// package-level setting (before Guard), allowing it for one caller allowed
// it for every other in the process.
func TestGuardsDiffer(t *testing.T) {
	if selfErr != nil {
		t.Skipf("this process's namespace cannot be read: %v", selfErr)
	}
	// PID 1's namespace, refused by both, is this process's when the test
	// runs in the host's: out of the way here.
	defer func(p string) { initNetns = p }(initNetns)
	initNetns = "/nonexistent"
	strict, allowing := Guard{}, Guard{AllowOwn: true}
	own := Stub("own", self)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(2)
		go func() {
			defer wg.Done()
			if err := strict.Refuse(own); !errors.Is(err, ErrOwnNetns) {
				t.Errorf("strict guard: Refuse(own) = %v, want ErrOwnNetns", err)
			}
		}()
		go func() {
			defer wg.Done()
			if err := allowing.Refuse(own); err != nil {
				t.Errorf("allowing guard: Refuse(own) = %v, want nil", err)
			}
		}()
	}
	wg.Wait()
	if err := (Guard{}).Refuse(Stub("other", ID{Dev: 0, Ino: 1})); err != nil {
		t.Errorf("Refuse(another namespace) = %v", err)
	}
}

func TestRefuse(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates a netns")
	}
	dir := t.TempDir()
	ownLink := filepath.Join(dir, "own")
	if err := os.Symlink("/proc/self/ns/net", ownLink); err != nil {
		t.Fatal(err)
	}
	initLink := filepath.Join(dir, "init")
	if err := os.Symlink("/proc/1/ns/net", initLink); err != nil {
		t.Fatal(err)
	}
	strict, allowing := Guard{}, Guard{AllowOwn: true}
	for _, p := range []string{"/proc/self/ns/net", fmt.Sprintf("/proc/%d/ns/net", os.Getpid()), ownLink} {
		if err := refuse(strict, p); !errors.Is(err, ErrOwnNetns) {
			t.Errorf("Refuse(%s) = %v, want ErrOwnNetns", p, err)
		}
	}
	if err := refuse(allowing, "/proc/self/ns/net"); err != nil && !strings.Contains(err.Error(), "PID 1") {
		t.Errorf("AllowOwn: Refuse(own netns) = %v", err)
	}
	// PID 1's namespace is refused even with AllowOwn, through a symlink
	// too. (Where PID 1 cannot be looked at, as in some sandboxes, the
	// stand-in host test in cniplugin covers it.)
	if _, err := os.Stat("/proc/1/ns/net"); err != nil {
		t.Logf("skipping the PID 1 cases: %v", err)
	} else {
		for _, g := range []Guard{strict, allowing} {
			for _, p := range []string{"/proc/1/ns/net", initLink} {
				if err := refuse(g, p); !errors.Is(err, ErrOwnNetns) {
					t.Errorf("AllowOwn=%t: Refuse(%s) = %v, want ErrOwnNetns", g.AllowOwn, p, err)
				}
			}
		}
	}
	name := fmt.Sprintf("hns-%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	defer exec.Command("ip", "netns", "del", name).Run()
	if err := refuse(strict, "/run/netns/"+name); err != nil {
		t.Errorf("Refuse(fresh netns) = %v", err)
	}
	// A namespace registered as the host's is refused like PID 1's.
	if err := AddHost("/run/netns/" + name); err != nil {
		t.Fatal(err)
	}
	for _, g := range []Guard{strict, allowing} {
		if err := refuse(g, "/run/netns/"+name); !errors.Is(err, ErrOwnNetns) {
			t.Errorf("AllowOwn=%t: Refuse(registered host netns) = %v, want ErrOwnNetns", g.AllowOwn, err)
		}
	}
	hostsMu.Lock()
	clear(hosts)
	hostsMu.Unlock()
	if err := refuse(strict, "/run/netns/does-not-exist"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing path: got %v, want an error wrapping ErrNotExist", err)
	}
}

// TestOpenNotNetns: every kind of file that is not a network namespace is
// refused at once, naming the path and what it is; a FIFO does not block.
func TestOpenNotNetns(t *testing.T) {
	dir := t.TempDir()
	var tests []struct{ path, kind string }
	for path, kind := range notnetns.Files(t, dir) {
		tests = append(tests, struct{ path, kind string }{path, kind})
	}
	fifo := filepath.Join(dir, "fifo")
	link := filepath.Join(dir, "link-to-fifo")
	if err := os.Symlink(fifo, link); err != nil {
		t.Fatal(err)
	}
	tests = append(tests,
		struct{ path, kind string }{link, "FIFO"},
		struct{ path, kind string }{"/proc/self/ns/mnt", "namespace file of another kind than network"},
	)
	for _, tt := range tests {
		done := make(chan error, 1)
		go func() {
			n, err := Open(tt.path)
			if err == nil {
				n.Close()
			}
			done <- err
		}()
		select {
		case err := <-done:
			var ne *NotNetnsError
			if !errors.As(err, &ne) || ne.Kind != tt.kind || !errors.Is(err, ErrNotNetns) || !strings.Contains(err.Error(), tt.path) {
				t.Errorf("Open(%s) = %v, want a NotNetnsError %q naming the path", tt.path, err, tt.kind)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("Open(%s) blocked", tt.path)
		}
	}
	n, err := Open("/proc/self/ns/net")
	if err != nil {
		t.Fatalf("Open(own netns): %v", err)
	}
	defer n.Close()
	var st syscall.Stat_t
	if err := syscall.Stat("/proc/self/ns/net", &st); err != nil {
		t.Fatal(err)
	}
	if n.ID != (ID{Dev: st.Dev, Ino: st.Ino}) {
		t.Errorf("ID = %v, want %d:%d", n.ID, st.Dev, st.Ino)
	}
	if err := (Guard{}).RefuseFd(n.Fd(), n.Path); !errors.Is(err, ErrOwnNetns) {
		t.Errorf("RefuseFd(own) = %v", err)
	}
}

// TestDo: fn runs inside the namespace, sockets it creates stay there after
// the thread went back, and no thread of the process is left in the
// namespace, however many times it is entered.
func TestDo(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates a netns")
	}
	name := fmt.Sprintf("hns-do-%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	defer exec.Command("ip", "netns", "del", name).Run()
	n, err := Guard{}.Open("/run/netns/" + name)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	var inside ID
	var sock int
	for range 50 {
		err := n.Do(func() error {
			var err error
			inside, err = statID("/proc/thread-self/ns/net")
			if err != nil || sock != 0 {
				return err
			}
			sock, err = syscall.Socket(syscall.AF_NETLINK, syscall.SOCK_RAW|syscall.SOCK_CLOEXEC, syscall.NETLINK_ROUTE)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		if inside != n.ID {
			t.Fatalf("fn ran in netns %v, want %v", inside, n.ID)
		}
	}
	defer syscall.Close(sock)
	// SIOCGSKNS opens the namespace a socket belongs to.
	const siocgskns = 0x894C
	fd, _, errno := syscall.Syscall(syscall.SYS_IOCTL, uintptr(sock), siocgskns, 0)
	if errno != 0 {
		t.Fatalf("SIOCGSKNS: %v", errno)
	}
	defer syscall.Close(int(fd))
	var st syscall.Stat_t
	if err := syscall.Fstat(int(fd), &st); err != nil {
		t.Fatal(err)
	}
	if got := (ID{Dev: st.Dev, Ino: st.Ino}); got != n.ID {
		t.Errorf("the socket made inside is in netns %v, want %v", got, n.ID)
	}
	tasks, err := filepath.Glob("/proc/self/task/*/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	for _, task := range tasks {
		if id, err := statID(task); err == nil && id == n.ID {
			t.Errorf("thread %s is still in the namespace after Do", task)
		}
	}
	if err := n.Do(func() error { return fs.ErrPermission }); !errors.Is(err, fs.ErrPermission) {
		t.Errorf("Do returned %v, want fn's error", err)
	}
}

// goroutineID is the running goroutine's number, from its stack header.
func goroutineID() string {
	b := make([]byte, 64)
	b = b[:runtime.Stack(b, false)]
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return ""
	}
	return f[1]
}

// TestDoOwnNamespaceInPlace: Do on the namespace the process runs in runs
// fn on the caller's goroutine (no locked thread, no setns: every unlocked
// thread is there already), and what fn opens is in that namespace; Do on
// another namespace runs fn on a goroutine of its own.
func TestDoOwnNamespaceInPlace(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates a netns")
	}
	own, err := Open("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	defer own.Close()
	caller := goroutineID()
	var ran string
	var inside ID
	if err := own.Do(func() error {
		ran = goroutineID()
		var err error
		inside, err = statID("/proc/thread-self/ns/net")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if ran != caller || caller == "" {
		t.Errorf("in the own namespace fn ran on goroutine %q, the caller is %q", ran, caller)
	}
	if inside != own.ID {
		t.Errorf("fn ran in netns %v, want %v", inside, own.ID)
	}
	name := fmt.Sprintf("hns-own-%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	defer exec.Command("ip", "netns", "del", name).Run()
	other, err := Guard{}.Open("/run/netns/" + name)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if err := other.Do(func() error { ran = goroutineID(); return nil }); err != nil {
		t.Fatal(err)
	}
	if ran == caller {
		t.Errorf("in another namespace fn ran on the caller's goroutine %q", caller)
	}
}
