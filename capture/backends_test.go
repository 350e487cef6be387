package capture

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/nftmesh/nftmesh/iptables"
	"github.com/nftmesh/nftmesh/nft"
	"github.com/nftmesh/nftmesh/redirect"
)

func TestValidateBackend(t *testing.T) {
	for _, ok := range BackendNames {
		if err := ValidateBackend(ok); err != nil {
			t.Errorf("ValidateBackend(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"", "nft", "iptables", "legacy", "NFTABLES", "auto "} {
		err := ValidateBackend(bad)
		if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("%q", bad)) {
			t.Errorf("ValidateBackend(%q) = %v, want an error naming the value", bad, err)
		}
	}
}

var nsSeq atomic.Int64

// freshNetns makes a named netns for one test (test-only use of `ip`).
func freshNetns(t testing.TB) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces")
	}
	name := fmt.Sprintf("cap-%d-%d", os.Getpid(), nsSeq.Add(1))
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v %s", err, out)
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "del", name).Run() })
	// A pod's lo is up (the CNI loopback plugin does it); routes on lo need it.
	if out, err := exec.Command("ip", "-n", name, "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Fatalf("lo up: %v %s", err, out)
	}
	return "/run/netns/" + name
}

func inNetns(t *testing.T, path, stdin string, args ...string) {
	t.Helper()
	cmd := exec.Command("nsenter", append([]string{"--net=" + path}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v: %v\n%s", args, err, out)
	}
}

func defaultPlan(t *testing.T) redirect.Plan {
	p, err := redirect.Build(redirect.DefaultSpec())
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestSelect(t *testing.T) {
	ctx := context.Background()
	if iptables.LegacyAvailable() != nil && os.Geteuid() == 0 {
		t.Skip("kernel without legacy x_tables: selection between worlds cannot be tested")
	}
	t.Run("fresh netns: auto picks nftables", func(t *testing.T) {
		ns := freshNetns(t)
		b, why, err := sel(ctx, Auto, ns)
		if err != nil || b.Name() != NFTables || why != "auto: default" {
			t.Fatalf("got %v %q %v", b, why, err)
		}
	})
	t.Run("legacy nat rules: auto picks iptables-legacy", func(t *testing.T) {
		ns := freshNetns(t)
		inNetns(t, ns, "", "iptables-legacy", "-t", "nat", "-A", "POSTROUTING", "-o", "lo", "-j", "RETURN")
		b, why, err := sel(ctx, Auto, ns)
		if err != nil || b.Name() != Legacy || !strings.Contains(why, "legacy nat/mangle") {
			t.Fatalf("got %v %q %v", b, why, err)
		}
	})
	t.Run("legacy filter rules only: auto stays on nftables", func(t *testing.T) {
		ns := freshNetns(t)
		inNetns(t, ns, "", "iptables-legacy", "-t", "filter", "-A", "INPUT", "-i", "lo", "-j", "ACCEPT")
		b, _, err := sel(ctx, Auto, ns)
		if err != nil || b.Name() != NFTables {
			t.Fatalf("got %v %v", b, err)
		}
	})
	t.Run("iptables-nft ruleset: auto picks nftables and says why", func(t *testing.T) {
		ns := freshNetns(t)
		inNetns(t, ns, "table ip nat {\n chain POSTROUTING { type nat hook postrouting priority srcnat; }\n}\n", "nft", "-f", "-")
		b, why, err := sel(ctx, Auto, ns)
		if err != nil || b.Name() != NFTables || !strings.Contains(why, "iptables-nft") {
			t.Fatalf("got %v %q %v", b, why, err)
		}
	})
	t.Run("our nftables table: legacy refused, auto keeps nftables", func(t *testing.T) {
		ns := freshNetns(t)
		if err := nft.New().Apply(ctx, ns, defaultPlan(t)); err != nil {
			t.Fatal(err)
		}
		if _, _, err := sel(ctx, Legacy, ns); err == nil || !strings.Contains(err.Error(), "refusing") {
			t.Fatalf("explicit legacy over our nftables rules: err = %v", err)
		}
		b, why, err := sel(ctx, Auto, ns)
		if err != nil || b.Name() != NFTables || !strings.Contains(why, "already present") {
			t.Fatalf("got %v %q %v", b, why, err)
		}
	})
	t.Run("our legacy chains: nftables refused, auto keeps legacy", func(t *testing.T) {
		ns := freshNetns(t)
		if err := iptables.New().Apply(ctx, ns, defaultPlan(t)); err != nil {
			t.Fatal(err)
		}
		if _, _, err := sel(ctx, NFTables, ns); err == nil || !strings.Contains(err.Error(), "refusing") {
			t.Fatalf("explicit nftables over our legacy rules: err = %v", err)
		}
		b, why, err := sel(ctx, Auto, ns)
		if err != nil || b.Name() != Legacy || !strings.Contains(why, "already present") {
			t.Fatalf("got %v %q %v", b, why, err)
		}
	})
	t.Run("missing netns is an error naming it", func(t *testing.T) {
		if os.Geteuid() != 0 {
			t.Skip("needs root")
		}
		_, _, err := sel(ctx, Auto, "/run/netns/does-not-exist-bks")
		if err == nil || !strings.Contains(err.Error(), "does-not-exist-bks") {
			t.Fatalf("err = %v", err)
		}
	})
}

func sel(ctx context.Context, name, netnsPath string) (redirect.Backend, string, error) {
	n, err := Linux().OpenForReading(netnsPath)
	if err != nil {
		return nil, "", err
	}
	defer n.Close()
	v, err := linux.k.Enter(n, netnsPath, nil, linux.guard)
	if err != nil {
		return nil, "", err
	}
	defer v.Close()
	s, err := linux.choose(ctx, name, v, netnsPath)
	return s.backend, s.why, err
}
