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
