package iptables

import (
	"context"
	"strings"
	"testing"

	"github.com/nftmesh/nftmesh/testkit/nstest"
)

// TestForeignIstioChainsNotOurs: ISTIO_* chains that another installer
// (istio-init, a hand-written rule) made, with untagged rules or empty, are
// not nftmesh's: Probe does not report them, List does not show them,
// Remove leaves them, and Apply refuses to reuse their names.
func TestForeignIstioChainsNotOurs(t *testing.T) {
	ns, path := nstest.New(t, "leg-")
	ipt := func(args ...string) { nstest.Run(t, ns, "", append([]string{"iptables-legacy"}, args...)...) }
	ipt("-t", "nat", "-N", "ISTIO_OUTPUT")
	ipt("-t", "nat", "-A", "ISTIO_OUTPUT", "-p", "tcp", "--dport", "8", "-j", "RETURN")
	ipt("-t", "mangle", "-N", "ISTIO_INBOUND")
	before := saveTables(t, ns, false)
	ctx := context.Background()
	pr, err := probe(path)
	if err != nil {
		t.Fatal(err)
	}
	if pr.Ours {
		t.Errorf("Probe: foreign ISTIO_* chains reported as nftmesh's")
	}
	p, err := New().List(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	if !p.Empty() {
		t.Errorf("List shows foreign chains as ours: %+v", p)
	}
	if err := New().Remove(ctx, path); err != nil {
		t.Fatal(err)
	}
	if after := saveTables(t, ns, false); after != before {
		t.Errorf("Remove changed foreign chains:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	err = New().Apply(ctx, path, defaultPlan(t))
	if err == nil || !strings.Contains(err.Error(), "did not install") {
		t.Errorf("Apply over a foreign ISTIO_OUTPUT: err = %v, want a refusal naming the chain", err)
	}
	if after := saveTables(t, ns, false); after != before {
		t.Errorf("a refused Apply changed the tables:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}
