package oneproc_test

import (
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"unsafe"

	"github.com/nftmesh/nftmesh/internal/oneproc"
)

// TestInitialisedBeforeOS: in a binary importing this package (this
// external test's binary, which imports os, testing and the rest besides),
// its init runs before os's, the first package whose initialisation starts
// goroutines, and leaves GOMAXPROCS at 1. Run as a child with
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

// TestMain runs the stack check in the main goroutine, where the package's
// init grew the stack (tests run on goroutines of their own).
func TestMain(m *testing.M) {
	if os.Getenv("ONEPROC_STACK_CHILD") != "" {
		os.Exit(stackMoves())
	}
	os.Exit(m.Run())
}

// stackMoves returns 1 if a call chain that needs 40 KB of stack moved
// the main goroutine's stack (its locals changed address), 0 if not.
func stackMoves() int {
	var here byte
	before := uintptr(unsafe.Pointer(&here))
	deep(40)
	if uintptr(unsafe.Pointer(&here)) != before {
		return 1
	}
	return 0
}

//go:noinline
func deep(n int) byte {
	var frame [1 << 10]byte
	frame[n%len(frame)] = byte(n)
	if n == 0 {
		return frame[0]
	}
	return deep(n-1) + frame[(n*3)%len(frame)]
}

// TestMainStackGrownOnce: in a binary importing this package, the main
// goroutine's stack already holds 40 KB of calls after the package inits:
// a deep call chain does not move it. Without the init's growStack it
// moves (the stack starts at 2 KB and the inits leave it at a few KB).
func TestMainStackGrownOnce(t *testing.T) {
	if oneproc.Stack < 40<<10/2 {
		t.Fatalf("Stack = %d: the main stack (at least twice that) would not hold 40 KB", oneproc.Stack)
	}
	cmd := exec.Command(os.Args[0], "-test.run", "^$")
	cmd.Env = append(os.Environ(), "ONEPROC_STACK_CHILD=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the main goroutine's stack moved for 40 KB of calls: %v %s", err, out)
	}
}
