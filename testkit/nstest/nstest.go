// Package nstest gives tests throw-away named network namespaces and runs
// commands inside them. It uses the `ip` and `nsenter` binaries, as
// independent tools a test may trust to set up and read what our code is
// then checked against; product code never does.
package nstest

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/nftmesh/nftmesh/testkit/spawn"
)

// NeedRoot skips t unless it runs as root, which creating network
// namespaces and programming netfilter need.
func NeedRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("kernel test: needs root (network namespaces, netfilter); run as root")
	}
}

// New creates a network namespace named prefix plus a random suffix, with
// lo up (as the CNI loopback plugin leaves a pod's), removed when the test
// ends unless the test removed it. It returns the name and the path (/run/netns/name).
func New(t testing.TB, prefix string) (name, path string) {
	t.Helper()
	NeedRoot(t)
	name = prefix + RandHex(4)
	Sh(t, "ip", "netns", "add", name)
	t.Cleanup(func() {
		if _, err := os.Stat("/run/netns/" + name); os.IsNotExist(err) {
			return // the test removed it itself
		}
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
			t.Errorf("ip netns del %s: %v: %s", name, err, out)
		}
	})
	Sh(t, "ip", "-n", name, "link", "set", "lo", "up")
	return name, "/run/netns/" + name
}

// Run runs args inside the network namespace ns (a path, or a name under
// /run/netns) with stdin as input, fails t if the command fails, and
// returns its output.
func Run(t testing.TB, ns, stdin string, args ...string) string {
	t.Helper()
	if !strings.Contains(ns, "/") {
		ns = filepath.Join("/run/netns", ns)
	}
	cmd := exec.Command("nsenter", append([]string{"--net=" + ns, "--"}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s in %s: %v\n%s", strings.Join(args, " "), ns, err, out)
	}
	return string(out)
}

// Sh runs a command in the test's own namespaces, fails t if it fails, and
// returns its output.
func Sh(t testing.TB, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// RandHex is n random bytes in hex: unique names for namespaces, pods and
// containers of concurrent tests.
func RandHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// mountNSEnv names, in the child InPrivateMountNS starts, the test it runs.
const mountNSEnv = "NFTMESH_TEST_IN_MOUNT_NS"

// InPrivateMountNS runs the calling test again in a child process with a
// mount namespace of its own (all mounts made private first), so what the
// test mounts (a tmpfs to fill, a read-only remount) never reaches the
// machine's. It returns true in the child, which runs the test body, and
// false in the parent, which has checked the child's result. It skips
// unless root.
func InPrivateMountNS(t *testing.T) bool {
	t.Helper()
	if os.Getenv(mountNSEnv) == t.Name() {
		if err := unix.Mount("", "/", "", unix.MS_PRIVATE|unix.MS_REC, ""); err != nil {
			t.Fatalf("making the test's mounts private: %v", err)
		}
		return true
	}
	NeedRoot(t)
	cmd := exec.Command(os.Args[0], "-test.run=^"+regexp.QuoteMeta(t.Name())+"$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), mountNSEnv+"="+t.Name())
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS, Pdeathsig: syscall.SIGKILL}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := spawn.Run(cmd)
	t.Logf("in a private mount namespace:\n%s", out.Bytes())
	if err != nil {
		t.Fatalf("the test failed in its mount namespace: %v", err)
	}
	if !bytes.Contains(out.Bytes(), []byte("--- PASS: "+t.Name())) {
		t.Fatal("the test did not pass in its mount namespace")
	}
	return false
}
