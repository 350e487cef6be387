//go:build !go1.26

package netlab

import (
	"net"
	"net/netip"

	"github.com/nftmesh/nftmesh/redirect"
)

// dial is dial.go's for toolchains before Go 1.26, which have no dial by
// netip address: by address string, linking net's name resolver.
func dial(proto redirect.Proto, local netip.Addr, dst netip.AddrPort) (net.Conn, error) {
	d := net.Dialer{Timeout: ioTimeout}
	netw := "tcp"
	if proto == redirect.ProtoUDP {
		netw = "udp"
		if local.IsValid() {
			d.LocalAddr = &net.UDPAddr{IP: local.AsSlice()}
		}
	} else if local.IsValid() {
		d.LocalAddr = &net.TCPAddr{IP: local.AsSlice()}
	}
	return d.Dial(netw, dst.String())
}
