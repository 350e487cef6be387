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

func TestHasLegacyRules(t *testing.T) {
	nstest.NeedRoot(t)
	ns, path := nstest.New(t, "leg-")
	check := func(want bool, when string) {
		t.Helper()
		got, err := HasLegacyRules(path)
		if err != nil {
			t.Fatalf("%s: %v", when, err)
		}
		if got != want {
			t.Errorf("%s: HasLegacyRules = %v, want %v", when, got, want)
		}
	}
	check(false, "fresh netns")
	if out := saveTables(t, ns, false); out != "" {
		t.Errorf("HasLegacyRules instantiated tables:\n%s", out)
	}
	nstest.Run(t, ns, "", "iptables-legacy", "-t", "filter", "-A", "INPUT", "-j", "ACCEPT")
	check(false, "filter rules only")
	nstest.Run(t, ns, "", "iptables-legacy", "-t", "nat", "-L")
	check(false, "empty nat table")
	nstest.Run(t, ns, "", "ip6tables-legacy", "-t", "mangle", "-N", "X")
	check(true, "a user chain in ip6 mangle")
	nstest.Run(t, ns, "", "ip6tables-legacy", "-t", "mangle", "-X", "X")
	check(false, "chain deleted")
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
