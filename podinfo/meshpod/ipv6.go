package meshpod

import (
	"net/netip"
	"slices"
)

// IPv6Capture reports whether a sidecar pod gets IPv6 capture (the IPv6
// rules and ::6 on lo), given the addresses of its network namespace in the
// order the kernel lists them and whether its sidecar is dual-stack
// (ISTIO_DUAL_STACK=true on istio-proxy).
//
// This is Istio's rule. Loopback, link-local unicast and link-local
// multicast addresses do not count, and an IPv4-mapped address counts as
// IPv4. Without dual-stack, IPv6 is captured only when the first address
// that counts is IPv6: such a sidecar's Envoy listens on 15001/15006 in that
// one family, so capturing the other family would send the app's
// connections to a port nobody listens on. A dual-stack sidecar listens in
// both, and IPv6 is captured when any address that counts is IPv6. With no
// address that counts, nothing is IPv6.
//
// The kernel lists every IPv4 address of a namespace before any IPv6 one
// (its address dump walks the families in order), so a pod with both
// families gets IPv4 capture only unless its sidecar is dual-stack, whatever
// order its pod IPs are in.
func IPv6Capture(addrs []netip.Addr, dualStack bool) bool {
	for _, a := range addrs {
		a = a.Unmap()
		if !Counts(a) {
			continue
		}
		if a.Is6() {
			return true
		}
		if !dualStack {
			return false
		}
	}
	return false
}

// Counts reports whether a is an address IPv6Capture looks at: valid and
// neither loopback nor link-local.
func Counts(a netip.Addr) bool {
	a = a.Unmap()
	return a.IsValid() && !a.IsLoopback() && !a.IsLinkLocalUnicast() && !a.IsLinkLocalMulticast()
}

// KernelOrder returns addrs in the order the kernel would list them once
// they are on a namespace's interfaces: IPv4 (and IPv4-mapped) first, then
// IPv6, each family in its given order. It predicts IPv6Capture's input from
// a pod's IPs before its namespace can be read.
func KernelOrder(addrs []netip.Addr) []netip.Addr {
	out := slices.Clone(addrs)
	slices.SortStableFunc(out, func(a, b netip.Addr) int {
		return family(a) - family(b)
	})
	return out
}

func family(a netip.Addr) int {
	if a.Unmap().Is4() {
		return 4
	}
	return 6
}

// parseIPs reads pod IPs (plain or CIDR notation). Unparsable entries are
// skipped: they come from the API server or the primary plugin, not from
// the user, and Istio does not read them at all.
func parseIPs(ss []string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		a, err := netip.ParseAddr(s)
		if err != nil {
			p, perr := netip.ParsePrefix(s)
			if perr != nil {
				continue
			}
			a = p.Addr()
		}
		out = append(out, a)
	}
	return out
}
