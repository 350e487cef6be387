//go:build go1.26

package netlab

import (
	"context"
	"net"
	"net/netip"

	"github.com/nftmesh/nftmesh/redirect"
)

// dial connects a probe's TCP or UDP socket to dst, from local if valid,
// within ioTimeout. It dials by netip address (Go 1.26): a dial by address
// string, like listening by one, links net's name resolver (some 200 KB)
// into every binary that links netlab, the redirect CLI's among them.
func dial(proto redirect.Proto, local netip.Addr, dst netip.AddrPort) (net.Conn, error) {
	d := net.Dialer{Timeout: ioTimeout}
	var laddr netip.AddrPort
	if local.IsValid() {
		laddr = netip.AddrPortFrom(local, 0)
	}
	if proto == redirect.ProtoUDP {
		c, err := d.DialUDP(context.Background(), "udp", laddr, dst)
		if err != nil {
			return nil, err
		}
		return c, nil
	}
	c, err := d.DialTCP(context.Background(), "tcp", laddr, dst)
	if err != nil {
		return nil, err
	}
	return c, nil
}
