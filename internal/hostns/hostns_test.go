package hostns

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nftmesh/nftmesh/testkit/notnetns"
)

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
	for _, p := range []string{"/proc/self/ns/net", fmt.Sprintf("/proc/%d/ns/net", os.Getpid()), ownLink} {
		if err := Refuse(p); !errors.Is(err, ErrOwnNetns) {
			t.Errorf("Refuse(%s) = %v, want ErrOwnNetns", p, err)
		}
	}
	AllowOwn = true
	if err := Refuse("/proc/self/ns/net"); err != nil && !strings.Contains(err.Error(), "PID 1") {
		t.Errorf("AllowOwn: Refuse(own netns) = %v", err)
	}
	AllowOwn = false
	// PID 1's namespace is refused even with AllowOwn, through a symlink
	// too. (Where PID 1 cannot be looked at, as in some sandboxes, the
	// stand-in host test in cmd/nftmesh-cni covers it.)
	if _, err := os.Stat("/proc/1/ns/net"); err != nil {
		t.Logf("skipping the PID 1 cases: %v", err)
	} else {
		for _, allow := range []bool{false, true} {
			AllowOwn = allow
			for _, p := range []string{"/proc/1/ns/net", initLink} {
				if err := Refuse(p); !errors.Is(err, ErrOwnNetns) {
					t.Errorf("AllowOwn=%t: Refuse(%s) = %v, want ErrOwnNetns", allow, p, err)
				}
			}
		}
	}
	AllowOwn = false
	name := fmt.Sprintf("hns-%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	defer exec.Command("ip", "netns", "del", name).Run()
	if err := Refuse("/run/netns/" + name); err != nil {
		t.Errorf("Refuse(fresh netns) = %v", err)
	}
	// A namespace registered as the host's is refused like PID 1's.
	if err := AddHost("/run/netns/" + name); err != nil {
		t.Fatal(err)
	}
	if err := Refuse("/run/netns/" + name); !errors.Is(err, ErrOwnNetns) {
		t.Errorf("Refuse(registered host netns) = %v, want ErrOwnNetns", err)
	}
	hostsMu.Lock()
	clear(hosts)
	hostsMu.Unlock()
	if err := Refuse("/run/netns/does-not-exist"); !errors.Is(err, fs.ErrNotExist) {
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
	if err := RefuseFd(n.Fd(), n.Path); !errors.Is(err, ErrOwnNetns) {
		t.Errorf("RefuseFd(own) = %v", err)
	}
}
