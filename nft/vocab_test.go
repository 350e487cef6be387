package nft

import (
	"context"
	"net/netip"
	"strings"
	"testing"

	"github.com/nftmesh/nftmesh/redirect"

	"github.com/nftmesh/nftmesh/testkit/nstest"
)

// vocabularyPlan uses every match and verdict of the closed vocabulary in
// the forms Build does not (masks, wildcards, negations, several source
// ports, open-ended intervals reaching the top of the address space).
func vocabularyPlan() redirect.Plan {
	tcp, udp := redirect.MatchProto{Proto: redirect.ProtoTCP}, redirect.MatchProto{Proto: redirect.ProtoUDP}
	pfx := netip.MustParsePrefix
	return redirect.Plan{
		Sets: []redirect.Set{
			{Name: "v4", Kind: redirect.SetIPv4, Prefixes: []netip.Prefix{pfx("255.255.255.0/24"), pfx("0.0.0.0/8"), pfx("10.1.2.3/32"), pfx("10.1.2.4/31")}},
			{Name: "v6", Kind: redirect.SetIPv6, Prefixes: []netip.Prefix{pfx("ffff::/16"), pfx("2001:db8::/32")}},
			{Name: "ports", Kind: redirect.SetPort, Ports: []uint16{443, 80, 80}},
		},
		Tables: []redirect.Table{
			{Name: redirect.TableMangle, Chains: []redirect.Chain{
				{Name: "PREROUTING", Hook: redirect.HookPrerouting, Type: redirect.ChainTypeFilter, Priority: redirect.PriorityMangle, Rules: []redirect.Rule{
					{Family: redirect.FamilyIPv4, Matches: []redirect.Match{redirect.MatchAddr{Prefix: pfx("127.0.0.0/8"), Negate: true}, tcp,
						redirect.MatchPort{Source: true, Ports: []uint16{1, 2, 3}, Negate: true}},
						Verdict: redirect.TProxy{Port: 15006, Mark: 0x100, Mask: 0xff00}},
					{Matches: []redirect.Match{redirect.MatchIface{Name: "veth+", Negate: true}, redirect.MatchMark{Value: 1, Mask: 0xff}}, Verdict: redirect.SetMark{Mark: 5}},
					{Matches: []redirect.Match{redirect.MatchCTState{States: redirect.CTStateInvalid | redirect.CTStateNew, Negate: true}, redirect.MatchMark{Conn: true, Value: 7, Negate: true}}, Verdict: redirect.Accept{}},
					{Family: redirect.FamilyIPv6, Matches: []redirect.Match{redirect.MatchAddr{Source: true, Prefix: pfx("2001:db8::/32")}, redirect.MatchSet{Set: "v6", Kind: redirect.SetIPv6}}, Verdict: redirect.Drop{}},
					{Matches: []redirect.Match{udp, redirect.MatchPort{Ports: []uint16{53}}, redirect.MatchIface{Out: true, Name: "eth0"}}, Verdict: redirect.Jump{Chain: "SUB"}},
					{Family: redirect.FamilyIPv6, Matches: []redirect.Match{redirect.MatchSet{Set: "v6", Kind: redirect.SetIPv6, Negate: true}}, Verdict: redirect.RestoreMark{}},
					{Family: redirect.FamilyIPv4, Matches: []redirect.Match{redirect.MatchSet{Set: "v4", Kind: redirect.SetIPv4, Negate: true}}, Verdict: redirect.SaveMark{}},
				}},
				{Name: "SUB", Rules: []redirect.Rule{
					{Matches: []redirect.Match{tcp, redirect.MatchSet{Set: "ports", Kind: redirect.SetPort, Negate: true}, redirect.MatchPort{Ports: []uint16{1, 2}}}, Verdict: redirect.Return{}},
					{Family: redirect.FamilyIPv6, Matches: []redirect.Match{tcp}, Verdict: redirect.TProxy{Port: 15006, Mark: 1337, Mask: 0xffffffff}},
				}},
			}},
			{Name: redirect.TableNat, Chains: []redirect.Chain{
				{Name: "OUTPUT", Hook: redirect.HookOutput, Type: redirect.ChainTypeNat, Priority: redirect.PriorityNat, Rules: []redirect.Rule{
					{Family: redirect.FamilyIPv4, Matches: []redirect.Match{tcp, redirect.MatchOwner{ID: 1000}}, Verdict: redirect.Redirect{Port: 8080}},
				}},
				{Name: "EMPTY"},
			}},
			{Name: redirect.TableRaw, Chains: []redirect.Chain{
				{Name: "OUTPUT", Hook: redirect.HookOutput, Type: redirect.ChainTypeFilter, Priority: redirect.PriorityRaw, Rules: []redirect.Rule{
					{Matches: []redirect.Match{redirect.MatchOwner{GID: true, ID: 7, Negate: true}}, Verdict: redirect.SetCTZone{Zone: 3}},
				}},
			}},
		},
		LoopbackAddrs: []netip.Prefix{redirect.InboundPassthroughV6},
	}
}

func TestKernelVocabulary(t *testing.T) {
	nstest.NeedRoot(t)
	p := vocabularyPlan()
	if err := p.Verify(); err != nil {
		t.Fatalf("vocabulary plan: %v", err)
	}
	ctx := context.Background()
	ns := podNetns(t)
	b := New()
	if err := b.Apply(ctx, ns, p); err != nil {
		t.Fatal(err)
	}
	got, err := b.List(ctx, ns)
	if err != nil {
		t.Fatal(err)
	}
	if d := redirect.Diff(p, got); len(d) > 0 {
		t.Errorf("List differs:\n%s", strings.Join(d, "\n"))
	}
	listed := handleRE.ReplaceAllString(nstest.Run(t, ns, "", "nft", "list", "table", "inet", TableName), "")
	rendered, err := Render(p)
	if err != nil {
		t.Fatal(err)
	}
	if normalize(listed) != normalize(rendered) {
		t.Errorf("nft list differs from Render:\n--- nft list\n%s\n--- Render\n%s", listed, rendered)
	}
}
