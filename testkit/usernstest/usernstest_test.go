package usernstest

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestNew: the namespace at Path is the holder's, owned by a user namespace
// other than the test's, with the ID maps asked for; Close removes it.
func TestNew(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates user and network namespaces")
	}
	n, err := New("unst-", 3_600_000)
	if err != nil {
		t.Fatal(err)
	}
	path := n.Path
	t.Cleanup(func() { _ = n.Close() })
	var mnt, proc unix.Stat_t
	if err := unix.Stat(path, &mnt); err != nil {
		t.Fatal(err)
	}
	if err := unix.Stat(fmt.Sprintf("/proc/%d/ns/net", n.PID()), &proc); err != nil {
		t.Fatal(err)
	}
	if mnt.Ino != proc.Ino || mnt.Dev != proc.Dev {
		t.Errorf("%s is not the holder's network namespace", path)
	}
	var own, holder unix.Stat_t
	if err := unix.Stat("/proc/self/ns/user", &own); err != nil {
		t.Fatal(err)
	}
	if err := unix.Stat(fmt.Sprintf("/proc/%d/ns/user", n.PID()), &holder); err != nil {
		t.Fatal(err)
	}
	if own.Ino == holder.Ino {
		t.Errorf("the holder shares the test's user namespace")
	}
	for _, f := range []string{"uid_map", "gid_map"} {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/%s", n.PID(), f))
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Fields(string(b)); strings.Join(got, " ") != "0 3600000 65536" {
			t.Errorf("%s = %q, want 0 3600000 65536", f, b)
		}
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("%s after Close: %v, want gone", path, err)
	}
}
