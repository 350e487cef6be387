package main

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

	"github.com/nftmesh/nftmesh/testkit/nstest"
)

func TestRootHint(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		euid int
		hint bool
	}{
		{"EPERM wrapped", fmt.Errorf("listing tables: %w", os.NewSyscallError("setns", syscall.EPERM)), 1000, true},
		{"EACCES in a PathError", fmt.Errorf("opening: %w", &fs.PathError{Op: "open", Path: "/proc/1/ns/net", Err: syscall.EACCES}), 1000, true},
		{"errno only in the text", errors.New("failed to set into network namespace 6: operation not permitted"), 65534, true},
		{"root", fmt.Errorf("x: %w", syscall.EPERM), 0, false},
		{"another errno", fmt.Errorf("x: %w", syscall.ENOENT), 1000, false},
		{"usage error", usageErr("--netns is required"), 1000, false},
		{"nil", nil, 1000, false},
		// inspect's drift is an exit code with nothing to print.
		{"exit code alone", &exitError{exitDrift, nil}, 1000, false},
	} {
		if got := rootHint(tc.err, tc.euid); (got != "") != tc.hint || (tc.hint && !strings.Contains(got, "needs root")) {
			t.Errorf("%s: rootHint = %q, want a hint: %t", tc.name, got, tc.hint)
		}
	}
}

// TestCLINonRootSaysRoot: the whole binary run as nobody against a real
// namespace says the command needs root, for each kernel verb, exit 1.
func TestCLINonRootSaysRoot(t *testing.T) {
	nstest.NeedRoot(t) // to create the namespace and drop to nobody
	name, _ := nstest.New(t, "rcli-")
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} { // nobody must reach the binary
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	bin := filepath.Join(dir, "redirect")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	runDir := filepath.Join(dir, "run")
	if err := os.Mkdir(runDir, 0o777); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"apply", "--netns", name, "--defaults", "--backend", "nftables"},
		{"inspect", "--netns", name},
		{"clean", "--netns", name},
		{"inspect", "--netns", "/proc/1/ns/net"},
	} {
		cmd := exec.Command(bin, append(args, "--run-dir", runDir)...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		cmd.WaitDelay = 10 * time.Second
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != exitFailure {
			t.Errorf("%v as nobody: %v, want exit %d\n%s", args, err, exitFailure, out)
		}
		if want := "redirect: " + args[0] + " needs root"; !strings.HasPrefix(string(out), want) || strings.Count(strings.TrimSpace(string(out)), "\n") != 0 {
			t.Errorf("%v as nobody: %q does not start with %q on one line", args, out, want)
		}
	}
}
