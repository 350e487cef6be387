package redirect

import (
	"net/netip"
	"slices"
)

// Build turns a validated Spec into the Plan that reproduces Istio's sidecar
// capture chains. It is pure: no I/O, no root, same Spec → same Plan.
//
// The rule order follows Istio's istio-iptables generator statement by
// statement (its "insert at position N" steps simulated per address family),
// so projecting the Plan onto IPv4 or IPv6 gives Istio's chains in Istio's
// order; where Istio emits one rule per list element, the Plan has a Set.
// The order of the steps below is the order of the rules in every chain.
func Build(s Spec) (Plan, error) {
	if err := s.Validate(); err != nil {
		return Plan{}, err
	}
	g := generator{builder: newBuilder(s.IPv6), s: s, tproxy: s.InterceptionMode == ModeTProxy,
		loop4: s.HostIPv4LoopbackCIDR, owners: s.owners()}
	g.excludeInterfaces()
	g.skipVirtualInterfacesInbound()
	g.dropInvalid()
	g.redirectChains()
	g.inbound()
	g.outboundEntry()
	g.proxyOwnTraffic()
	g.ownerGroups()
	g.dns()
	g.outboundExcludedRanges()
	g.outboundPorts()
	g.outboundIncludedRanges()
	g.tproxyMarks()
	g.tproxyRoutes()
	g.passthroughV6()
	return g.finish(), nil
}

// generator carries the Spec and what every step derives from it.
type generator struct {
	*builder
	s      Spec
	tproxy bool
	loop4  netip.Prefix // the IPv4 loopback range Istio treats as local
	owners []MatchOwner
}

// Matches every step uses, held as Match values so that passing one costs
// no allocation (a struct is copied into a new interface value each time).
var (
	tcp  Match = MatchProto{ProtoTCP}
	udp  Match = MatchProto{ProtoUDP}
	toLo Match = MatchIface{Out: true, Name: "lo"}
)

func dport(p ...uint16) MatchPort { return MatchPort{Ports: p} }

// excludeInterfaces: traffic in or out of an excluded interface bypasses
// capture entirely (and the TPROXY marks).
func (g *generator) excludeInterfaces() {
	for _, x := range g.s.ExcludeInterfaces {
		g.append(TableNat, ChainPrerouting, FamilyAny, Return{}, MatchIface{Name: x})
		g.append(TableNat, ChainOutput, FamilyAny, Return{}, MatchIface{Out: true, Name: x})
	}
	if g.tproxy {
		for _, x := range g.s.ExcludeInterfaces {
			g.append(TableMangle, ChainPrerouting, FamilyAny, Return{}, MatchIface{Name: x})
			g.append(TableMangle, ChainOutput, FamilyAny, Return{}, MatchIface{Out: true, Name: x})
		}
	}
}

// skipVirtualInterfacesInbound: what arrives on a virtual interface
// (KubeVirt and the like) is not captured as inbound; outboundIncludedRanges
// later inserts a jump to ISTIO_REDIRECT above this return.
func (g *generator) skipVirtualInterfacesInbound() {
	for _, k := range g.s.RerouteVirtualInterfaces {
		g.insert(TableNat, ChainPrerouting, 1, FamilyAny, Return{}, MatchIface{Name: k})
	}
}

// dropInvalid drops packets conntrack marks invalid before anything else
// sees them.
func (g *generator) dropInvalid() {
	if !g.s.DropInvalid {
		return
	}
	g.append(TableMangle, ChainPrerouting, FamilyAny, Jump{ChainDrop}, MatchCTState{States: CTStateInvalid})
	g.append(TableMangle, ChainDrop, FamilyAny, Drop{})
}

// redirectChains: the chains that hand TCP to the proxy's outbound and
// inbound ports, and the inbound tunnel port that is never captured.
func (g *generator) redirectChains() {
	if !g.s.NoReservedPorts {
		g.append(TableNat, ChainInbound, FamilyAny, Return{}, tcp, dport(InboundTunnelPort))
	}
	g.append(TableNat, ChainRedirect, FamilyAny, Redirect{g.s.OutboundPort()}, tcp)
	g.append(TableNat, ChainInRedirect, FamilyAny, Redirect{g.s.InboundPort()}, tcp)
}

