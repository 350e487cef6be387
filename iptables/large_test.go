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
// does: the largest port annotations a pod can carry are applied, checked
// and applied again within scenarios.LargeApplyBound, and
// iptables-legacy-save shows one rule per port in each family.
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
			set := p.Set("inbound-exclude-ports")
			if set == nil {
				t.Fatal("the plan has no set inbound-exclude-ports")
			}
			want := len(redirect.SortedPorts(set.Ports))
			for _, v6 := range []bool{false, true} {
				n := 0
				for _, l := range strings.Split(saveTables(t, ns, v6), "\n") {
					if strings.HasPrefix(l, "-A ISTIO_INBOUND -p tcp -m tcp --dport ") && strings.HasSuffix(l, "-j RETURN") {
						n++
					}
				}
				// The one other such rule: 15008, the tunnel port.
				if n != want+1 {
					t.Errorf("v6=%v: iptables-legacy-save shows %d port RETURN rules in ISTIO_INBOUND, want %d", v6, n, want+1)
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
