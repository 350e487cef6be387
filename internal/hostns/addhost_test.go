package hostns

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestAddHostFromProc: a process in a network namespace of its own (as the
// agent in its pod) registers the host's: PID 1's where it can be read, or
// else its nearest ancestor's outside its namespace (the runtime's, here
// this test process's). Run as a child in a new namespace, it prints the
// path it registered, whose namespace must be this process's.
func TestAddHostFromProc(t *testing.T) {
	if os.Getenv("HOSTNS_ADDHOST_CHILD") == "1" {
		path, err := AddHostFromProc("/proc")
		if err != nil {
			os.Stdout.WriteString("error: " + err.Error())
			os.Exit(3)
		}
		os.Stdout.WriteString(path)
		os.Exit(0)
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root (a child in a new network namespace)")
	}
	cmd := exec.Command("unshare", "--net", "--", os.Args[0], "-test.run=^TestAddHostFromProc$")
	cmd.Env = append(os.Environ(), "HOSTNS_ADDHOST_CHILD=1")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("child: %v: %s", err, out)
	}
	path := strings.TrimSpace(string(out))
	got, err := statID(path)
	if err != nil {
		t.Fatalf("child registered %s: %v", path, err)
	}
	want, err := statID("/proc/thread-self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Errorf("child registered %s (%v), not the namespace it was started from (%v)", path, got, want)
	}
	t.Logf("registered %s", path)
}

// TestAddHostFromProcNoAncestorMessage: where PID 1's namespace cannot be
// read and the walk reaches PID 1 without leaving this process's
// namespace, the error says so without a stray "<nil>" (it printed "in
// /proc (<nil>)" on the benchmark's machine).
func TestAddHostFromProcNoAncestorMessage(t *testing.T) {
	proc := t.TempDir()
	// No 1/ns/net; self is PID 42, whose parent is PID 1.
	if err := os.MkdirAll(proc+"/42", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(proc+"/42/status", []byte("Name:\tagent\nPPid:\t1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("42", proc+"/self"); err != nil {
		t.Fatal(err)
	}
	_, err := AddHostFromProc(proc)
	if err == nil {
		t.Fatal("registered a host namespace from a /proc without one")
	}
	if msg := err.Error(); strings.Contains(msg, "<nil>") || !strings.Contains(msg, "no ancestor of this process outside its network namespace") {
		t.Errorf("error %q: want the no-ancestor reason without <nil>", msg)
	}
}
