package nettest

import (
	"net/netip"
	"testing"

	"github.com/nftmesh/nftmesh/redirect"
)

func TestSmoke(t *testing.T) {
	topo, err := NewTopology(TopologyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer topo.Close()
	l, err := StartListeners(topo, ListenerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for _, p := range []Probe{
		{From: FromApp, UID: 1000, GID: 1000, Proto: redirect.ProtoTCP, Dst: netip.AddrPortFrom(OtherV4Host, 80)},
		{From: FromApp, UID: 1000, GID: 1000, Proto: redirect.ProtoTCP, Dst: netip.AddrPortFrom(OtherV6Host, 80)},
		{From: FromApp, UID: 1000, GID: 1000, Proto: redirect.ProtoUDP, Dst: netip.AddrPortFrom(OtherV4Host, 53)},
		{From: FromApp, UID: 1000, GID: 1000, Proto: redirect.ProtoUDP, Dst: netip.AddrPortFrom(OtherV6Host, 53)},
		{From: FromPeer, Proto: redirect.ProtoTCP, Dst: netip.AddrPortFrom(PodV4, 8080)},
		{From: FromPeer, Proto: redirect.ProtoTCP, Dst: netip.AddrPortFrom(PodV6, 8080)},
		{From: FromPassthrough, UID: 1337, GID: 1337, Proto: redirect.ProtoTCP, Dst: netip.AddrPortFrom(PodV4, 8080)},
		{From: FromApp, UID: 1337, GID: 1337, Proto: redirect.ProtoTCP, Dst: netip.MustParseAddrPort("127.0.0.6:15002")},
	} {
		t.Logf("%v: %v", p, topo.Probe(p))
	}
}
