package nettest

import (
	"fmt"
	"net/netip"

	"github.com/nftmesh/nftmesh/netlab"
	"github.com/nftmesh/nftmesh/redirect"
)

// TracePacketFor is probe p as redirect.TracePacket sees it in topo: its
// direction, and the addresses and interface the kernel gives it (a
// connection to the pod's own addresses or loopback leaves on lo with that
// address as its source, 127.0.0.1 for other 127/8 destinations, ::6 for
// ::6; other connections leave on the pod's veth from the pod's address;
// the peer sends from its own address into the pod's veth).
func TracePacketFor(s *redirect.Spec, topo *netlab.Topology, p netlab.Probe) redirect.Packet {
	o := oracle{s: s, t: topo}
	dst := p.Dst.Addr()
	pkt := redirect.Packet{Proto: p.Proto, Dst: p.Dst, UID: p.UID, GID: p.GID}
	if p.From == netlab.FromPeer {
		pkt.Dir, pkt.Iface, pkt.UID, pkt.GID = redirect.DirIn, topo.PodIface, 0, 0
		pkt.Src = netlab.PeerV4
		if dst.Is6() {
			pkt.Src = netlab.PeerV6
		}
		return pkt
	}
	pkt.Dir, pkt.Iface = redirect.DirOut, topo.PodIface
	if o.isLocal(dst) {
		pkt.Iface = "lo"
	}
	switch {
	case p.From == netlab.FromPassthrough && dst.Is4():
		pkt.Src = netlab.PassthroughV4
	case p.From == netlab.FromPassthrough, dst == netlab.PassthroughV6:
		pkt.Src = netlab.PassthroughV6
	case dst.Is4() && dst.IsLoopback():
		pkt.Src = netip.AddrFrom4([4]byte{127, 0, 0, 1})
	case dst.IsLoopback():
		pkt.Src = netip.IPv6Loopback()
	case dst == netlab.PodV4 || dst == netlab.PodV6:
		pkt.Src = dst
	case dst.Is4():
		pkt.Src = netlab.PodV4
	default:
		pkt.Src = netlab.PodV6
	}
	return pkt
}

// TracedLanding is where a probe lands in topo if the tracer's verdict is
// right: a redirect or tproxy to a proxy port lands on that port's listener
// with the probe's destination as the original one, a drop times out, and
// a packet left alone goes where it would with no rules.
func TracedLanding(s *redirect.Spec, topo *netlab.Topology, p netlab.Probe, v redirect.TraceVerdict) (landed string, orig netip.AddrPort, err error) {
	byPort := map[uint16]string{
		redirect.ProxyOutboundPort: netlab.ListenerOutbound,
		redirect.ProxyInboundPort:  netlab.ListenerInbound,
		redirect.DNSProxyPort:      netlab.ListenerDNS,
	}
	switch v.Outcome {
	case redirect.OutcomeRedirect, redirect.OutcomeTProxy:
		l, ok := byPort[v.Port]
		if !ok {
			return "", netip.AddrPort{}, fmt.Errorf("verdict %s: no listener on port %d in the topology", v, v.Port)
		}
		return l, p.Dst, nil
	case redirect.OutcomeDrop:
		return netlab.LandedTimeout, netip.AddrPort{}, nil
	case redirect.OutcomeAccept:
		l := oracle{s: s, t: topo}.direct(p)
		if l == netlab.LandedRefused || l == netlab.LandedTimeout {
			return l, netip.AddrPort{}, nil
		}
		return l, p.Dst, nil
	}
	return "", netip.AddrPort{}, fmt.Errorf("verdict %q: unknown outcome", v.Outcome)
}
