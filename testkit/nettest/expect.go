package nettest

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/nftmesh/nftmesh/netlab"
	"github.com/nftmesh/nftmesh/redirect"
	"github.com/nftmesh/nftmesh/testkit/scenarios"
)

// ProbeCase is one probe and where Istio's semantics say it must land.
type ProbeCase struct {
	Name  string
	Probe netlab.Probe
	// WantLanded is a listener name, LandedRefused or LandedTimeout.
	WantLanded string
	// WantOrig is the original destination the listener must report; the
	// zero value when nothing is expected to answer.
	WantOrig netip.AddrPort
	// Why names the rule of Istio's chains (as istio-iptables writes them) that
	// decides the landing.
	Why string
}

// ExpectedProbes returns the probes for a scenario with their expected
// landings, for a topology built with TopologyOptionsFor(spec).
func ExpectedProbes(sc scenarios.Scenario, topo *netlab.Topology) ([]ProbeCase, error) {
	s, err := sc.Spec()
	if err != nil {
		return nil, err
	}
	return ExpectedProbesFor(&s, topo), nil
}

// ExpectedProbesFor is ExpectedProbes for a Spec; s == nil means no capture
// rules at all (every probe reaches its real destination).
//
// The expectations come from a model of the chains Istio's istio-iptables
// writes, walked packet by packet (nat OUTPUT/ISTIO_OUTPUT for local
// senders, nat PREROUTING/ISTIO_INBOUND or the TPROXY mangle chains for what
// arrives), not from redirect.Build or any backend: it is the independent
// oracle the backends are held to.
func ExpectedProbesFor(s *redirect.Spec, topo *netlab.Topology) []ProbeCase {
	o := oracle{s: s, t: topo}
	var out []ProbeCase
	for _, np := range o.probes() {
		landed, why := o.expect(np.p)
		c := ProbeCase{Name: np.name, Probe: np.p, WantLanded: landed, Why: why}
		if landed != netlab.LandedRefused && landed != netlab.LandedTimeout {
			c.WantOrig = np.p.Dst
		}
		out = append(out, c)
	}
	return out
}

type namedProbe struct {
	name string
	p    netlab.Probe
}

type oracle struct {
	s *redirect.Spec // nil: no rules
	t *netlab.Topology
}

func (o oracle) proxyIDs() (uid, gid uint32) {
	uid, gid = redirect.DefaultProxyID, redirect.DefaultProxyID
	if o.s != nil && len(o.s.ProxyUIDs) > 0 {
		uid = o.s.ProxyUIDs[0]
	}
	if o.s != nil && len(o.s.ProxyGIDs) > 0 {
		gid = o.s.ProxyGIDs[0]
	}
	return uid, gid
}