// inbound captures TCP arriving for the pod's ports: with REDIRECT in nat,
// with TPROXY in mangle (marking the packets so policy routing delivers them
// locally).
func (g *generator) inbound() {
	s := g.s
	if s.InboundPorts.None() {
		return
	}
	inTable := TableNat
	if g.tproxy {
		inTable = TableMangle
		g.append(TableMangle, ChainDivert, FamilyAny, SetMark{TProxyMark})
		g.append(TableMangle, ChainDivert, FamilyAny, Accept{})
		// With no transparent socket on the proxy port (the proxy not
		// listening yet, or gone), iptables' TPROXY target drops the
		// packet, but nft's tproxy statement only ends its rule and the
		// packet would reach the app uncaptured. The drop after each
		// TProxy gives both backends iptables' behaviour: inbound waits
		// for the proxy (clients retry), it never bypasses it.
		g.append(TableMangle, ChainTProxy, FamilyIPv4, TProxy{Port: s.InboundPort(), Mark: TProxyMark, Mask: 0xffffffff},
			MatchAddr{Prefix: g.loop4, Negate: true}, tcp)
		g.append(TableMangle, ChainTProxy, FamilyIPv4, Drop{}, MatchAddr{Prefix: g.loop4, Negate: true}, tcp)
		g.append(TableMangle, ChainTProxy, FamilyIPv6, TProxy{Port: s.InboundPort(), Mark: TProxyMark, Mask: 0xffffffff},
			MatchAddr{Prefix: loopbackV6, Negate: true}, tcp)
		g.append(TableMangle, ChainTProxy, FamilyIPv6, Drop{}, MatchAddr{Prefix: loopbackV6, Negate: true}, tcp)
	}
	g.append(inTable, ChainPrerouting, FamilyAny, Jump{ChainInbound}, tcp)
	g.inboundSourcesExcluded(inTable)
	established := MatchCTState{States: CTStateRelated | CTStateEstablished}
	if s.InboundPorts.All {
		excl := s.InboundPortsExclude
		if !s.NoReservedPorts {
			excl = slices.Concat(excl, alwaysExcludedInbound)
		}
		if excl = dedup(excl); len(excl) > 0 {
			g.portSet(setInboundExclude, excl)
			g.append(inTable, ChainInbound, FamilyAny, Return{}, tcp, MatchSet{Set: setInboundExclude, Kind: SetPort})
		}
		if g.tproxy {
			g.append(TableMangle, ChainInbound, FamilyAny, Jump{ChainDivert}, tcp, established)
			g.append(TableMangle, ChainInbound, FamilyAny, Jump{ChainTProxy}, tcp)
		} else {
			g.append(TableNat, ChainInbound, FamilyAny, Jump{ChainInRedirect}, tcp)
		}
		return
	}
	g.portSet(setInboundPorts, s.InboundPorts.Ports)
	in := MatchSet{Set: setInboundPorts, Kind: SetPort}
	if g.tproxy {
		g.append(TableMangle, ChainInbound, FamilyAny, Jump{ChainDivert}, tcp, in, established)
		g.append(TableMangle, ChainInbound, FamilyAny, Jump{ChainTProxy}, tcp, in)
	} else {
		g.append(TableNat, ChainInbound, FamilyAny, Jump{ChainInRedirect}, tcp, in)
	}
}

// inboundSourcesExcluded lets inbound connections from the excluded sources
// through uncaptured, one rule per source (its family's).
func (g *generator) inboundSourcesExcluded(table TableName) {
	for _, p := range dedup(g.s.InboundSourcesExclude) {
		fam := FamilyIPv4
		if p.Addr().Is6() {
			if !g.s.IPv6 {
				continue
			}
			fam = FamilyIPv6
		}
		g.append(table, ChainInbound, fam, Return{}, tcp, MatchAddr{Source: true, Prefix: p.Masked()})
	}
}

