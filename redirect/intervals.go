package redirect

import (
	"net/netip"
	"slices"
	"strconv"
)

// AddrRange is an inclusive address range.
type AddrRange struct{ From, To netip.Addr }

func (r AddrRange) String() string {
	if r.From == r.To {
		return r.From.String()
	}
	// Print as a prefix when it is one.
	for bits := 0; bits <= r.From.BitLen(); bits++ {
		p := netip.PrefixFrom(r.From, bits).Masked()
		if p.Addr() == r.From && LastAddr(p) == r.To {
			return p.String()
		}
	}
	return r.From.String() + "-" + r.To.String()
}

// MergePrefixes returns the prefixes as sorted, non-overlapping, non-adjacent
// ranges: the form an nftables interval set stores.
func MergePrefixes(ps []netip.Prefix) []AddrRange {
	rs := make([]AddrRange, 0, len(ps))
	for _, p := range ps {
		p = p.Masked()
		rs = append(rs, AddrRange{p.Addr(), LastAddr(p)})
	}
	slices.SortFunc(rs, func(x, y AddrRange) int { return x.From.Compare(y.From) })
	var out []AddrRange
	for _, r := range rs {
		if n := len(out); n > 0 {
			last := &out[n-1]
			next := last.To.Next()
			if r.From.Compare(last.To) <= 0 || (next.IsValid() && r.From == next) {
				if r.To.Compare(last.To) > 0 {
					last.To = r.To
				}
				continue
			}
		}
		out = append(out, r)
	}
	return out
}

// LastAddr is the highest address in p.
func LastAddr(p netip.Prefix) netip.Addr {
	a := p.Masked().Addr().AsSlice()
	for i := max(p.Bits(), 0); i < len(a)*8; i++ {
		a[i/8] |= 0x80 >> (i % 8)
	}
	out, _ := netip.AddrFromSlice(a)
	return out
}

// PortRange is an inclusive port range.
type PortRange struct{ From, To uint16 }

func (r PortRange) String() string {
	if r.From == r.To {
		return strconv.Itoa(int(r.From))
	}
	return strconv.Itoa(int(r.From)) + "-" + strconv.Itoa(int(r.To))
}

// MergePorts returns the ports as sorted, non-overlapping, non-adjacent
// ranges: the form an nftables interval set stores, where a port list of
// any length (all 65,535 ports) is one range and the most ranges any list
// can need is 32,768 (every other port).
func MergePorts(ports []uint16) []PortRange {
	var out []PortRange
	for _, p := range SortedPorts(ports) {
		if n := len(out); n > 0 && out[n-1].To+1 == p {
			out[n-1].To = p
			continue
		}
		out = append(out, PortRange{p, p})
	}
	return out
}
