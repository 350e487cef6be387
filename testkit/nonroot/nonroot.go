// Package nonroot proves that tests meant to need no privileges really run
// without them: run as root, Rerun starts the current test binary again as
// the unprivileged user nobody (65534:65534, no capabilities) with only the
// named tests, and fails unless they all pass there. It is a test helper (it
// starts a process) imported only by tests.
package nonroot

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
)

// Nobody is the user and group the tests are run as.
const Nobody = 65534

// Rerun runs the tests of this binary matching pattern (a -test.run
// regexp) as nobody and fails t unless at least one ran and every one
// passed, none skipped. Run as another user than root, the tests already
// run unprivileged: Rerun only checks that and returns.
func Rerun(t *testing.T, pattern string) {
	t.Helper()
	if os.Geteuid() != 0 {
		if caps := effectiveCaps(); caps != "0000000000000000" {
			t.Fatalf("uid %d holds capabilities %s: the tests matching %s do not run unprivileged", os.Geteuid(), caps, pattern)
		}
		t.Logf("already running as uid %d without capabilities: the tests matching %s run unprivileged in this run", os.Geteuid(), pattern)
		return
	}
	// nobody cannot reach the go build cache: copy the binary into a
	// directory it can read.
	dir, err := os.MkdirTemp("", "nonroot-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, filepath.Base(os.Args[0]))
	if err := copyFile(os.Args[0], bin); err != nil {
		t.Fatal(err)
	}
	// In the package's directory, as go test runs tests (they read
	// testdata relative to it); nobody must be able to read it.
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	// The calling test runs again too, and checks that it holds no
	// capabilities there.
	cmd := exec.Command(bin, "-test.run", pattern+"|^"+t.Name()+"$", "-test.count=1", "-test.v")
	cmd.Dir = wd
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + dir, "TMPDIR=/tmp"}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Credential: &syscall.Credential{Uid: Nobody, Gid: Nobody, Groups: []uint32{}},
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the tests matching %s failed as uid %d: %v\n%s", pattern, Nobody, err, out)
	}
	passed := regexp.MustCompile(`(?m)^--- PASS: (\S+)`).FindAllStringSubmatch(string(out), -1)
	if len(passed) == 0 {
		t.Fatalf("no test matching %s ran as uid %d:\n%s", pattern, Nobody, out)
	}
	if strings.Contains(string(out), "--- SKIP") {
		t.Fatalf("a test matching %s skipped as uid %d:\n%s", pattern, Nobody, out)
	}
	var names []string
	for _, m := range passed {
		if m[1] != t.Name() {
			names = append(names, m[1])
		}
	}
	if len(names) == 0 {
		t.Fatalf("no test matching %s ran as uid %d:\n%s", pattern, Nobody, out)
	}
	t.Logf("passed as uid %d, without capabilities: %s", Nobody, strings.Join(names, ", "))
}

// effectiveCaps is this process's CapEff from /proc/self/status.
func effectiveCaps() string {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return "unknown: " + err.Error()
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "CapEff:"); ok {
			return strings.TrimSpace(v)
		}
	}
	return "unknown"
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return fmt.Errorf("copying %s: %w", src, err)
	}
	return out.Close()
}