// outboundEntry sends locally generated traffic to ISTIO_OUTPUT, whose first
// rules let excluded ports and the proxy's passthrough source (127.0.0.6,
// ::6 on lo) go out untouched.
func (g *generator) outboundEntry() {
	g.append(TableNat, ChainOutput, FamilyAny, Jump{ChainOutbound})
	if len(g.s.OutboundPortsExclude) > 0 {
		g.portSet(setOutboundExclude, g.s.OutboundPortsExclude)
		ex := MatchSet{Set: setOutboundExclude, Kind: SetPort}
		g.append(TableNat, ChainOutbound, FamilyAny, Return{}, tcp, ex)
		g.append(TableNat, ChainOutbound, FamilyAny, Return{}, udp, ex)
	}
	if g.s.LoopbackUncaptured {
		return
	}
	g.append(TableNat, ChainOutbound, FamilyIPv4, Return{}, toLo, MatchAddr{Source: true, Prefix: InboundPassthroughV4})
	g.append(TableNat, ChainOutbound, FamilyIPv6, Return{}, toLo, MatchAddr{Source: true, Prefix: InboundPassthroughV6})
}

// proxyOwnTraffic, per proxy UID and GID: the proxy calling its own pod's IP,
// or a VIP that resolves back to it, over lo goes through inbound capture
// (app → Envoy → Envoy → app); app-to-app traffic over lo is left alone
// unless loopback ranges are explicitly included; the proxy's other
// traffic, any protocol, goes straight out.
func (g *generator) proxyOwnTraffic() {
	s := g.s
	if s.LoopbackUncaptured {
		// The proxy's traffic, then anything over lo, goes straight out.
		for _, owner := range g.owners {
			g.append(TableNat, ChainOutbound, FamilyAny, Return{}, owner)
		}
		g.append(TableNat, ChainOutbound, FamilyAny, Return{}, toLo)
		return
	}
	includesLoopback := slices.ContainsFunc(s.OutboundIPRanges.Prefixes, func(p netip.Prefix) bool { return p.Addr().IsLoopback() })
	for _, owner := range g.owners {
		notTunnel := MatchPort{Ports: []uint16{InboundTunnelPort}, Negate: true}
		if s.CaptureDNS && !owner.GID {
			notTunnel = MatchPort{Ports: []uint16{DNSPort, InboundTunnelPort}, Negate: true}
		}
		g.append(TableNat, ChainOutbound, FamilyIPv4, Jump{ChainInRedirect},
			toLo, MatchAddr{Prefix: g.loop4, Negate: true}, tcp, notTunnel, owner)
		g.append(TableNat, ChainOutbound, FamilyIPv6, Jump{ChainInRedirect},
			toLo, MatchAddr{Prefix: loopbackV6, Negate: true}, tcp, notTunnel, owner)
		if !includesLoopback {
			notOwner := owner
			notOwner.Negate = true
			if s.CaptureDNS {
				g.append(TableNat, ChainOutbound, FamilyAny, Return{}, toLo, tcp, MatchPort{Ports: []uint16{DNSPort}, Negate: true}, notOwner)
			} else {
				g.append(TableNat, ChainOutbound, FamilyAny, Return{}, toLo, notOwner)
			}
		}
		g.append(TableNat, ChainOutbound, FamilyAny, Return{}, owner)
	}
}

// ownerGroups filters which senders' traffic is captured at all: the
// excluded groups go out directly, or only the included groups are captured.
func (g *generator) ownerGroups() {
	s := g.s
	if len(s.OwnerGroupsExclude) > 0 {
		for _, gid := range s.OwnerGroupsExclude {
			g.append(TableNat, ChainOutbound, FamilyAny, Return{}, MatchOwner{GID: true, ID: gid})
		}
		return
	}
	if len(s.OwnerGroupsInclude) > 0 {
		var ms []Match
		for _, gid := range s.OwnerGroupsInclude {
			ms = append(ms, MatchOwner{GID: true, ID: gid, Negate: true})
		}
		g.append(TableNat, ChainOutbound, FamilyAny, Return{}, ms...)
	}
}

