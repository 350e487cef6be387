// Package policyroute programs, for both rule backends, what a Plan needs
// besides packet rules: the TPROXY policy routing (fwmark → table, local
// default route on lo) and the ::6 passthrough address on lo, through
// rtnetlink in the pod's namespace. Apply and Remove refuse the host's
// namespace themselves, by the caller's hostns.Guard.
package policyroute

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/nftmesh/nftmesh/internal/hostns"
	"github.com/nftmesh/nftmesh/redirect"
)

// loIndex is the loopback's ifindex, the same in every namespace
// (LOOPBACK_IFINDEX); using it saves a link lookup per Apply.
const loIndex = 1

var lo = &netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: loIndex, Name: "lo"}}

func nlFamily(f redirect.Family) int {
	if f == redirect.FamilyIPv6 {
		return netlink.FAMILY_V6
	}
	return netlink.FAMILY_V4
}

func defaultDst(f redirect.Family) *net.IPNet {
	if f == redirect.FamilyIPv6 {
		return &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}
	}
	return &net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}
}

// localDefault is "local default dev lo table T".
func localDefault(f redirect.Family, table int) *netlink.Route {
	return &netlink.Route{
		Family: nlFamily(f), LinkIndex: loIndex, Dst: defaultDst(f), Table: table,
		Type: unix.RTN_LOCAL, Scope: netlink.SCOPE_HOST,
	}
}

func fwmarkRule(f redirect.Family, mark uint32, table int) *netlink.Rule {
	r := netlink.NewRule()
	r.Family = nlFamily(f)
	r.Mark = mark
	r.Table = table
	return r
}

// openIn opens rtnetlink in n: the socket is made inside hostns's Do and
// stays in n when the thread leaves. (netlink.NewHandleAt would move the
// caller's own thread there and, if moving back failed, hand it back to
// the scheduler inside n all the same.)
func openIn(n *hostns.Netns) (*netlink.Handle, error) {
	var h *netlink.Handle
	err := n.Do(func() (err error) {
		h, err = netlink.NewHandle(unix.NETLINK_ROUTE)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("opening rtnetlink: %w", err)
	}
	return h, nil
}

// borrow is the namespace of the caller's descriptor ns.
func borrow(ns netns.NsHandle) (*hostns.Netns, error) {
	return hostns.Borrow(int(ns), "of the policy routes")
}

// Handle is an rtnetlink handle in one namespace, for ApplyVia and
// RemoveVia.
type Handle struct{ nl *netlink.Handle }

// OpenHere opens a Handle in the calling thread's network namespace (inside
// hostns.Netns.Do, with the caller's other sockets).
func OpenHere() (*Handle, error) {
	nl, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("opening rtnetlink: %w", err)
	}
	return &Handle{nl: nl}, nil
}

func (h *Handle) Close() { h.nl.Close() }

// Apply programs p's policy routes and loopback addresses in ns, which g
// must not refuse. What it adds is undone if a later step fails. With
// reapply, routes and addresses of an earlier plan that p no longer has are
// removed.
func Apply(g hostns.Guard, ns netns.NsHandle, p redirect.Plan, reapply bool) error {
	if len(p.Routes) == 0 && len(p.LoopbackAddrs) == 0 && !reapply {
		return nil
	}
	return withHandle(g, ns, func(h *netlink.Handle) error { return apply(h, p, reapply) })
}

// withHandle runs fn on an rtnetlink handle in ns, which g must not refuse.
func withHandle(g hostns.Guard, ns netns.NsHandle, fn func(*netlink.Handle) error) error {
	n, err := borrow(ns)
	if err != nil {
		return err
	}
	if err := g.Refuse(n); err != nil {
		return err
	}
	h, err := openIn(n)
	if err != nil {
		return err
	}
	defer h.Close()
	return fn(h)
}

// ApplyVia is Apply through h, opened inside the namespace ns
// (OpenHere); ns is checked by g.
func ApplyVia(g hostns.Guard, h *Handle, ns int, p redirect.Plan, reapply bool) error {
	if len(p.Routes) == 0 && len(p.LoopbackAddrs) == 0 && !reapply {
		return nil
	}
	if err := g.RefuseFd(ns, "of the policy routes"); err != nil {
		return err
	}
	return apply(h.nl, p, reapply)
}

