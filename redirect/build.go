package redirect

import (
	"fmt"
	"net/netip"
)

// Istio's chain names. Base chains use iptables' builtin names.
const (
	ChainPrerouting    = "PREROUTING"
	ChainOutput        = "OUTPUT"
	ChainInbound       = "ISTIO_INBOUND"
	ChainRedirect      = "ISTIO_REDIRECT"
	ChainInRedirect    = "ISTIO_IN_REDIRECT"
	ChainOutbound      = "ISTIO_OUTPUT"
	ChainOutputDNS     = "ISTIO_OUTPUT_DNS"
	ChainDivert        = "ISTIO_DIVERT"
	ChainTProxy        = "ISTIO_TPROXY"
	ChainDrop          = "ISTIO_DROP"
	setInboundPorts    = "inbound-ports"
	setInboundExclude  = "inbound-exclude-ports"
	setOutboundPorts   = "outbound-ports"
	setOutboundExclude = "outbound-exclude-ports"
	setExcludeV4       = "outbound-exclude-v4"
	setExcludeV6       = "outbound-exclude-v6"
	setIncludeV4       = "outbound-include-v4"
	setIncludeV6       = "outbound-include-v6"
)

// Build turns a validated Spec into the Plan that reproduces Istio's sidecar
// capture chains. It is pure: no I/O, no root, same Spec → same Plan.
//
// The rule order follows Istio's istio-iptables generator statement by
// statement (including its "insert at position N" steps, which are simulated
// per address family), so projecting the Plan onto IPv4 or IPv6 gives Istio's
// iptables chains in Istio's order. Where Istio emits one rule per list
// element, the Plan matches a named Set instead.
func Build(s Spec) (Plan, error) {
	if err := s.Validate(); err != nil {
		return Plan{}, err
	}
	b := newBuilder(s.IPv6)
	tproxy := s.InterceptionMode == ModeTProxy

	v4Excl, v6Excl := splitFamilies(s.OutboundIPRangesExclude)
	v4Incl, v6Incl := splitFamilies(s.OutboundIPRanges.Prefixes)
	includesLoopback := false
	for _, p := range s.OutboundIPRanges.Prefixes {
		if p.Addr().IsLoopback() {
			includesLoopback = true
		}
	}
	loop4 := s.HostIPv4LoopbackCIDR
	tcp := MatchProto{ProtoTCP}
	udp := MatchProto{ProtoUDP}
	dport := func(p ...uint16) MatchPort { return MatchPort{Ports: p} }

	// Interfaces that bypass capture entirely.
	for _, x := range s.ExcludeInterfaces {
		b.append(TableNat, ChainPrerouting, FamilyAny, Return{}, MatchIface{Name: x})
		b.append(TableNat, ChainOutput, FamilyAny, Return{}, MatchIface{Out: true, Name: x})
	}
	if tproxy {
		for _, x := range s.ExcludeInterfaces {
			b.append(TableMangle, ChainPrerouting, FamilyAny, Return{}, MatchIface{Name: x})
			b.append(TableMangle, ChainOutput, FamilyAny, Return{}, MatchIface{Out: true, Name: x})
		}
	}
	// Virtual interfaces (KubeVirt and the like): inbound on them is not
	// captured as inbound; a jump to ISTIO_REDIRECT is inserted above later.
	for _, k := range s.RerouteVirtualInterfaces {
		b.insert(TableNat, ChainPrerouting, 1, FamilyAny, Return{}, MatchIface{Name: k})
	}
	if s.DropInvalid {
		b.append(TableMangle, ChainPrerouting, FamilyAny, Jump{ChainDrop}, MatchCTState{States: CTStateInvalid})
		b.append(TableMangle, ChainDrop, FamilyAny, Drop{})
	}

	b.append(TableNat, ChainInbound, FamilyAny, Return{}, tcp, dport(InboundTunnelPort))
	b.append(TableNat, ChainRedirect, FamilyAny, Redirect{ProxyOutboundPort}, tcp)
	b.append(TableNat, ChainInRedirect, FamilyAny, Redirect{ProxyInboundPort}, tcp)

	// Inbound.
	if !s.InboundPorts.None() {
		inTable := TableNat
		if tproxy {
			inTable = TableMangle
			b.append(TableMangle, ChainDivert, FamilyAny, SetMark{TProxyMark})
			b.append(TableMangle, ChainDivert, FamilyAny, Accept{})
			// With no transparent socket on the proxy port (the proxy not
			// listening yet, or gone), iptables' TPROXY target drops the
			// packet, but nft's tproxy statement only ends its rule and the
			// packet would reach the app uncaptured. The drop after each
			// TProxy gives both backends iptables' behaviour: inbound waits
			// for the proxy (clients retry), it never bypasses it.
			b.append(TableMangle, ChainTProxy, FamilyIPv4, TProxy{Port: ProxyInboundPort, Mark: TProxyMark, Mask: 0xffffffff},
				MatchAddr{Prefix: loop4, Negate: true}, tcp)
			b.append(TableMangle, ChainTProxy, FamilyIPv4, Drop{}, MatchAddr{Prefix: loop4, Negate: true}, tcp)
			b.append(TableMangle, ChainTProxy, FamilyIPv6, TProxy{Port: ProxyInboundPort, Mark: TProxyMark, Mask: 0xffffffff},
				MatchAddr{Prefix: loopbackV6, Negate: true}, tcp)
			b.append(TableMangle, ChainTProxy, FamilyIPv6, Drop{}, MatchAddr{Prefix: loopbackV6, Negate: true}, tcp)
		}
		b.append(inTable, ChainPrerouting, FamilyAny, Jump{ChainInbound}, tcp)
		established := MatchCTState{States: CTStateRelated | CTStateEstablished}
		if s.InboundPorts.All {
			excl := dedup(append(append([]uint16{}, s.InboundPortsExclude...), alwaysExcludedInbound...))
			b.portSet(setInboundExclude, excl)
			b.append(inTable, ChainInbound, FamilyAny, Return{}, tcp, MatchSet{Set: setInboundExclude, Kind: SetPort})
			if tproxy {
				b.append(TableMangle, ChainInbound, FamilyAny, Jump{ChainDivert}, tcp, established)
				b.append(TableMangle, ChainInbound, FamilyAny, Jump{ChainTProxy}, tcp)
			} else {
				b.append(TableNat, ChainInbound, FamilyAny, Jump{ChainInRedirect}, tcp)
			}
		} else {
			b.portSet(setInboundPorts, s.InboundPorts.Ports)
			in := MatchSet{Set: setInboundPorts, Kind: SetPort}
			if tproxy {
				b.append(TableMangle, ChainInbound, FamilyAny, Jump{ChainDivert}, tcp, in, established)
				b.append(TableMangle, ChainInbound, FamilyAny, Jump{ChainTProxy}, tcp, in)
			} else {
				b.append(TableNat, ChainInbound, FamilyAny, Jump{ChainInRedirect}, tcp, in)
			}
		}
	}

	// Outbound.
	b.append(TableNat, ChainOutput, FamilyAny, Jump{ChainOutbound})
	if len(s.OutboundPortsExclude) > 0 {
		b.portSet(setOutboundExclude, s.OutboundPortsExclude)
		ex := MatchSet{Set: setOutboundExclude, Kind: SetPort}
		b.append(TableNat, ChainOutbound, FamilyAny, Return{}, tcp, ex)
		b.append(TableNat, ChainOutbound, FamilyAny, Return{}, udp, ex)
	}
	lo := MatchIface{Out: true, Name: "lo"}
	b.append(TableNat, ChainOutbound, FamilyIPv4, Return{}, lo, MatchAddr{Source: true, Prefix: InboundPassthroughV4})
	b.append(TableNat, ChainOutbound, FamilyIPv6, Return{}, lo, MatchAddr{Source: true, Prefix: InboundPassthroughV6})

	for _, owner := range s.owners() {
		// The proxy calling its own pod's IP or a VIP that resolves back to it
		// over lo goes through inbound capture (app → Envoy → Envoy → app).
		notTunnel := MatchPort{Ports: []uint16{InboundTunnelPort}, Negate: true}
		if s.CaptureDNS && !owner.GID {
			notTunnel = MatchPort{Ports: []uint16{DNSPort, InboundTunnelPort}, Negate: true}
		}
		b.append(TableNat, ChainOutbound, FamilyIPv4, Jump{ChainInRedirect},
			lo, MatchAddr{Prefix: loop4, Negate: true}, tcp, notTunnel, owner)
		b.append(TableNat, ChainOutbound, FamilyIPv6, Jump{ChainInRedirect},
			lo, MatchAddr{Prefix: loopbackV6, Negate: true}, tcp, notTunnel, owner)
		// App to app over lo is not captured, unless loopback ranges are
		// explicitly included.
		if !includesLoopback {
			notOwner := owner
			notOwner.Negate = true
			if s.CaptureDNS {
				b.append(TableNat, ChainOutbound, FamilyAny, Return{}, lo, tcp, MatchPort{Ports: []uint16{DNSPort}, Negate: true}, notOwner)
			} else {
				b.append(TableNat, ChainOutbound, FamilyAny, Return{}, lo, notOwner)
			}
		}
		// The proxy's own traffic, any protocol, goes straight out.
		b.append(TableNat, ChainOutbound, FamilyAny, Return{}, owner)
	}

	// Owner-group filter (which senders' traffic is captured at all).
	if len(s.OwnerGroupsExclude) > 0 {
		for _, g := range s.OwnerGroupsExclude {
			b.append(TableNat, ChainOutbound, FamilyAny, Return{}, MatchOwner{GID: true, ID: g})
		}
	} else if len(s.OwnerGroupsInclude) > 0 {
		var ms []Match
		for _, g := range s.OwnerGroupsInclude {
			ms = append(ms, MatchOwner{GID: true, ID: g, Negate: true})
		}
		b.append(TableNat, ChainOutbound, FamilyAny, Return{}, ms...)
	}

	if s.CaptureDNS {
		b.append(TableRaw, ChainOutput, FamilyAny, Jump{ChainOutputDNS})
		b.append(TableNat, ChainOutbound, FamilyIPv4, Jump{ChainOutputDNS})
		b.append(TableNat, ChainOutbound, FamilyIPv6, Jump{ChainOutputDNS})
		b.append(TableNat, ChainOutputDNS, FamilyAny, Redirect{DNSProxyPort}, tcp, dport(DNSPort))
		b.append(TableNat, ChainOutputDNS, FamilyAny, Redirect{DNSProxyPort}, udp, dport(DNSPort))
		// Conntrack zones keep the proxy's upstream queries (zone 1) apart from
		// the app's queries to the proxy (zone 2): the same 5-tuple would
		// otherwise collide after the DNAT.
		for _, owner := range s.owners() {
			b.append(TableRaw, ChainOutputDNS, FamilyAny, SetCTZone{1}, udp, dport(DNSPort), owner)
			b.append(TableRaw, ChainOutputDNS, FamilyAny, SetCTZone{2}, udp, MatchPort{Source: true, Ports: []uint16{DNSProxyPort}}, owner)
		}
		b.append(TableRaw, ChainPrerouting, FamilyAny, Jump{ChainInbound})
		b.append(TableRaw, ChainOutputDNS, FamilyAny, SetCTZone{2}, udp, dport(DNSPort))
		b.append(TableRaw, ChainInbound, FamilyAny, SetCTZone{1}, udp, MatchPort{Source: true, Ports: []uint16{DNSPort}})
	}

	b.append(TableNat, ChainOutbound, FamilyIPv4, Return{}, MatchAddr{Prefix: loop4})
	b.append(TableNat, ChainOutbound, FamilyIPv6, Return{}, MatchAddr{Prefix: loopbackV6})
	if len(v4Excl) > 0 {
		b.prefixSet(setExcludeV4, SetIPv4, v4Excl)
		b.append(TableNat, ChainOutbound, FamilyIPv4, Return{}, MatchSet{Set: setExcludeV4, Kind: SetIPv4})
	}
	if len(v6Excl) > 0 && s.IPv6 {
		b.prefixSet(setExcludeV6, SetIPv6, v6Excl)
		b.append(TableNat, ChainOutbound, FamilyIPv6, Return{}, MatchSet{Set: setExcludeV6, Kind: SetIPv6})
	}
	if len(s.OutboundPorts) > 0 {
		b.portSet(setOutboundPorts, s.OutboundPorts)
		b.append(TableNat, ChainOutbound, FamilyAny, Jump{ChainRedirect}, tcp, MatchSet{Set: setOutboundPorts, Kind: SetPort})
	}
	for _, fam := range []struct {
		f     Family
		set   string
		kind  SetKind
		cidrs []netip.Prefix
	}{{FamilyIPv4, setIncludeV4, SetIPv4, v4Incl}, {FamilyIPv6, setIncludeV6, SetIPv6, v6Incl}} {
		switch {
		case s.OutboundIPRanges.All:
			b.append(TableNat, ChainOutbound, fam.f, Jump{ChainRedirect})
			for _, k := range s.RerouteVirtualInterfaces {
				b.insert(TableNat, ChainPrerouting, 1, fam.f, Jump{ChainRedirect}, MatchIface{Name: k})
			}
		case len(fam.cidrs) > 0:
			if fam.f == FamilyIPv6 && !s.IPv6 {
				continue
			}
			b.prefixSet(fam.set, fam.kind, fam.cidrs)
			in := MatchSet{Set: fam.set, Kind: fam.kind}
			for _, k := range s.RerouteVirtualInterfaces {
				b.insert(TableNat, ChainPrerouting, 1, fam.f, Jump{ChainRedirect}, MatchIface{Name: k}, in)
			}
			b.append(TableNat, ChainOutbound, fam.f, Jump{ChainRedirect}, in)
		}
	}

	if tproxy {
		// Keep the mark Envoy's original_src filter set on the connection so
		// replies route back through lo (table 133).
		b.append(TableMangle, ChainPrerouting, FamilyAny, SaveMark{}, tcp, MatchMark{Value: TProxyMark})
		b.append(TableMangle, ChainOutput, FamilyAny, Return{}, tcp, MatchIface{Out: true, Name: "lo"}, MatchMark{Value: TProxyMark})
		for _, owner := range s.owners() {
			b.append(TableMangle, ChainOutput, FamilyIPv4, SetMark{OutboundMark},
				MatchAddr{Prefix: loop4, Negate: true}, tcp, MatchIface{Out: true, Name: "lo"}, owner)
			b.append(TableMangle, ChainOutput, FamilyIPv6, SetMark{OutboundMark},
				MatchAddr{Prefix: loopbackV6, Negate: true}, tcp, MatchIface{Out: true, Name: "lo"}, owner)
		}
		b.append(TableMangle, ChainOutput, FamilyAny, RestoreMark{}, tcp, MatchMark{Conn: true, Value: TProxyMark})
		b.insert(TableMangle, ChainInbound, 1, FamilyAny, Return{}, tcp, MatchMark{Value: TProxyMark})
		b.insert(TableMangle, ChainInbound, 2, FamilyIPv4, Return{}, tcp, MatchAddr{Source: true, Prefix: InboundPassthroughV4}, MatchIface{Name: "lo"})
		b.insert(TableMangle, ChainInbound, 2, FamilyIPv6, Return{}, tcp, MatchAddr{Source: true, Prefix: InboundPassthroughV6}, MatchIface{Name: "lo"})
		b.insert(TableMangle, ChainInbound, 3, FamilyAny, Return{}, tcp, MatchIface{Name: "lo"}, MatchMark{Value: OutboundMark, Negate: true})

		if !s.InboundPorts.None() {
			b.plan.Routes = append(b.plan.Routes, PolicyRoute{Family: FamilyIPv4, Mark: TProxyMark, Table: TProxyRouteTab})
			if s.IPv6 {
				b.plan.Routes = append(b.plan.Routes, PolicyRoute{Family: FamilyIPv6, Mark: TProxyMark, Table: TProxyRouteTab})
			}
		}
	}
	if s.IPv6 {
		b.plan.LoopbackAddrs = []netip.Prefix{InboundPassthroughV6}
	}
	return b.finish()
}

