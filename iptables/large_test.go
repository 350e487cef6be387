package iptables

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nftmesh/nftmesh/redirect"
	"github.com/nftmesh/nftmesh/testkit/nstest"
	"github.com/nftmesh/nftmesh/testkit/scenarios"
)

// TestKernelLargePortAnnotations is nft's test of the same name for the
// legacy backend, which writes a port set as one rule per port as Istio
// does: the largest annotations a pod can carry are applied, checked and
// applied again within scenarios.LargeApplyBound, and iptables-legacy-save
// prints what Render does.
func TestKernelLargePortAnnotations(t *testing.T) {
	nstest.NeedRoot(t)
	ctx := context.Background()
	for _, sc := range scenarios.Large {
		t.Run(sc.Name, func(t *testing.T) {
			p, err := sc.Plan()
			if err != nil {
				t.Fatal(err)
			}
			ns, path := nstest.New(t, "leg-")
			b := New()
			timed(t, "Apply", func() error { return b.Apply(ctx, path, p) })
			timed(t, "Check", func() error { return b.Check(ctx, path, p) })
			timed(t, "Apply again", func() error { return b.Apply(ctx, path, p) })
			for _, f := range families {
				want, err := Render(p, f.fam)
				if err != nil {
					t.Fatal(err)
				}
				if got := saveTables(t, ns, f.ext == "v6"); got != want {
					t.Errorf("%s: iptables-legacy-save (%d lines) differs from Render (%d lines)", f.ext, strings.Count(got, "\n"), strings.Count(want, "\n"))
				}
			}
			timed(t, "Remove", func() error { return b.Remove(ctx, path) })
		})
	}
}

// timed runs f, failing t on its error or when it takes longer than
// scenarios.LargeApplyBound.
func timed(t *testing.T, what string, f func() error) {
	t.Helper()
	start := time.Now()
	err := f()
	took := time.Since(start)
	if err != nil {
		t.Fatalf("%s after %v: %v", what, took.Round(time.Millisecond), err)
	}
	if took > scenarios.LargeApplyBound {
		t.Errorf("%s took %v, more than %v", what, took.Round(time.Millisecond), scenarios.LargeApplyBound)
	}
	t.Logf("%s: %v", what, took.Round(time.Millisecond))
}

// TestKernelListCarriesPolicy: a builtin chain's policy that someone set to
// DROP, in a chain holding our rules, is in what List reads (Render then
// prints what iptables-legacy-save prints), Check names it, and Apply does
// not take a plan that would set one.
func TestKernelListCarriesPolicy(t *testing.T) {
	nstest.NeedRoot(t)
	ctx := context.Background()
	p := scenarios.MustPlan(t, "tproxy")
	ns, path := nstest.New(t, "leg-")
	b := New()
	if err := b.Apply(ctx, path, p); err != nil {
		t.Fatal(err)
	}
	nstest.Run(t, ns, "", "iptables-legacy", "-w", "-t", "mangle", "-P", "PREROUTING", "DROP")
	live, err := b.List(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	if got := live.Table(redirect.TableMangle).Chain(redirect.ChainPrerouting).Policy; got != redirect.PolicyDrop {
		t.Fatalf("List: mangle PREROUTING policy %s, want drop", got)
	}
	want, err := Render(live, redirect.FamilyIPv4)
	if err != nil {
		t.Fatal(err)
	}
	if got := saveTables(t, ns, false); got != want {
		t.Errorf("iptables-legacy-save differs from Render of List:\n%s", lineDiff(want, got))
	}
	if err := b.Check(ctx, path, p); !redirect.IsDrift(err) || !strings.Contains(err.Error(), "policy drop") {
		t.Errorf("Check = %v, want drift naming the policy", err)
	}
	if err := b.Apply(ctx, path, live); err == nil || !strings.Contains(err.Error(), "policies to their owners") {
		t.Errorf("Apply of a plan with a builtin chain's policy = %v, want a refusal", err)
	}
}
