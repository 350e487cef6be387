package main

import (
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// TestHoldInterrupt: after holdInterrupt a SIGINT no longer ends the
// process (the verb finishes what it started), and without it the same
// SIGINT does (the control: the child really receives the signal). The
// child runs this test binary again.
func TestHoldInterrupt(t *testing.T) {
	if mode := os.Getenv("REDIRECT_TEST_SIGINT"); mode != "" {
		// Start from the default action even when this test binary was
		// started with SIGINT ignored (an ignored signal stays ignored
		// across exec, and in-process runs of apply in this package's
		// other tests ignore it): the kernel's sigaction, all zero, is
		// SIG_DFL on every architecture.
		var dfl [4]uint64
		if _, _, errno := syscall.RawSyscall6(syscall.SYS_RT_SIGACTION, uintptr(syscall.SIGINT), uintptr(unsafe.Pointer(&dfl)), 0, 8, 0, 0); errno != 0 {
			os.Exit(4)
		}
		if mode == "hold" {
			holdInterrupt()
		}
		if err := syscall.Kill(os.Getpid(), syscall.SIGINT); err != nil {
			os.Exit(3)
		}
		time.Sleep(100 * time.Millisecond)
		os.Stdout.WriteString("still running\n")
		os.Exit(0)
	}
	for _, mode := range []string{"hold", "default"} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestHoldInterrupt$")
		cmd.Env = append(os.Environ(), "REDIRECT_TEST_SIGINT="+mode)
		out, err := cmd.Output()
		survived := err == nil && strings.Contains(string(out), "still running")
		switch {
		case mode == "hold" && !survived:
			t.Errorf("with holdInterrupt, SIGINT ended the process: %v %q", err, out)
		case mode == "default" && survived:
			t.Errorf("without holdInterrupt, SIGINT did not end the process: the test cannot tell")
		}
	}
}
