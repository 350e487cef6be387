package iptables

import (
	"net/netip"

	"github.com/nftmesh/nftmesh/internal/hostns"
	"github.com/nftmesh/nftmesh/policyroute"
	"github.com/nftmesh/nftmesh/redirect"
)

// The TPROXY policy routing and the ::6 passthrough address are part of a
// Plan whatever the rule backend; policyroute programs them for
// both backends, here through the rtnetlink socket openSockets opened with
// the raw ones.

func applyRoutes(g hostns.Guard, s *Sockets, p redirect.Plan) error {
	return policyroute.ApplyVia(g, s.route, s.ns.Fd(), p, true)
}

func listRoutes(s *Sockets) ([]redirect.PolicyRoute, []netip.Prefix, error) {
	return policyroute.ListVia(s.route)
}

func removeRoutes(g hostns.Guard, s *Sockets) error {
	return policyroute.RemoveVia(g, s.route, s.ns.Fd())
}