// probes lists what every scenario is probed with. Most probes are sent in
// every scenario: a probe whose landing a scenario does not change still
// proves the scenario did not break it.
func (o oracle) probes() []namedProbe {
	puid, pgid := o.proxyIDs()
	tcp, udp := redirect.ProtoTCP, redirect.ProtoUDP
	ap := netip.AddrPortFrom
	var ps []namedProbe
	add := func(name string, from netlab.From, uid, gid uint32, proto redirect.Proto, dst netip.AddrPort) {
		ps = append(ps, namedProbe{name, netlab.Probe{From: from, UID: uid, GID: gid, Proto: proto, Dst: dst}})
	}
	app := func(name string, proto redirect.Proto, dst netip.AddrPort) {
		add(name, netlab.FromApp, netlab.AppUID, netlab.AppGID, proto, dst)
	}

	// Outbound from the app.
	app("app→other-v4:80", tcp, ap(netlab.OtherV4Host, 80))
	app("app→other-v6:80", tcp, ap(netlab.OtherV6Host, 80))
	app("app→excluded-v4:80", tcp, ap(netlab.ExcludedV4Host, 80))
	app("app→excluded-v6:80", tcp, ap(netlab.ExcludedV6Host, 80))
	app("app→included-v4:80", tcp, ap(netlab.IncludedV4Host, 80))
	app("app→included-v6:80", tcp, ap(netlab.IncludedV6Host, 80))
	app("app→other-v4:15020", tcp, ap(netlab.OtherV4Host, 15020))
	app("app→other-v4:3306", tcp, ap(netlab.OtherV4Host, 3306))
	app("app→other-v6:3306", tcp, ap(netlab.OtherV6Host, 3306))
	app("app→other-v4:5432", tcp, ap(netlab.OtherV4Host, 5432))
	app("app→other-v6:5432", tcp, ap(netlab.OtherV6Host, 5432))

	// Outbound from the proxy, by UID and by GID alone.
	add("proxy-uid→other-v4:80", netlab.FromApp, puid, netlab.AppGID, tcp, ap(netlab.OtherV4Host, 80))
	add("proxy-uid→other-v6:80", netlab.FromApp, puid, netlab.AppGID, tcp, ap(netlab.OtherV6Host, 80))
	add("proxy-gid→other-v4:80", netlab.FromApp, netlab.AppUID, pgid, tcp, ap(netlab.OtherV4Host, 80))
	add("proxy-gid→other-v6:80", netlab.FromApp, netlab.AppUID, pgid, tcp, ap(netlab.OtherV6Host, 80))
	if puid != redirect.DefaultProxyID || pgid != redirect.DefaultProxyID {
		// 1337 is nobody special once the proxy runs under other IDs.
		add("uid-1337→other-v4:80", netlab.FromApp, redirect.DefaultProxyID, netlab.AppGID, tcp, ap(netlab.OtherV4Host, 80))
		add("gid-1337→other-v4:80", netlab.FromApp, netlab.AppUID, redirect.DefaultProxyID, tcp, ap(netlab.OtherV4Host, 80))
		add("uid-1337→pod-v4:8080 (lo)", netlab.FromApp, redirect.DefaultProxyID, netlab.AppGID, tcp, ap(netlab.PodV4, 8080))
	}

	// DNS.
	app("app→other-v4:53/udp", udp, ap(netlab.OtherV4Host, 53))
	app("app→other-v6:53/udp", udp, ap(netlab.OtherV6Host, 53))
	app("app→other-v4:53/tcp", tcp, ap(netlab.OtherV4Host, 53))
	add("proxy-uid→other-v4:53/udp", netlab.FromApp, puid, pgid, udp, ap(netlab.OtherV4Host, 53))
	add("proxy-uid→other-v6:53/udp", netlab.FromApp, puid, pgid, udp, ap(netlab.OtherV6Host, 53))

	// Inbound from the peer over the veth.
	for _, port := range []uint16{8080, 8081, 9090, 9091, 15008, 15020, 15021, 15090} {
		add(fmt.Sprintf("peer→pod-v4:%d", port), netlab.FromPeer, 0, 0, tcp, ap(netlab.PodV4, port))
	}
	add("peer→pod-v6:8080", netlab.FromPeer, 0, 0, tcp, ap(netlab.PodV6, 8080))
	add("peer→pod-v6:8081", netlab.FromPeer, 0, 0, tcp, ap(netlab.PodV6, 8081))
	if o.s != nil && len(o.s.RerouteVirtualInterfaces) > 0 {
		// What a VM behind the rerouted interface sends to the world.
		add("peer→through-pod-v4:80", netlab.FromPeer, 0, 0, tcp, ap(netlab.ThroughPodV4, 80))
		add("peer→through-pod-v6:80", netlab.FromPeer, 0, 0, tcp, ap(netlab.ThroughPodV6, 80))
	}

	// Inside the pod, over lo.
	add("passthrough→pod-v4:8080", netlab.FromPassthrough, puid, pgid, tcp, ap(netlab.PodV4, 8080))
	if o.s != nil && o.s.IPv6 {
		// ::6 exists only once the backend added it (Plan.LoopbackAddrs).
		add("passthrough→pod-v6:8080", netlab.FromPassthrough, puid, pgid, tcp, ap(netlab.PodV6, 8080))
	}
	app("app→pod-v4:8080 (lo)", tcp, ap(netlab.PodV4, 8080))
	app("app→pod-v6:8080 (lo)", tcp, ap(netlab.PodV6, 8080))
	app("app→127.0.0.2:8080 (lo)", tcp, ap(netip.MustParseAddr("127.0.0.2"), 8080))
	add("proxy-uid→pod-v4:8080 (lo)", netlab.FromApp, puid, netlab.AppGID, tcp, ap(netlab.PodV4, 8080))
	add("proxy-uid→pod-v6:8080 (lo)", netlab.FromApp, puid, netlab.AppGID, tcp, ap(netlab.PodV6, 8080))
	add("proxy-gid→pod-v4:8080 (lo)", netlab.FromApp, netlab.AppUID, pgid, tcp, ap(netlab.PodV4, 8080))
	add("proxy-uid→pod-v4:15008 (lo)", netlab.FromApp, puid, pgid, tcp, ap(netlab.PodV4, redirect.InboundTunnelPort))
	// istio-validation (the init container that checks capture works): as
	// the proxy, to 127.0.0.6:15002; the source is 127.0.0.1 (lo's route
	// source), so ISTIO_OUTPUT sends it to 15006 with SO_ORIGINAL_DST
	// 127.0.0.6:15002.
	add("validation→127.0.0.6:15002", netlab.FromApp, puid, pgid, tcp, ap(netlab.PassthroughV4, redirect.ValidationProbePort))
	if o.s != nil && o.s.IPv6 {
		// The IPv6 twin is NOT captured: connecting to ::6 without binding a
		// source, the kernel picks ::6 itself as the source (RFC 6724 rule
		// 1), and ISTIO_OUTPUT's "-o lo -s ::6 RETURN" lets it through to
		// nothing. Pinned so every backend shows the same (Istio's) result.
		add("validation-v6→[::6]:15002", netlab.FromApp, puid, pgid, tcp, ap(netlab.PassthroughV6, redirect.ValidationProbePort))
	}
	// Not probed: reroute-interfaces' second interface (the pod has one
	// veth, named after the first), and drop-invalid's drop itself (it
	// needs hand-made conntrack-invalid packets); there, the probes show
	// that valid traffic is unaffected.
	//
	// Nor, on a single-stack pod, anything to or from an address of the
	// family it lacks: connect fails before a packet exists, whatever the
	// rules. Every dual-stack pod is probed in both families.
	return slices.DeleteFunc(ps, func(np namedProbe) bool { return !o.podHasFamily(np.p.Dst.Addr()) })
}

