package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nftmesh/nftmesh/nft"
	"github.com/nftmesh/nftmesh/redirect"
	"github.com/nftmesh/nftmesh/redirect/legacy"
)

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("kernel test: needs root (network namespaces)")
	}
}

func newNetns(t *testing.T) (string, string) {
	t.Helper()
	name := fmt.Sprintf("rcli-%d-%d", os.Getpid(), time.Now().UnixNano()%1e9)
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	if out, err := exec.Command("ip", "-n", name, "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Fatalf("lo up: %v %s", err, out)
	}
	return name, "/run/netns/" + name
}

func inNetns(t *testing.T, name, stdin string, args ...string) string {
	t.Helper()
	cmd := exec.Command("ip", append([]string{"netns", "exec", name}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %v\n%s", args, err, out)
	}
	return string(out)
}

// TestCLICleanBothBackends: `redirect clean` (auto) removes nftmesh's rules
// from nftables AND iptables-legacy when both hold them, says what it
// removed from which, keeps another installer's ISTIO_* chain, and then says
// there is nothing to remove.
func TestCLICleanBothBackends(t *testing.T) {
	needRoot(t)
	if err := legacy.LegacyAvailable(); err != nil {
		t.Skip(err)
	}
	name, path := newNetns(t)
	spec := redirect.DefaultSpec()
	spec.InterceptionMode = redirect.ModeTProxy
	spec.IPv6 = true
	p, err := redirect.Build(spec)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := nft.New().Apply(ctx, path, p); err != nil {
		t.Fatal(err)
	}
	if err := legacy.New().Apply(ctx, path, p); err != nil {
		t.Fatal(err)
	}
	inNetns(t, name, "", "iptables-legacy", "-t", "nat", "-N", "ISTIO_FOREIGN")
	inNetns(t, name, "", "iptables-legacy", "-t", "nat", "-A", "ISTIO_FOREIGN", "-p", "tcp", "--dport", "7", "-j", "RETURN")
	runDir := t.TempDir()

	code, out, errOut := runCLI(t, "clean", "--netns", path, "--run-dir", runDir)
	if code != exitOK {
		t.Fatalf("clean: exit %d: %s", code, errOut)
	}
	for _, want := range []string{"nftables: table inet nftmesh", "iptables-legacy: ", "fwmark 1337", "::6 on lo"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("clean output %q does not say %q", errOut, want)
		}
	}
	if out != "" {
		t.Errorf("stdout: %q", out)
	}
	for _, b := range []redirect.Backend{nft.New(), legacy.New()} {
		if left, err := b.List(ctx, path); err != nil || !left.Empty() {
			t.Errorf("%s still holds rules of ours (%v):\n%s", b.Name(), err, strings.Join(redirect.Describe(left), "\n"))
		}
	}
	if saved := inNetns(t, name, "", "iptables-legacy-save", "-t", "nat"); !strings.Contains(saved, "-A ISTIO_FOREIGN -p tcp -m tcp --dport 7 -j RETURN") {
		t.Errorf("the foreign ISTIO_FOREIGN chain is gone:\n%s", saved)
	}
	code, _, errOut = runCLI(t, "clean", "--netns", path, "--run-dir", runDir)
	if code != exitOK || !strings.Contains(errOut, "nothing to remove") {
		t.Errorf("second clean: exit %d, %q; want nothing to remove", code, errOut)
	}
}

// TestCLINotANetns: apply, clean and inspect with --netns naming a FIFO, a
// regular file, a directory, a socket or a device fail at once (no hang on
// the FIFO) with an error naming the path and what it is.
func TestCLINotANetns(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	reg := filepath.Join(dir, "file")
	if err := os.WriteFile(reg, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	targets := map[string]string{fifo: "FIFO", reg: "regular file", dir: "directory", sock: "socket", "/dev/null": "character device"}
	for path, kind := range targets {
		for _, verb := range [][]string{
			{"apply", "-a", "sidecar.istio.io/interceptionMode=REDIRECT"},
			{"clean"},
			{"inspect"},
		} {
			args := append(append([]string{}, verb...), "--netns", path, "--run-dir", dir)
			done := make(chan struct{})
			var code int
			var errOut string
			go func() {
				code, _, errOut = runCLI(t, args...)
				close(done)
			}()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatalf("redirect %v hangs", args)
			}
			if code != exitFailure || !strings.Contains(errOut, path) || !strings.Contains(errOut, kind) {
				t.Errorf("redirect %v: exit %d, %q; want exit %d naming %s and %q", args, code, errOut, exitFailure, path, kind)
			}
		}
	}
}
