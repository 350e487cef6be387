package nft

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/nftmesh/nftmesh/redirect"
	"github.com/nftmesh/nftmesh/testkit/nstest"
	"github.com/nftmesh/nftmesh/testkit/scenarios"
)

// TestKernelLargePortAnnotations applies the largest port annotations a pod
// can carry, checks them, applies again (the replacing batch) and reads the
// set back with nft, each step within scenarios.LargeApplyBound. A port set
// was a plain set, which the kernel keeps for a 2-byte key as a bitmap whose
// insert walks every element: 45,341 ports took ~10 s in one batch and Apply
// failed with "reading batch acks: netlink receive: i/o timeout".
func TestKernelLargePortAnnotations(t *testing.T) {
	nstest.NeedRoot(t)
	ctx := context.Background()
	for _, sc := range scenarios.Large {
		t.Run(sc.Name, func(t *testing.T) {
			p, err := sc.Plan()
			if err != nil {
				t.Fatal(err)
			}
			ns, cleanup := newNetns(t)
			t.Cleanup(cleanup)
			b := New()
			timed(t, "Apply", func() error { return b.Apply(ctx, ns, p) })
			timed(t, "Check", func() error { return b.Check(ctx, ns, p) })
			timed(t, "Apply again", func() error { return b.Apply(ctx, ns, p) })
			for _, s := range p.Sets {
				if s.Kind != redirect.SetPort {
					continue
				}
				if got, want := nftSetPorts(t, ns, s.Name), redirect.SortedPorts(s.Ports); !slices.Equal(got, want) {
					t.Errorf("nft lists %d ports in set %s, the plan has %d", len(got), s.Name, len(want))
				}
			}
			timed(t, "Remove", func() error { return b.Remove(ctx, ns) })
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

// nftSetPorts reads a port set of our table with `nft -j`, ranges
// expanded, sorted.
func nftSetPorts(t *testing.T, ns, set string) []uint16 {
	t.Helper()
	var doc struct {
		Nftables []struct {
			Set *struct{ Elem []json.RawMessage } `json:"set"`
		} `json:"nftables"`
	}
	out := nstest.Run(t, ns, "", "nft", "-j", "list", "set", "inet", TableName, set)
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("parsing nft -j list set: %v", err)
	}
	var ports []uint16
	for _, o := range doc.Nftables {
		if o.Set == nil {
			continue
		}
		for _, e := range o.Set.Elem {
			var one uint16
			var r struct{ Range [2]uint16 }
			switch {
			case json.Unmarshal(e, &one) == nil:
				ports = append(ports, one)
			case json.Unmarshal(e, &r) == nil && r.Range[0] <= r.Range[1]:
				for p := int(r.Range[0]); p <= int(r.Range[1]); p++ {
					ports = append(ports, uint16(p))
				}
			default:
				t.Fatalf("set %s: element %s is neither a port nor a range", set, e)
			}
		}
	}
	slices.Sort(ports)
	return ports
}

// TestKernelListCarriesFlagsAndPolicy: a table switched off and a base
// chain set to drop, by nft, read back through List and printed by Render,
// are what nft itself lists: the read-back carries both.
func TestKernelListCarriesFlagsAndPolicy(t *testing.T) {
	nstest.NeedRoot(t)
	ctx := context.Background()
	p := scenarios.MustPlan(t, "defaults")
	ns, cleanup := newNetns(t)
	t.Cleanup(cleanup)
	b := New()
	if err := b.Apply(ctx, ns, p); err != nil {
		t.Fatal(err)
	}
	nstest.Run(t, ns, "add table inet nftmesh { flags dormant; }\nadd chain inet nftmesh nat-output { policy drop; }\n", "nft", "-f", "-")
	live, err := b.List(ctx, ns)
	if err != nil {
		t.Fatal(err)
	}
	if live.TableFlags != redirect.TableDormant || live.Table(redirect.TableNat).Chain(redirect.ChainOutput).Policy != redirect.PolicyDrop {
		t.Fatalf("List: table flags %s, nat OUTPUT policy %s; want dormant, drop", live.TableFlags, live.Table(redirect.TableNat).Chain(redirect.ChainOutput).Policy)
	}
	rendered, err := Render(live)
	if err != nil {
		t.Fatal(err)
	}
	listed := handleRE.ReplaceAllString(nstest.Run(t, ns, "", "nft", "list", "table", "inet", TableName), "")
	if normalize(listed) != normalize(rendered) {
		t.Errorf("nft list differs from Render of List:\n--- nft list\n%s\n--- Render\n%s", listed, rendered)
	}
}
