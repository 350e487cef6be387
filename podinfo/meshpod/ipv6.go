package meshpod

import (
	"net/netip"
	"slices"
)

// IPv6Capture reports whether a sidecar pod gets IPv6 capture (the IPv6
// rules and ::6 on lo), given its network namespace's addresses in the
// kernel's order and whether its sidecar is dual-stack (ISTIO_DUAL_STACK).
//
// This is Istio's rule. Only addresses that Count count; an IPv4-mapped
// one is IPv4. Without dual-stack, IPv6 is captured only when the first
// is IPv6: Envoy then listens on 15001/15006 in that one family, and
// capturing the other would send connections to a port nobody listens on.
// With dual-stack, any IPv6 address suffices. The kernel lists IPv4 before
// IPv6, so a pod of both families gets IPv4 capture only unless its
// sidecar is dual-stack, whatever the order of its pod IPs.
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

// KernelOrder returns addrs in the order the kernel would list them on a
// namespace's interfaces: IPv4 (and IPv4-mapped), then IPv6, each family
// in its given order: IPv6Capture's input predicted from a pod's IPs.
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

// parseIPs reads pod IPs (plain or CIDR). Unparsable entries are skipped:
// they come from the API server, not the user, and Istio ignores them.
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