// podHasFamily reports whether the pod can send to (or be reached at) a:
// it has an address of a's family, or a is on lo.
func (o oracle) podHasFamily(a netip.Addr) bool {
	switch {
	case a.IsLoopback() || a == netlab.PassthroughV6:
		return true
	case a.Is4():
		return o.t.Stack.Has4()
	}
	return o.t.Stack.Has6()
}

// verdict is what the nat rules do with a connection's first packet.
type verdict uint8

const (
	vDirect   verdict = iota
	vOutbound         // ISTIO_REDIRECT → 15001
	vInbound          // ISTIO_IN_REDIRECT → 15006
	vDNS              // ISTIO_OUTPUT_DNS → 15053
)

func (o oracle) expect(p netlab.Probe) (landed, why string) {
	if p.From == netlab.FromPeer {
		return o.arriving(p)
	}
	return o.sent(p)
}

// rules reports whether capture rules exist for the probe's family.
func (o oracle) rules(p netlab.Probe) bool {
	return o.s != nil && (p.Dst.Addr().Is4() || o.s.IPv6)
}

// isLocal reports whether dst is an address of the pod (routed over lo).
func (o oracle) isLocal(a netip.Addr) bool {
	return a == netlab.PodV4 || a == netlab.PodV6 || a.IsLoopback() || (a == netlab.PassthroughV6 && o.s != nil && o.s.IPv6)
}

// loopbackDst is Istio's "-d 127.0.0.1/32" (the host IPv4 loopback CIDR)
// and "-d ::1/128".
func (o oracle) loopbackDst(a netip.Addr) bool {
	if a.Is4() {
		cidr := netip.MustParsePrefix("127.0.0.1/32")
		if o.s != nil && o.s.HostIPv4LoopbackCIDR.IsValid() {
			cidr = o.s.HostIPv4LoopbackCIDR
		}
		return cidr.Contains(a)
	}
	return a == netip.IPv6Loopback()
}

func ifaceMatch(names []string, iface string) bool {
	for _, n := range names {
		if n == iface || (strings.HasSuffix(n, "+") && strings.HasPrefix(iface, strings.TrimSuffix(n, "+"))) {
			return true
		}
	}
	return false
}

type owner struct {
	gid bool
	id  uint32
}

func (o oracle) owners() []owner {
	var out []owner
	for _, u := range o.s.ProxyUIDs {
		out = append(out, owner{false, u})
	}
	for _, g := range o.s.ProxyGIDs {
		out = append(out, owner{true, g})
	}
	return out
}

func (w owner) matches(p netlab.Probe) bool {
	if w.gid {
		return p.GID == w.id
	}
	return p.UID == w.id
}