func apply(h *netlink.Handle, p redirect.Plan, reapply bool) (err error) {
	var undo []func() error
	defer func() {
		if err != nil {
			for i := len(undo) - 1; i >= 0; i-- {
				if uerr := undo[i](); uerr != nil {
					err = errors.Join(err, fmt.Errorf("undoing: %w", uerr))
				}
			}
		}
	}()
	var live []redirect.PolicyRoute
	if len(p.Routes) > 0 || reapply {
		if live, err = listRoutes(h); err != nil {
			return err
		}
	}
	for _, r := range p.Routes {
		if r.Family != redirect.FamilyIPv4 && r.Family != redirect.FamilyIPv6 {
			return fmt.Errorf("policy route for family %s", r.Family)
		}
		rule := fwmarkRule(r.Family, r.Mark, r.Table)
		if !hasRule(h, rule) {
			if err := h.RuleAdd(rule); err != nil && !errors.Is(err, unix.EEXIST) {
				return fmt.Errorf("adding ip rule fwmark %d lookup %d (%s): %w", r.Mark, r.Table, r.Family, err)
			} else if err == nil {
				undo = append(undo, func() error { return h.RuleDel(rule) })
			}
		}
		route := localDefault(r.Family, r.Table)
		if err := h.RouteAdd(route); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("adding local default route dev lo table %d (%s): %w", r.Table, r.Family, err)
		} else if err == nil {
			undo = append(undo, func() error { return h.RouteDel(route) })
		}
	}
	for _, a := range p.LoopbackAddrs {
		addr := &netlink.Addr{IPNet: prefixNet(a), Flags: unix.IFA_F_NODAD}
		if err := h.AddrAdd(lo, addr); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("adding %s to lo: %w", a, err)
		} else if err == nil {
			undo = append(undo, func() error { return h.AddrDel(lo, addr) })
		}
	}
	if !reapply {
		return nil
	}
	// Stale state of an earlier plan (TPROXY → REDIRECT, IPv6 → IPv4 only).
	for _, r := range live {
		if ours(r) && !slices.Contains(p.Routes, r) {
			if err := delPolicyRoute(h, r); err != nil {
				return err
			}
		}
	}
	if !slices.Contains(p.LoopbackAddrs, redirect.InboundPassthroughV6) {
		if err := delPassthrough(h); err != nil {
			return err
		}
	}
	return nil
}

func prefixNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

func hasRule(h *netlink.Handle, want *netlink.Rule) bool {
	rules, err := h.RuleListFiltered(want.Family, want, netlink.RT_FILTER_MARK|netlink.RT_FILTER_TABLE)
	return err == nil && len(rules) > 0
}

func delPolicyRoute(h *netlink.Handle, r redirect.PolicyRoute) error {
	rule := fwmarkRule(r.Family, r.Mark, r.Table)
	for {
		err := h.RuleDel(rule)
		if err != nil {
			if errors.Is(err, unix.ENOENT) {
				break
			}
			return fmt.Errorf("deleting ip rule fwmark %d lookup %d: %w", r.Mark, r.Table, err)
		}
	}
	if err := h.RouteDel(localDefault(r.Family, r.Table)); err != nil && !errors.Is(err, unix.ESRCH) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("deleting local default route table %d: %w", r.Table, err)
	}
	return nil
}

func delPassthrough(h *netlink.Handle) error {
	addr := &netlink.Addr{IPNet: prefixNet(redirect.InboundPassthroughV6)}
	if err := h.AddrDel(lo, addr); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("deleting %s from lo: %w", redirect.InboundPassthroughV6, err)
	}
	return nil
}

// ours tells our TPROXY policy route from another tool's fwmark routing,
// which Apply and Remove leave alone.
func ours(r redirect.PolicyRoute) bool {
	return r.Mark == redirect.TProxyMark && r.Table == redirect.TProxyRouteTab
}

// Remove deletes the TPROXY routes and ::6 whatever plan put them there
// from ns, which g must not refuse.
func Remove(g hostns.Guard, ns netns.NsHandle) error { return withHandle(g, ns, remove) }

