package redirect

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// Backend programs a Plan into a network namespace. A new capture feature
// changes the model and the renderers, never this interface.
//
// netns is a path to a network namespace file (/var/run/netns/x,
// /proc/PID/ns/net).
type Backend interface {
	// Name is the backend's name as used in flags and logs.
	Name() string
	// Apply installs p atomically, replacing whatever this backend installed
	// before. On error nothing of p is left behind.
	Apply(ctx context.Context, netns string, p Plan) error
	// List reads back what this backend has installed, in Plan form.
	// Nothing installed gives an empty Plan and no error.
	List(ctx context.Context, netns string) (Plan, error)
	// Check compares the live state with p; it returns a *DriftError listing
	// the differences, or nil when they are equal.
	Check(ctx context.Context, netns string, p Plan) error
	// Remove deletes everything this backend installed. Nothing installed
	// is success.
	Remove(ctx context.Context, netns string) error
}

// DriftError reports differences between a Plan and a live namespace.
// Each line starts with "-" (expected, missing) or "+" (present, unexpected).
type DriftError struct{ Lines []string }

func (e *DriftError) Error() string {
	return fmt.Sprintf("live rules differ from the plan (%d lines):\n%s", len(e.Lines), strings.Join(e.Lines, "\n"))
}

// IsDrift reports whether err is (or wraps) a *DriftError.
func IsDrift(err error) bool {
	var d *DriftError
	return errors.As(err, &d)
}

// CheckAgainst is the Check every backend can share: List, then Diff.
func CheckAgainst(ctx context.Context, b Backend, netns string, want Plan) error {
	got, err := b.List(ctx, netns)
	if err != nil {
		return err
	}
	if d := Diff(want, got); len(d) > 0 {
		return &DriftError{Lines: d}
	}
	return nil
}

// Diff compares two Plans in canonical form and returns the differing lines
// ("-" only in want, "+" only in got), or nil when they are equivalent.
// Sets compare by content (address sets as merged intervals, port sets as
// sorted ports), so a backend may store them in its own order.
func Diff(want, got Plan) []string {
	a, b := Describe(want), Describe(got)
	return diffLines(a, b)
}

// Describe renders a Plan as canonical, backend-neutral lines, one per set,
// chain, rule, route and address. It is the form Diff compares.
func Describe(p Plan) []string {
	var out []string
	sets := slices.Clone(p.Sets)
	slices.SortFunc(sets, func(x, y Set) int { return strings.Compare(x.Name, y.Name) })
	for _, s := range sets {
		out = append(out, fmt.Sprintf("set %s %s { %s }", s.Name, s.Kind, setElements(s)))
	}
	for _, t := range p.Tables {
		for _, c := range t.Chains {
			if c.IsBase() {
				out = append(out, fmt.Sprintf("chain %s %s { type %s hook %s priority %d }", t.Name, c.Name, c.Type, c.Hook, c.Priority))
			} else {
				out = append(out, fmt.Sprintf("chain %s %s", t.Name, c.Name))
			}
			// No rule numbers: a missing rule then shows as one line, not
			// as every later rule renumbered.
			for _, r := range c.Rules {
				out = append(out, fmt.Sprintf("rule %s %s: %s", t.Name, c.Name, r))
			}
		}
	}
	for _, r := range p.Routes {
		out = append(out, fmt.Sprintf("route %s fwmark %d lookup %d (local default via lo)", r.Family, r.Mark, r.Table))
	}
	for _, a := range p.LoopbackAddrs {
		out = append(out, fmt.Sprintf("address %s dev lo", a))
	}
	return out
}

func setElements(s Set) string {
	var el []string
	switch s.Kind {
	case SetPort:
		ports := slices.Clone(s.Ports)
		slices.Sort(ports)
		for _, p := range slices.Compact(ports) {
			el = append(el, fmt.Sprint(p))
		}
	default:
		for _, r := range MergePrefixes(s.Prefixes) {
			el = append(el, r.String())
		}
	}
	return strings.Join(el, ", ")
}

// diffLines is a small LCS diff; plans are at most a few hundred lines.
func diffLines(a, b []string) []string {
	n, m := len(a), len(b)
	lcs := make([][]int, n+1)
	for i := range lcs {
		lcs[i] = make([]int, m+1)
	}
	for i := n - 1; i >= 0; i-- {
		for j := m - 1; j >= 0; j-- {
			if a[i] == b[j] {
				lcs[i][j] = lcs[i+1][j+1] + 1
			} else {
				lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
			}
		}
	}
	var out []string
	i, j := 0, 0
	for i < n || j < m {
		switch {
		case i < n && j < m && a[i] == b[j]:
			i++
			j++
		case j < m && (i == n || lcs[i][j+1] >= lcs[i+1][j]):
			out = append(out, "+ "+b[j])
			j++
		default:
			out = append(out, "- "+a[i])
			i++
		}
	}
	return out
}

// AddrRange is an inclusive address range.
type AddrRange struct{ From, To netip.Addr }

func (r AddrRange) String() string {
	if r.From == r.To {
		return r.From.String()
	}
	// Print as a prefix when it is one.
	for bits := 0; bits <= r.From.BitLen(); bits++ {
		p := netip.PrefixFrom(r.From, bits).Masked()
		if p.Addr() == r.From && lastAddr(p) == r.To {
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
		rs = append(rs, AddrRange{p.Addr(), lastAddr(p)})
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

// lastAddr is the highest address in p.
func lastAddr(p netip.Prefix) netip.Addr {
	a := p.Masked().Addr().AsSlice()
	bits := p.Bits()
	for i := range a {
		for bit := 0; bit < 8; bit++ {
			if i*8+bit >= bits {
				a[i] |= 0x80 >> bit
			}
		}
	}
	out, _ := netip.AddrFromSlice(a)
	return out
}
