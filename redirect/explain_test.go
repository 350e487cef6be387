package redirect

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
)

// dropRule returns p with the first rule of table/chain whose text contains
// part removed.
func dropRule(t *testing.T, p Plan, table TableName, chain, part string) Plan {
	t.Helper()
	out := Plan{Sets: p.Sets, Routes: p.Routes, LoopbackAddrs: p.LoopbackAddrs}
	done := false
	for _, tab := range p.Tables {
		nt := Table{Name: tab.Name}
		for _, c := range tab.Chains {
			nc := c
			nc.Rules = nil
			for _, r := range c.Rules {
				if !done && tab.Name == table && c.Name == chain && strings.Contains(r.String(), part) {
					done = true
					continue
				}
				nc.Rules = append(nc.Rules, r)
			}
			nt.Chains = append(nt.Chains, nc)
		}
		out.Tables = append(out.Tables, nt)
	}
	if !done {
		t.Fatalf("no rule %q in %s %s", part, table, chain)
	}
	return out
}

func TestExplainDrift(t *testing.T) {
	plan := tracePlan(t, func(s *Spec) {
		s.OutboundIPRangesExclude = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	})
	if got := ExplainDrift(&plan, &plan, nil); len(got) != 0 {
		t.Fatalf("no drift, yet effects: %v", got)
	}
	cases := []struct {
		name          string
		live          Plan
		planned, now  string
		why           string
		packetMatches func(Packet) bool
	}{
		{"capture jump missing", dropRule(t, plan, TableNat, ChainOutbound, "-> jump ISTIO_REDIRECT"), "redirect :15001", "accept",
			"missing rule in nat-istio-output: ipv4 -> jump nat-istio-redirect",
			func(p Packet) bool { return p.Dir == DirOut && p.UID == 1000 && p.Proto == ProtoTCP }},
		{"proxy bypass missing", dropRule(t, plan, TableNat, ChainOutbound, "ipv4 skuid 1337 -> return"), "accept", "redirect :15001",
			"missing rule in nat-istio-output: ipv4 skuid 1337 -> return",
			func(p Packet) bool { return p.Dir == DirOut && p.UID == 1337 }},
		{"exclusion missing", dropRule(t, plan, TableNat, ChainOutbound, "@outbound-exclude-v4"), "accept", "redirect :15001",
			"missing rule in nat-istio-output: ipv4 daddr @outbound-exclude-v4 -> return",
			func(p Packet) bool { return netip.MustParsePrefix("10.0.0.0/8").Contains(p.Dst.Addr()) }},
		{"inbound missing", dropRule(t, plan, TableNat, ChainPrerouting, "jump ISTIO_INBOUND"), "redirect :15006", "accept",
			"missing rule in nat-prerouting: ipv4 l4proto tcp -> jump nat-istio-inbound",
			func(p Packet) bool { return p.Dir == DirIn }},
	}
	dormant := plan.Clone()
	dormant.TableFlags = TableDormant
	dropping := plan.Clone()
	dropping.Table(TableNat).Chain(ChainOutput).Policy = PolicyDrop
	moved := plan.Clone()
	moved.Table(TableNat).Chain(ChainPrerouting).Hook = "input"
	cases = append(cases, []struct {
		name          string
		live          Plan
		planned, now  string
		why           string
		packetMatches func(Packet) bool
	}{
		{"table dormant", dormant, "redirect :15001", "accept", "the live table is dormant: none of its chains sees a packet",
			func(p Packet) bool { return p.Dir == DirOut && p.UID == 1000 && p.Proto == ProtoTCP }},
		{"policy drop", dropping, "accept", "drop",
			"live chain nat-output is type nat hook output priority -100 policy drop, planned type nat hook output priority -100 policy accept",
			func(p Packet) bool { return p.Dir == DirOut && p.UID == 1337 }},
		{"chain on another hook", moved, "redirect :15006", "accept",
			"live chain nat-prerouting is type nat hook input priority -100 policy accept, planned type nat hook prerouting priority -100 policy accept",
			func(p Packet) bool { return p.Dir == DirIn }},
	}...)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			effects := ExplainDrift(&plan, &c.live, nil)
			i := slices.IndexFunc(effects, func(e DriftEffect) bool {
				return e.Planned.String() == c.planned && e.Live.String() == c.now && e.Why == c.why && c.packetMatches(e.Packet)
			})
			if i < 0 {
				t.Fatalf("no effect planned %s / live %s / %q among:\n%v", c.planned, c.now, c.why, effects)
			}
			if !strings.Contains(effects[i].String(), c.why) {
				t.Errorf("String() = %q", effects[i])
			}
		})
	}
}