// dns sends the app's DNS (TCP and UDP port 53) to the proxy's DNS port.
func (g *generator) dns() {
	if !g.s.CaptureDNS {
		return
	}
	g.append(TableRaw, ChainOutput, FamilyAny, Jump{ChainOutputDNS})
	g.append(TableNat, ChainOutbound, FamilyIPv4, Jump{ChainOutputDNS})
	g.append(TableNat, ChainOutbound, FamilyIPv6, Jump{ChainOutputDNS})
	g.append(TableNat, ChainOutputDNS, FamilyAny, Redirect{DNSProxyPort}, tcp, dport(DNSPort))
	g.append(TableNat, ChainOutputDNS, FamilyAny, Redirect{DNSProxyPort}, udp, dport(DNSPort))
	// Conntrack zones keep the proxy's upstream queries (zone 1) apart from
	// the app's queries to the proxy (zone 2): the same 5-tuple would
	// otherwise collide after the DNAT.
	for _, owner := range g.owners {
		g.append(TableRaw, ChainOutputDNS, FamilyAny, SetCTZone{1}, udp, dport(DNSPort), owner)
		g.append(TableRaw, ChainOutputDNS, FamilyAny, SetCTZone{2}, udp, MatchPort{Source: true, Ports: []uint16{DNSProxyPort}}, owner)
	}
	g.append(TableRaw, ChainPrerouting, FamilyAny, Jump{ChainInbound})
	g.append(TableRaw, ChainOutputDNS, FamilyAny, SetCTZone{2}, udp, dport(DNSPort))
	g.append(TableRaw, ChainInbound, FamilyAny, SetCTZone{1}, udp, MatchPort{Source: true, Ports: []uint16{DNSPort}})
}

// outboundExcludedRanges lets loopback destinations and the excluded CIDRs
// go out uncaptured.
func (g *generator) outboundExcludedRanges() {
	v4Excl, v6Excl := splitFamilies(g.s.OutboundIPRangesExclude)
	g.append(TableNat, ChainOutbound, FamilyIPv4, Return{}, MatchAddr{Prefix: g.loop4})
	g.append(TableNat, ChainOutbound, FamilyIPv6, Return{}, MatchAddr{Prefix: loopbackV6})
	if len(v4Excl) > 0 {
		g.prefixSet(setExcludeV4, SetIPv4, v4Excl)
		g.append(TableNat, ChainOutbound, FamilyIPv4, Return{}, MatchSet{Set: setExcludeV4, Kind: SetIPv4})
	}
	if len(v6Excl) > 0 && g.s.IPv6 {
		g.prefixSet(setExcludeV6, SetIPv6, v6Excl)
		g.append(TableNat, ChainOutbound, FamilyIPv6, Return{}, MatchSet{Set: setExcludeV6, Kind: SetIPv6})
	}
}

// outboundPorts captures TCP to the listed outbound ports whatever the
// destination range.
func (g *generator) outboundPorts() {
	if len(g.s.OutboundPorts) == 0 {
		return
	}
	g.portSet(setOutboundPorts, g.s.OutboundPorts)
	g.append(TableNat, ChainOutbound, FamilyAny, Jump{ChainRedirect}, tcp, MatchSet{Set: setOutboundPorts, Kind: SetPort})
}