// owners returns one owner match per proxy UID, then per proxy GID.
func (s Spec) owners() []MatchOwner {
	var out []MatchOwner
	for _, u := range dedup(s.ProxyUIDs) {
		out = append(out, MatchOwner{ID: u})
	}
	for _, g := range dedup(s.ProxyGIDs) {
		out = append(out, MatchOwner{GID: true, ID: g})
	}
	return out
}

func splitFamilies(ps []netip.Prefix) (v4, v6 []netip.Prefix) {
	for _, p := range ps {
		if p.Addr().Is4() {
			v4 = append(v4, p)
		} else {
			v6 = append(v6, p)
		}
	}
	return v4, v6
}

// builder accumulates rules with iptables' append/insert semantics.
type builder struct {
	ipv6   bool
	plan   Plan
	tables map[TableName]*Table
	order  map[TableName][]string
}

func newBuilder(ipv6 bool) *builder {
	return &builder{ipv6: ipv6, tables: map[TableName]*Table{}, order: map[TableName][]string{}}
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
	if name == ChainPrerouting || name == ChainOutput {
		c.Hook = HookPrerouting
		if name == ChainOutput {
			c.Hook = HookOutput
		}
		switch t {
		case TableNat:
			c.Type, c.Priority = ChainTypeNat, PriorityNat
		case TableMangle:
			c.Type, c.Priority = ChainTypeFilter, PriorityMangle
			if name == ChainOutput {
				c.Type = ChainTypeRoute
			}
		case TableRaw:
			c.Type, c.Priority = ChainTypeFilter, PriorityRaw
		}
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
	r := Rule{Family: f, Matches: ms, Verdict: v}
	c.Rules = append(c.Rules[:idx], append([]Rule{r}, c.Rules[idx:]...)...)
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

func (b *builder) finish() (Plan, error) {
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
	return b.plan, nil
}
