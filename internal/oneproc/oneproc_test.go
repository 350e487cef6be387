package oneproc_test

import (
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"github.com/nftmesh/nftmesh/internal/oneproc"
)

// TestInitialisedBeforeOS: in a binary importing this package (this
// external test's binary, which imports os, testing and the rest besides),
// its init runs before os's, the first package whose initialisation starts
// goroutines, and leaves GOMAXPROCS at 1. The child runs with
// GODEBUG=inittrace=1, which prints each package's init in order.
func TestInitialisedBeforeOS(t *testing.T) {
	if os.Getenv("ONEPROC_CHILD") != "" {
		if n := runtime.GOMAXPROCS(0); n != 1 {
			t.Fatalf("GOMAXPROCS = %d after init, want 1", n)
		}
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestInitialisedBeforeOS$", "-test.count=1")
	cmd.Env = append(os.Environ(), "ONEPROC_CHILD=1", "GODEBUG=inittrace=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	var order []string
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) > 1 && f[0] == "init" {
			order = append(order, f[1])
		}
	}
	at := func(pkg string) int {
		for i, p := range order {
			if p == pkg {
				return i
			}
		}
		t.Fatalf("no init of %s in the child's inittrace:\n%s", pkg, out)
		return -1
	}
	if me, o := at("github.com/nftmesh/nftmesh/internal/oneproc"), at("os"); me > o {
		t.Errorf("oneproc initialised after os (init order %v)", order)
	}
	if oneproc.Procs < 1 {
		t.Errorf("Procs = %d", oneproc.Procs)
	}
}