// outboundIncludedRanges captures what is left toward the included ranges
// (everything with "*"), per family, and sends traffic arriving on a
// virtual interface toward them through the same capture.
func (g *generator) outboundIncludedRanges() {
	s := g.s
	v4Incl, v6Incl := splitFamilies(s.OutboundIPRanges.Prefixes)
	for _, fam := range []struct {
		f     Family
		set   string
		kind  SetKind
		cidrs []netip.Prefix
	}{{FamilyIPv4, setIncludeV4, SetIPv4, v4Incl}, {FamilyIPv6, setIncludeV6, SetIPv6, v6Incl}} {
		switch {
		case s.OutboundIPRanges.All:
			g.append(TableNat, ChainOutbound, fam.f, Jump{ChainRedirect})
			for _, k := range s.RerouteVirtualInterfaces {
				g.insert(TableNat, ChainPrerouting, 1, fam.f, Jump{ChainRedirect}, MatchIface{Name: k})
			}
		case len(fam.cidrs) > 0:
			if fam.f == FamilyIPv6 && !s.IPv6 {
				continue
			}
			g.prefixSet(fam.set, fam.kind, fam.cidrs)
			in := MatchSet{Set: fam.set, Kind: fam.kind}
			for _, k := range s.RerouteVirtualInterfaces {
				g.insert(TableNat, ChainPrerouting, 1, fam.f, Jump{ChainRedirect}, MatchIface{Name: k}, in)
			}
			g.append(TableNat, ChainOutbound, fam.f, Jump{ChainRedirect}, in)
		}
	}
}

// tproxyMarks (TPROXY mode): the marks that route replies of intercepted
// connections back through lo, and the returns that keep the proxy's own
// and already-marked traffic out of ISTIO_INBOUND.
func (g *generator) tproxyMarks() {
	if !g.tproxy {
		return
	}
	// Keep the mark Envoy's original_src filter set on the connection so
	// replies route back through lo (table 133).
	g.append(TableMangle, ChainPrerouting, FamilyAny, SaveMark{}, tcp, MatchMark{Value: TProxyMark})
	g.append(TableMangle, ChainOutput, FamilyAny, Return{}, tcp, toLo, MatchMark{Value: TProxyMark})
	for _, owner := range g.owners {
		g.append(TableMangle, ChainOutput, FamilyIPv4, SetMark{OutboundMark},
			MatchAddr{Prefix: g.loop4, Negate: true}, tcp, toLo, owner)
		g.append(TableMangle, ChainOutput, FamilyIPv6, SetMark{OutboundMark},
			MatchAddr{Prefix: loopbackV6, Negate: true}, tcp, toLo, owner)
	}
	g.append(TableMangle, ChainOutput, FamilyAny, RestoreMark{}, tcp, MatchMark{Conn: true, Value: TProxyMark})
	g.insert(TableMangle, ChainInbound, 1, FamilyAny, Return{}, tcp, MatchMark{Value: TProxyMark})
	g.insert(TableMangle, ChainInbound, 2, FamilyIPv4, Return{}, tcp, MatchAddr{Source: true, Prefix: InboundPassthroughV4}, MatchIface{Name: "lo"})
	g.insert(TableMangle, ChainInbound, 2, FamilyIPv6, Return{}, tcp, MatchAddr{Source: true, Prefix: InboundPassthroughV6}, MatchIface{Name: "lo"})
	g.insert(TableMangle, ChainInbound, 3, FamilyAny, Return{}, tcp, MatchIface{Name: "lo"}, MatchMark{Value: OutboundMark, Negate: true})
}

// tproxyRoutes (TPROXY mode with inbound capture): the policy route that
// delivers marked packets locally, per captured family.
func (g *generator) tproxyRoutes() {
	if !g.tproxy || g.s.InboundPorts.None() {
		return
	}
	g.plan.Routes = append(g.plan.Routes, PolicyRoute{Family: FamilyIPv4, Mark: TProxyMark, Table: TProxyRouteTab})
	if g.s.IPv6 {
		g.plan.Routes = append(g.plan.Routes, PolicyRoute{Family: FamilyIPv6, Mark: TProxyMark, Table: TProxyRouteTab})
	}
}

// passthroughV6: with IPv6 captured, ::6 goes on lo, the source the proxy
// uses to reach the app without being captured again (IPv4's 127.0.0.6 is
// on lo already).
func (g *generator) passthroughV6() {
	if g.s.IPv6 && !g.s.LoopbackUncaptured {
		g.plan.LoopbackAddrs = []netip.Prefix{InboundPassthroughV6}
	}
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
