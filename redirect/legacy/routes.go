package legacy

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/nftmesh/nftmesh/redirect"
)

// The TPROXY policy routing (fwmark → table, local default route on lo) and
// the ::6 passthrough address are part of a Plan whatever the rule backend;
// they go through rtnetlink on a handle bound to the namespace.

const loIndex = 1 // LOOPBACK_IFINDEX, the same in every namespace

func nlFamily(f redirect.Family) int {
	if f == redirect.FamilyIPv6 {
		return netlink.FAMILY_V6
	}
	return netlink.FAMILY_V4
}

func withHandle(path string, fn func(h *netlink.Handle) error) error {
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return fmt.Errorf("opening netns %s: %w", path, err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("opening rtnetlink in %s: %w", path, err)
	}
	defer h.Close()
	return fn(h)
}

func fwmarkRule(f redirect.Family, mark uint32, table int) *netlink.Rule {
	r := netlink.NewRule()
	r.Family = nlFamily(f)
	r.Mark = mark
	r.Table = table
	return r
}

func localDefault(f redirect.Family, table int) *netlink.Route {
	bits := 32
	ip := net.IPv4zero.To4()
	if f == redirect.FamilyIPv6 {
		bits, ip = 128, net.IPv6zero
	}
	return &netlink.Route{Family: nlFamily(f), LinkIndex: loIndex, Table: table, Type: unix.RTN_LOCAL,
		Scope: netlink.SCOPE_HOST, Dst: &net.IPNet{IP: ip, Mask: net.CIDRMask(0, bits)}}
}

func prefixNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// applyRoutes makes the namespace's policy routes and loopback addresses
// those of p (ours: fwmark rules to redirect.TProxyRouteTab and ::6 on lo).
func applyRoutes(path string, p redirect.Plan) error {
	return withHandle(path, func(h *netlink.Handle) error {
		live, addrs, err := listRoutesH(h)
		if err != nil {
			return err
		}
		for _, r := range p.Routes {
			if !containsRoute(live, r) {
				if err := h.RuleAdd(fwmarkRule(r.Family, r.Mark, r.Table)); err != nil && !errors.Is(err, unix.EEXIST) {
					return fmt.Errorf("adding ip rule fwmark %d lookup %d (%s): %w", r.Mark, r.Table, r.Family, err)
				}
			}
			if err := h.RouteAdd(localDefault(r.Family, r.Table)); err != nil && !errors.Is(err, unix.EEXIST) {
				return fmt.Errorf("adding local default route dev lo table %d (%s): %w", r.Table, r.Family, err)
			}
		}
		for _, r := range live {
			if !containsRoute(p.Routes, r) {
				if err := delRoute(h, r); err != nil {
					return err
				}
			}
		}
		lo := &netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: loIndex, Name: "lo"}}
		for _, a := range p.LoopbackAddrs {
			if err := h.AddrAdd(lo, &netlink.Addr{IPNet: prefixNet(a), Flags: unix.IFA_F_NODAD}); err != nil && !errors.Is(err, unix.EEXIST) {
				return fmt.Errorf("adding %s to lo: %w", a, err)
			}
		}
		for _, a := range addrs {
			if !containsPrefix(p.LoopbackAddrs, a) {
				if err := h.AddrDel(lo, &netlink.Addr{IPNet: prefixNet(a)}); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
					return fmt.Errorf("removing %s from lo: %w", a, err)
				}
			}
		}
		return nil
	})
}

func containsRoute(rs []redirect.PolicyRoute, r redirect.PolicyRoute) bool {
	for _, x := range rs {
		if x == r {
			return true
		}
	}
	return false
}

func containsPrefix(ps []netip.Prefix, p netip.Prefix) bool {
	for _, x := range ps {
		if x == p {
			return true
		}
	}
	return false
}

func delRoute(h *netlink.Handle, r redirect.PolicyRoute) error {
	if err := h.RuleDel(fwmarkRule(r.Family, r.Mark, r.Table)); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("deleting ip rule fwmark %d lookup %d (%s): %w", r.Mark, r.Table, r.Family, err)
	}
	if err := h.RouteDel(localDefault(r.Family, r.Table)); err != nil && !errors.Is(err, unix.ESRCH) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("deleting local default route table %d (%s): %w", r.Table, r.Family, err)
	}
	return nil
}

func listRoutes(path string) (routes []redirect.PolicyRoute, addrs []netip.Prefix, err error) {
	err = withHandle(path, func(h *netlink.Handle) error {
		routes, addrs, err = listRoutesH(h)
		return err
	})
	return routes, addrs, err
}

// listRoutesH finds our fwmark rules (mark TProxyMark → TProxyRouteTab),
// IPv4 first, and the passthrough address on lo.
func listRoutesH(h *netlink.Handle) ([]redirect.PolicyRoute, []netip.Prefix, error) {
	var routes []redirect.PolicyRoute
	for _, f := range allFamilies {
		rules, err := h.RuleListFiltered(nlFamily(f), fwmarkRule(f, redirect.TProxyMark, redirect.TProxyRouteTab),
			netlink.RT_FILTER_MARK|netlink.RT_FILTER_TABLE)
		if err != nil {
			return nil, nil, fmt.Errorf("listing %s ip rules: %w", f, err)
		}
		if len(rules) > 0 {
			routes = append(routes, redirect.PolicyRoute{Family: f, Mark: redirect.TProxyMark, Table: redirect.TProxyRouteTab})
		}
	}
	lo := &netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: loIndex, Name: "lo"}}
	as, err := h.AddrList(lo, netlink.FAMILY_V6)
	if err != nil {
		return nil, nil, fmt.Errorf("listing addresses of lo: %w", err)
	}
	var addrs []netip.Prefix
	for _, a := range as {
		ones, _ := a.Mask.Size()
		ip, _ := netip.AddrFromSlice(a.IP)
		if p := netip.PrefixFrom(ip.Unmap(), ones); p == redirect.InboundPassthroughV6 {
			addrs = append(addrs, p)
		}
	}
	return routes, addrs, nil
}

func removeRoutes(path string) error {
	return applyRoutes(path, redirect.Plan{})
}