func (o oracle) includesLoopback() bool {
	for _, p := range o.s.OutboundIPRanges.Prefixes {
		if p.Addr().IsLoopback() {
			return true
		}
	}
	return false
}

func inPrefixes(ps []netip.Prefix, a netip.Addr) bool {
	for _, p := range ps {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// passthroughSource reports whether the probe leaves with source 127.0.0.6
// or ::6: bound on purpose (FromPassthrough), or chosen by the kernel for a
// connection to ::6 itself (same-address source selection). A connection to
// 127.0.0.6 gets 127.0.0.1, the source of lo's local route.
func (o oracle) passthroughSource(p netlab.Probe) bool {
	return p.From == netlab.FromPassthrough || p.Dst.Addr() == netlab.PassthroughV6
}

// natOutput follows nat OUTPUT → ISTIO_OUTPUT (REDIRECT mode) for a connection the
// pod itself opens. Jumps to ISTIO_REDIRECT / ISTIO_IN_REDIRECT /
// ISTIO_OUTPUT_DNS return when their REDIRECT does not match (e.g. UDP), and
// evaluation continues below the jump, as in iptables.
func (o oracle) natOutput(p netlab.Probe, viaLo bool) (verdict, string) {
	s := o.s
	dst, port := p.Dst.Addr(), p.Dst.Port()
	tcp := p.Proto == redirect.ProtoTCP
	oif := o.t.PodIface
	if viaLo {
		oif = "lo"
	}
	if ifaceMatch(s.ExcludeInterfaces, oif) {
		return vDirect, fmt.Sprintf("excluded interface %s (OUTPUT -o %s RETURN)", oif, oif)
	}
	if slices.Contains(s.OutboundPortsExclude, port) {
		return vDirect, fmt.Sprintf("excluded outbound port %d (ISTIO_OUTPUT --dport RETURN, tcp and udp)", port)
	}
	if viaLo && o.passthroughSource(p) {
		return vDirect, "inbound passthrough source over lo (ISTIO_OUTPUT -o lo -s 127.0.0.6/::6 RETURN)"
	}
	for _, w := range o.owners() {
		kind := "uid"
		if w.gid {
			kind = "gid"
		}
		notPorts := []uint16{redirect.InboundTunnelPort}
		if s.CaptureDNS && !w.gid {
			notPorts = []uint16{redirect.DNSPort, redirect.InboundTunnelPort}
		}
		if viaLo && !o.loopbackDst(dst) && tcp && !slices.Contains(notPorts, port) && w.matches(p) {
			return vInbound, fmt.Sprintf("proxy (%s %d) to its own pod over lo goes through inbound (ISTIO_OUTPUT -o lo ! -d loopback --%s-owner → ISTIO_IN_REDIRECT)", kind, w.id, kind)
		}
		if !o.includesLoopback() && viaLo && !w.matches(p) && (!s.CaptureDNS || (tcp && port != redirect.DNSPort)) {
			return vDirect, fmt.Sprintf("app to app over lo (ISTIO_OUTPUT -o lo ! --%s-owner %d RETURN)", kind, w.id)
		}
		if w.matches(p) {
			return vDirect, fmt.Sprintf("the proxy's own traffic (ISTIO_OUTPUT --%s-owner %d RETURN)", kind, w.id)
		}
	}
	if len(s.OwnerGroupsExclude) > 0 {
		if slices.Contains(s.OwnerGroupsExclude, p.GID) {
			return vDirect, "excluded owner group"
		}
	} else if len(s.OwnerGroupsInclude) > 0 && !slices.Contains(s.OwnerGroupsInclude, p.GID) {
		return vDirect, "owner group not included"
	}
	if s.CaptureDNS && port == redirect.DNSPort {
		return vDNS, "DNS capture (ISTIO_OUTPUT_DNS --dport 53 REDIRECT 15053)"
	}
	if o.loopbackDst(dst) {
		return vDirect, "loopback destination (ISTIO_OUTPUT -d 127.0.0.1/32 or ::1 RETURN)"
	}
	fam := func(ps []netip.Prefix) []netip.Prefix {
		var out []netip.Prefix
		for _, q := range ps {
			if q.Addr().Is4() == dst.Is4() {
				out = append(out, q)
			}
		}
		return out
	}
	if inPrefixes(fam(s.OutboundIPRangesExclude), dst) {
		return vDirect, "excluded outbound CIDR (ISTIO_OUTPUT -d CIDR RETURN)"
	}
	if tcp && slices.Contains(s.OutboundPorts, port) {
		return vOutbound, fmt.Sprintf("included outbound port %d (ISTIO_OUTPUT -p tcp --dport → ISTIO_REDIRECT)", port)
	}
	if tcp && s.OutboundIPRanges.All {
		return vOutbound, "all outbound captured (ISTIO_OUTPUT → ISTIO_REDIRECT, tcp)"
	}
	if tcp && inPrefixes(fam(s.OutboundIPRanges.Prefixes), dst) {
		return vOutbound, "included outbound CIDR (ISTIO_OUTPUT -d CIDR → ISTIO_REDIRECT)"
	}
	switch {
	case !tcp:
		return vDirect, "not TCP and not DNS: ISTIO_REDIRECT only redirects TCP"
	case s.OutboundIPRanges.All || len(s.OutboundIPRanges.Prefixes) > 0:
		return vDirect, "not in the included outbound CIDRs (end of ISTIO_OUTPUT)"
	}
	return vDirect, "no outbound capture (includeOutboundIPRanges empty; end of ISTIO_OUTPUT)"
}

// sent is the landing of a connection opened inside the pod.
func (o oracle) sent(p netlab.Probe) (string, string) {
	viaLo := o.isLocal(p.Dst.Addr())
	if !o.rules(p) {
		return o.direct(p), o.noRules(p)
	}
	v, why := o.natOutput(p, viaLo)
	switch v {
	case vOutbound:
		return netlab.ListenerOutbound, why
	case vInbound:
		return netlab.ListenerInbound, why
	case vDNS:
		return netlab.ListenerDNS, why
	}
	if viaLo {
		if l, w := o.loopbackTProxy(p); l != "" {
			return l, why + "; then " + w
		}
	}
	return o.direct(p), why
}

func (o oracle) noRules(p netlab.Probe) string {
	if o.s == nil {
		return "no capture rules"
	}
	return "IPv6 off: no IPv6 rules"
}

// loopbackTProxy follows what a connection the pod opened to itself meets
// when it comes back in on lo in TPROXY mode: mangle OUTPUT marks the
// proxy's non-loopback lo traffic 1338, and mangle ISTIO_INBOUND only lets
// lo traffic without that mark (or from 127.0.0.6) through untouched.
// It returns "" when the connection is not diverted.
func (o oracle) loopbackTProxy(p netlab.Probe) (string, string) {
	s := o.s
	if s.InterceptionMode != redirect.ModeTProxy || s.InboundPorts.None() || p.Proto != redirect.ProtoTCP {
		return "", ""
	}
	dst, port := p.Dst.Addr(), p.Dst.Port()
	if o.passthroughSource(p) {
		return "", ""
	}
	marked := false
	for _, w := range o.owners() {
		if !o.loopbackDst(dst) && w.matches(p) {
			marked = true
		}
	}
	if !marked {
		return "", ""
	}
	if s.InboundPorts.All {
		if slices.Contains(s.InboundPortsExclude, port) || slices.Contains(alwaysExcludedInbound, port) {
			return "", ""
		}
	} else if !slices.Contains(s.InboundPorts.Ports, port) {
		return "", ""
	}
	if o.loopbackDst(dst) {
		return "", ""
	}
	return netlab.ListenerInbound, "the proxy's lo traffic is marked 1338 (mangle OUTPUT), so mangle ISTIO_INBOUND TPROXYs it to 15006 (15008 is not excluded in TPROXY)"
}

// Istio always appends these to the inbound exclusions, whatever the
// annotations say.
var alwaysExcludedInbound = []uint16{15020, 15021, 15090}

// arriving is the landing of a connection from the peer over the veth.
func (o oracle) arriving(p netlab.Probe) (string, string) {
	through := p.Dst.Addr() == netlab.ThroughPodV4 || p.Dst.Addr() == netlab.ThroughPodV6
	if !o.rules(p) {
		return o.direct(p), o.noRules(p)
	}
	s := o.s
	dst, port := p.Dst.Addr(), p.Dst.Port()
	tcp := p.Proto == redirect.ProtoTCP
	iface := o.t.PodIface
	tproxy := s.InterceptionMode == redirect.ModeTProxy

	// Reroute rules sit at the top of nat PREROUTING.
	reroute := func() (string, string, bool) {
		if !ifaceMatch(s.RerouteVirtualInterfaces, iface) {
			return "", "", false
		}
		in := s.OutboundIPRanges.All
		for _, q := range s.OutboundIPRanges.Prefixes {
			if q.Addr().Is4() == dst.Is4() && q.Contains(dst) {
				in = true
			}
		}
		if in && tcp {
			return netlab.ListenerOutbound, fmt.Sprintf("inbound on rerouted interface %s is treated as outbound (PREROUTING -i %s → ISTIO_REDIRECT)", iface, iface), true
		}
		return o.direct(p), fmt.Sprintf("rerouted interface %s, destination not captured (PREROUTING -i %s RETURN)", iface, iface), true
	}

	if ifaceMatch(s.ExcludeInterfaces, iface) {
		return o.direct(p), fmt.Sprintf("excluded interface %s (PREROUTING -i %s RETURN)", iface, iface)
	}
	if tproxy {
		if !s.InboundPorts.None() && tcp && !through {
			captured, why := o.inboundPorts(port, true)
			if captured && !o.loopbackDst(dst) {
				return netlab.ListenerInbound, why + " (mangle ISTIO_INBOUND → ISTIO_TPROXY, on-port 15006)"
			}
			if l, w, ok := reroute(); ok {
				return l, w
			}
			return o.direct(p), why
		}
		if l, w, ok := reroute(); ok {
			return l, w
		}
		return o.direct(p), "no inbound capture"
	}
	if l, w, ok := reroute(); ok {
		return l, w
	}
	if through {
		return o.direct(p), "not rerouted; the pod does not forward"
	}
	if s.InboundPorts.None() {
		return o.direct(p), "includeInboundPorts empty: no inbound capture"
	}
	if !tcp {
		return o.direct(p), "inbound capture is TCP only"
	}
	if port == redirect.InboundTunnelPort {
		return o.direct(p), "tunnel port 15008 (ISTIO_INBOUND --dport 15008 RETURN)"
	}
	captured, why := o.inboundPorts(port, false)
	if captured {
		return netlab.ListenerInbound, why + " (ISTIO_INBOUND → ISTIO_IN_REDIRECT)"
	}
	return o.direct(p), why
}

// inboundPorts applies includeInboundPorts / excludeInboundPorts.
func (o oracle) inboundPorts(port uint16, tproxy bool) (bool, string) {
	s := o.s
	if s.InboundPorts.All {
		if slices.Contains(s.InboundPortsExclude, port) || slices.Contains(alwaysExcludedInbound, port) {
			return false, fmt.Sprintf("excluded inbound port %d (ISTIO_INBOUND --dport RETURN)", port)
		}
		if tproxy && port == redirect.InboundTunnelPort {
			return true, "all inbound ports captured; TPROXY does not exclude 15008"
		}
		return true, "all inbound ports captured"
	}
	if slices.Contains(s.InboundPorts.Ports, port) {
		return true, fmt.Sprintf("included inbound port %d", port)
	}
	return false, fmt.Sprintf("inbound port %d not in includeInboundPorts", port)
}

// direct is where a connection lands when nothing redirects it.
func (o oracle) direct(p netlab.Probe) string {
	dst, port := p.Dst.Addr(), p.Dst.Port()
	tcp := p.Proto == redirect.ProtoTCP
	if p.From != netlab.FromPeer && o.isLocal(dst) || p.From == netlab.FromPeer && (dst == netlab.PodV4 || dst == netlab.PodV6) {
		switch {
		case port == redirect.DNSProxyPort:
			return netlab.ListenerDNS
		case !tcp:
			return netlab.LandedRefused
		case port == redirect.ProxyOutboundPort:
			return netlab.ListenerOutbound
		case port == redirect.ProxyInboundPort:
			return netlab.ListenerInbound
		case slices.Contains(o.t.AppPorts, port):
			return netlab.AppListener(port)
		}
		return netlab.LandedRefused
	}
	if slices.Contains(netlab.ExternalHosts(), dst) {
		ports := o.t.PeerTCPPorts
		if !tcp {
			ports = o.t.PeerUDPPorts
		}
		if slices.Contains(ports, port) {
			return netlab.PeerListener(p.Dst)
		}
		return netlab.LandedRefused
	}
	// Nobody owns it (ThroughPod*): the pod does not forward.
	return netlab.LandedTimeout
}
