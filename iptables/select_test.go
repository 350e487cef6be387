package iptables

import (
	"context"
	"testing"

	"github.com/nftmesh/nftmesh/testkit/scenarios"

	"github.com/nftmesh/nftmesh/testkit/nstest"
)

func TestLegacyAvailable(t *testing.T) {
	nstest.NeedRoot(t)
	if err := LegacyAvailable(); err != nil {
		t.Fatalf("LegacyAvailable on a kernel with x_tables legacy built in: %v", err)
	}
}

// TestProbeNatOrMangleRules: Probe reports any rule or user chain in nat
// or mangle, of either family and whoever made it, and reading creates no
// table.
func TestProbeNatOrMangleRules(t *testing.T) {
	nstest.NeedRoot(t)
	ns, path := nstest.New(t, "leg-")
	check := func(want bool, when string) {
		t.Helper()
		pr, err := probe(path)
		if err != nil {
			t.Fatalf("%s: %v", when, err)
		}
		if pr.NatOrMangleRules != want {
			t.Errorf("%s: NatOrMangleRules = %v, want %v", when, pr.NatOrMangleRules, want)
		}
	}
	check(false, "fresh netns")
	if out := saveTables(t, ns, false); out != "" {
		t.Errorf("Probe instantiated tables:\n%s", out)
	}
	nstest.Run(t, ns, "", "iptables-legacy", "-t", "filter", "-A", "INPUT", "-j", "ACCEPT")
	check(false, "filter rules only")
	nstest.Run(t, ns, "", "iptables-legacy", "-t", "nat", "-L")
	check(false, "empty nat table")
	nstest.Run(t, ns, "", "ip6tables-legacy", "-t", "mangle", "-N", "X")
	check(true, "a user chain in ip6 mangle")
	nstest.Run(t, ns, "", "ip6tables-legacy", "-t", "mangle", "-X", "X")
	check(false, "chain deleted")
	nstest.Run(t, ns, "", "iptables-legacy", "-t", "nat", "-A", "OUTPUT", "-j", "ACCEPT")
	check(true, "a rule in nat")
	nstest.Run(t, ns, "", "iptables-legacy", "-t", "nat", "-F", "OUTPUT")
	check(false, "nat flushed")
	sc, _ := scenarios.ByName("defaults")
	p, _ := sc.Plan()
	b := New()
	if err := b.Apply(context.Background(), path, p); err != nil {
		t.Fatal(err)
	}
	check(true, "our rules")
	if err := b.Remove(context.Background(), path); err != nil {
		t.Fatal(err)
	}
	check(false, "after Remove")
}
