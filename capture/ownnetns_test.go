package capture_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/nftmesh/nftmesh/capture"
	"github.com/nftmesh/nftmesh/iptables"
	"github.com/nftmesh/nftmesh/redirect"
	"github.com/nftmesh/nftmesh/testkit/scenarios"
)

// TestFakeOwnNetnsPerPipeline: two pipelines of one process, one allowing
// its own namespace (`redirect apply --allow-own-netns`) and one not, each
// behaves as configured whichever was made last. With the allowance a
// package-level setting, allowing it for one pipeline allowed it for every
// pipeline of the process.
func TestFakeOwnNetnsPerPipeline(t *testing.T) {
	ctx := context.Background()
	f, strict, o := fake(t)
	if err := f.AddHostNetns("/run/netns/own"); err != nil {
		t.Skip(err)
	}
	allowing := f.Pipeline().AllowingOwnNetns(true)
	if _, err := strict.Open("/run/netns/own"); !errors.Is(err, capture.ErrHostNetns) {
		t.Fatalf("strict Open(own) = %v, want ErrHostNetns", err)
	}
	n, err := allowing.Open("/run/netns/own")
	if err != nil && strings.Contains(err.Error(), "PID 1") {
		// This process runs in PID 1's namespace, refused by both.
		t.Skipf("this process runs in PID 1's network namespace: %v", err)
	}
	if err != nil {
		t.Fatalf("allowing Open(own) = %v", err)
	}
	defer n.Close()
	p := scenarios.MustPlan(t, "defaults")
	if _, err := strict.Apply(ctx, n, p, o); !errors.Is(err, capture.ErrHostNetns) {
		t.Errorf("strict Apply(own) = %v, want ErrHostNetns", err)
	}
	if c := f.Calls(); len(c) != 0 {
		t.Errorf("the strict pipeline called backends for its own namespace: %v", c)
	}
	if _, err := allowing.Apply(ctx, n, p, o); err != nil {
		t.Errorf("allowing Apply(own) = %v", err)
	}
	if _, err := strict.Remove(ctx, n, o); !errors.Is(err, capture.ErrHostNetns) {
		t.Errorf("strict Remove(own) = %v, want ErrHostNetns", err)
	}
	if _, err := allowing.Check(ctx, n, p, o); err != nil {
		t.Errorf("allowing Check(own) = %v", err)
	}
	// The allowance is the copy's: the pipeline it was made from refuses
	// still, and disallowing again refuses.
	if _, err := allowing.AllowingOwnNetns(false).Open("/run/netns/own"); !errors.Is(err, capture.ErrHostNetns) {
		t.Errorf("AllowingOwnNetns(false).Open(own) = %v, want ErrHostNetns", err)
	}
}

// TestOwnNetnsPerPipeline is TestFakeOwnNetnsPerPipeline on the running
// kernel, with both backends, whose own host checks (the nftables write
// path, the legacy sockets, the policy routes) follow the pipeline's: run
// as a child in a network namespace of its own, which is then "this
// process's own" and not PID 1's.
func TestOwnNetnsPerPipeline(t *testing.T) {
	if os.Getenv("CAPTURE_OWN_NETNS_CHILD") != "1" {
		if os.Geteuid() != 0 {
			t.Skip("needs root: runs itself in a new network namespace")
		}
		// lo up: the TPROXY routes go on it.
		cmd := exec.Command("unshare", "--net", "--", "sh", "-c", `ip link set lo up && exec "$0" "$@"`,
			os.Args[0], "-test.run=^TestOwnNetnsPerPipeline$", "-test.v")
		cmd.Env = append(os.Environ(), "CAPTURE_OWN_NETNS_CHILD=1")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("child in a new network namespace: %v\n%s", err, out)
		}
		t.Logf("child:\n%s", out)
		return
	}
	ctx := context.Background()
	o := capture.Options{RunDir: t.TempDir()}
	strict := capture.Linux()
	allowing := capture.Linux().AllowingOwnNetns(true)
	const own = "/proc/self/ns/net"
	if _, err := strict.Open(own); !errors.Is(err, capture.ErrHostNetns) {
		t.Fatalf("strict Open(own) = %v, want ErrHostNetns", err)
	}
	n, err := allowing.Open(own)
	if err != nil {
		t.Fatalf("allowing Open(own) = %v", err)
	}
	defer n.Close()
	backends := []string{capture.NFTables}
	if err := iptables.LegacyAvailable(); err != nil {
		t.Logf("no iptables-legacy case: %v", err)
	} else {
		backends = append(backends, capture.Legacy)
	}
	// tproxy has policy routes: the routes' own host check runs too.
	p := scenarios.MustPlan(t, "tproxy")
	for _, b := range backends {
		o.Backend = b
		if _, err := strict.Apply(ctx, n, p, o); !errors.Is(err, capture.ErrHostNetns) {
			t.Errorf("%s: strict Apply(own) = %v, want ErrHostNetns", b, err)
		}
		res, err := allowing.Apply(ctx, n, p, o)
		if err != nil {
			t.Errorf("%s: allowing Apply(own) = %v", b, err)
			continue
		}
		if res.Backend != b {
			t.Errorf("allowing Apply(own) used %s, want %s", res.Backend, b)
		}
		if _, err := allowing.Check(ctx, n, p, o); err != nil {
			t.Errorf("%s: allowing Check(own) = %v", b, err)
		}
		if _, err := strict.Remove(ctx, n, o); !errors.Is(err, capture.ErrHostNetns) {
			t.Errorf("%s: strict Remove(own) = %v, want ErrHostNetns", b, err)
		}
		removed, err := allowing.Remove(ctx, n, o)
		if err != nil || len(removed) == 0 {
			t.Errorf("%s: allowing Remove(own) = %v, %v; want our rules removed", b, removed, err)
		}
		if _, err := allowing.Check(ctx, n, redirect.Plan{}, o); err != nil {
			t.Errorf("%s: something of ours left after Remove: %v", b, err)
		}
	}
}
