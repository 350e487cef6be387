package standin

import (
	"context"
	"net"
	"net/netip"

	"github.com/nftmesh/nftmesh/redirect"
)

// PassthroughDial is the DialFunc of a forwarding inbound listener: it
// connects to the original destination (the pod's own address and the
// app's port) from 127.0.0.6, or ::6 for IPv6, as Envoy's inbound
// passthrough cluster does. From any other source the proxy's connection
// to its own pod's address leaves through lo as UID 1337, which Istio's
// capture (and nftmesh's) sends back to 15006: a loop, not the app.
func PassthroughDial(ctx context.Context, network, addr string) (net.Conn, error) {
	src := redirect.InboundPassthroughV4.Addr()
	if ap, err := netip.ParseAddrPort(addr); err == nil && ap.Addr().Unmap().Is6() {
		src = redirect.InboundPassthroughV6.Addr()
	}
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: src.AsSlice()}}
	return d.DialContext(ctx, network, addr)
}
