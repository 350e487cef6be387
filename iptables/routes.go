package iptables

import (
	"net/netip"

	"github.com/vishvananda/netns"

	"github.com/nftmesh/nftmesh/internal/hostns"
	"github.com/nftmesh/nftmesh/internal/policyroute"
	"github.com/nftmesh/nftmesh/redirect"
)

// The TPROXY policy routing and the ::6 passthrough address are part of a
// Plan whatever the rule backend; internal/policyroute programs them for
// both backends.

func withNetns(path string, fn func(ns netns.NsHandle) error) error {
	n, err := hostns.Open(path)
	if err != nil {
		return err
	}
	defer n.Close()
	return fn(netns.NsHandle(n.Fd()))
}

func applyRoutes(g hostns.Guard, path string, p redirect.Plan) error {
	return withNetns(path, func(ns netns.NsHandle) error { return policyroute.Apply(g, ns, p, true) })
}

func listRoutes(path string) (routes []redirect.PolicyRoute, addrs []netip.Prefix, err error) {
	err = withNetns(path, func(ns netns.NsHandle) error {
		routes, addrs, err = policyroute.List(ns)
		return err
	})
	return routes, addrs, err
}

func removeRoutes(g hostns.Guard, path string) error {
	return withNetns(path, func(ns netns.NsHandle) error { return policyroute.Remove(g, ns) })
}
