package inplace

import (
	"os"
	"path/filepath"
	"testing"
)

// TestNewReportsTheHostNetns: New says whether it registered the host's
// network namespace (PID 1's in the host /proc), which the agent needs
// before it runs a CNI call: a /proc where PID 1's cannot be read leaves
// repair in place configured but the host's namespace unknown.
func TestNewReportsTheHostNetns(t *testing.T) {
	needRoot(t)
	r, err := New(Options{ProcDir: "/proc", Backend: "auto"})
	if err != nil {
		t.Fatal(err)
	}
	if _, serr := os.Stat("/proc/1/ns/net"); serr == nil && r.HostNetns() != nil {
		t.Fatalf("/proc: HostNetns() = %v, want registered", r.HostNetns())
	}
	// A "proc" whose self resolves but which has no PID 1.
	proc := t.TempDir()
	if err := os.Symlink("/proc/self", filepath.Join(proc, "self")); err != nil {
		t.Fatal(err)
	}
	r, err = New(Options{ProcDir: proc, Backend: "auto"})
	if err != nil {
		t.Fatal(err)
	}
	if r.HostNetns() == nil {
		t.Fatal("no PID 1 to read: HostNetns() = nil, want why the host's namespace is not known")
	}
}
