package redirect

import (
	"fmt"
	"net/netip"
	"slices"
)

// builder accumulates rules with iptables' append/insert semantics.
type builder struct {
	ipv6   bool
	plan   Plan
	tables map[TableName]*Table
}

func newBuilder(ipv6 bool) *builder {
	return &builder{ipv6: ipv6, tables: map[TableName]*Table{}}
}

func (b *builder) chain(t TableName, name string) *Chain {
	tab := b.tables[t]
	if tab == nil {
		tab = &Table{Name: t}
		b.tables[t] = tab
	}
	if c := tab.Chain(name); c != nil {
		return c
	}
	c := Chain{Name: name}
	if bc, ok := BuiltinChain(t, name); ok {
		c = bc
	}
	tab.Chains = append(tab.Chains, c)
	return &tab.Chains[len(tab.Chains)-1]
}

func (b *builder) enabled(f Family) bool { return f != FamilyIPv6 || b.ipv6 }

func (b *builder) append(t TableName, chain string, f Family, v Verdict, ms ...Match) {
	if !b.enabled(f) {
		return
	}
	c := b.chain(t, chain)
	c.Rules = append(c.Rules, Rule{Family: f, Matches: ms, Verdict: v})
}

// insert places a rule at 1-based position pos as seen by each address
// family the rule applies to, like "iptables -I chain pos" run against both
// iptables and ip6tables.
func (b *builder) insert(t TableName, chain string, pos int, f Family, v Verdict, ms ...Match) {
	if !b.enabled(f) {
		return
	}
	c := b.chain(t, chain)
	idx := 0
	for _, g := range []Family{FamilyIPv4, FamilyIPv6} {
		if !f.Includes(g) || !b.enabled(g) {
			continue
		}
		seen, at := 0, len(c.Rules)
		for i, r := range c.Rules {
			if r.Family.Includes(g) {
				if seen == pos-1 {
					at = i
					break
				}
				seen++
			}
		}
		if seen < pos-1 {
			panic(fmt.Sprintf("redirect: insert at %d into %s/%s with %d rules", pos, t, chain, seen))
		}
		idx = max(idx, at)
	}
	c.Rules = slices.Insert(c.Rules, idx, Rule{Family: f, Matches: ms, Verdict: v})
}

func (b *builder) portSet(name string, ports []uint16) {
	if b.plan.Set(name) == nil {
		b.plan.Sets = append(b.plan.Sets, Set{Name: name, Kind: SetPort, Ports: dedup(ports)})
	}
}

func (b *builder) prefixSet(name string, kind SetKind, ps []netip.Prefix) {
	if b.plan.Set(name) == nil {
		b.plan.Sets = append(b.plan.Sets, Set{Name: name, Kind: kind, Prefixes: dedup(ps)})
	}
}

func (b *builder) finish() Plan {
	for _, name := range []TableName{TableMangle, TableNat, TableRaw} {
		tab := b.tables[name]
		if tab == nil {
			continue
		}
		out := Table{Name: name}
		// Base chains first (PREROUTING, OUTPUT), then regular chains in the
		// order they were first used; empty base chains are left out (each
		// costs a hook registration), empty regular chains too unless jumped to.
		targets := map[string]bool{}
		for _, c := range tab.Chains {
			for _, r := range c.Rules {
				if j, ok := r.Verdict.(Jump); ok {
					targets[j.Chain] = true
				}
			}
		}
		for _, base := range []string{ChainPrerouting, ChainOutput} {
			if c := tab.Chain(base); c != nil && len(c.Rules) > 0 {
				out.Chains = append(out.Chains, *c)
			}
		}
		for _, c := range tab.Chains {
			if !c.IsBase() && (len(c.Rules) > 0 || targets[c.Name]) {
				out.Chains = append(out.Chains, c)
			}
		}
		if !b.ipv6 {
			for ci := range out.Chains {
				for ri := range out.Chains[ci].Rules {
					if out.Chains[ci].Rules[ri].Family == FamilyAny {
						out.Chains[ci].Rules[ri].Family = FamilyIPv4
					}
				}
			}
		}
		if len(out.Chains) > 0 {
			b.plan.Tables = append(b.plan.Tables, out)
		}
	}
	return b.plan
}