// RemoveVia is Remove through h, opened inside the namespace ns
// (OpenHere); ns is checked by g.
func RemoveVia(g hostns.Guard, h *Handle, ns int) error {
	if err := g.RefuseFd(ns, "of the policy routes"); err != nil {
		return err
	}
	return remove(h.nl)
}

func remove(h *netlink.Handle) error {
	live, err := listRoutes(h)
	if err != nil {
		return err
	}
	for _, r := range live {
		if ours(r) {
			if err := delPolicyRoute(h, r); err != nil {
				return err
			}
		}
	}
	// A rule whose route is already gone is not listed; delete it anyway.
	for _, f := range []redirect.Family{redirect.FamilyIPv4, redirect.FamilyIPv6} {
		if err := delPolicyRoute(h, redirect.PolicyRoute{Family: f, Mark: redirect.TProxyMark, Table: redirect.TProxyRouteTab}); err != nil {
			return err
		}
	}
	return delPassthrough(h)
}

// List returns the namespace's policy routes and lo's extra addresses, in
// the Plan's terms.
func List(ns netns.NsHandle) ([]redirect.PolicyRoute, []netip.Prefix, error) {
	n, err := borrow(ns)
	if err != nil {
		return nil, nil, err
	}
	h, err := openIn(n)
	if err != nil {
		return nil, nil, err
	}
	defer h.Close()
	return list(h)
}

func list(h *netlink.Handle) ([]redirect.PolicyRoute, []netip.Prefix, error) {
	routes, err := listRoutes(h)
	if err != nil {
		return nil, nil, err
	}
	addrs, err := listLoopback(h)
	if err != nil {
		return nil, nil, err
	}
	return routes, addrs, nil
}

// ListVia is List through h, opened inside the namespace (OpenHere).
func ListVia(h *Handle) ([]redirect.PolicyRoute, []netip.Prefix, error) {
	return list(h.nl)
}

// listRoutes returns the fwmark policy routes whose table holds a local
// default route on lo: the shape TPROXY needs. A rule without its route
// (or the reverse) is not a PolicyRoute and shows up as drift.
func listRoutes(h *netlink.Handle) ([]redirect.PolicyRoute, error) {
	var out []redirect.PolicyRoute
	for _, f := range []redirect.Family{redirect.FamilyIPv4, redirect.FamilyIPv6} {
		rules, err := h.RuleList(nlFamily(f))
		if err != nil {
			return nil, fmt.Errorf("listing ip rules (%s): %w", f, err)
		}
		for _, r := range rules {
			if r.Mark == 0 || r.Table == 0 || r.Table >= unix.RT_TABLE_COMPAT {
				continue
			}
			routes, err := h.RouteListFiltered(nlFamily(f), &netlink.Route{Table: r.Table}, netlink.RT_FILTER_TABLE)
			if err != nil {
				return nil, fmt.Errorf("listing routes of table %d (%s): %w", r.Table, f, err)
			}
			for _, rt := range routes {
				if rt.Type == unix.RTN_LOCAL && rt.LinkIndex == loIndex && (rt.Dst == nil || isDefault(rt.Dst)) {
					pr := redirect.PolicyRoute{Family: f, Mark: r.Mark, Table: r.Table}
					if !slices.Contains(out, pr) {
						out = append(out, pr)
					}
					break
				}
			}
		}
	}
	return out, nil
}

func isDefault(n *net.IPNet) bool {
	ones, _ := n.Mask.Size()
	return ones == 0
}

// listLoopback returns lo's addresses other than the kernel's own
// 127.0.0.1/8 and ::1/128.
func listLoopback(h *netlink.Handle) ([]netip.Prefix, error) {
	addrs, err := h.AddrList(lo, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("listing addresses of lo: %w", err)
	}
	var out []netip.Prefix
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok {
			continue
		}
		ip = ip.Unmap()
		ones, _ := a.Mask.Size()
		p := netip.PrefixFrom(ip, ones)
		if p == netip.MustParsePrefix("127.0.0.1/8") || p == netip.MustParsePrefix("::1/128") {
			continue
		}
		out = append(out, p)
	}
	return out, nil
}
