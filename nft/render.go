package nft

import (
	"fmt"
	"slices"
	"strings"

	"github.com/nftmesh/nftmesh/redirect"
)

// Render prints p as `nft -f` input for table inet nftmesh, deterministic,
// as `nft list table inet nftmesh` prints it after Apply: the chain names,
// sets and expression order Apply programs, without handles or counters and
// without the dependencies nft adds itself (a family guard before an ip/ip6
// address match, "meta l4proto tcp" before "tcp dport"). Policy routes and
// loopback addresses follow as "#" lines with the equivalent ip commands.
// Only what Apply can program renders (chain names included), and the
// table flags List finds, which Apply never writes.
func Render(p redirect.Plan) (string, error) {
	unflagged := p
	unflagged.TableFlags = 0
	if _, err := encode(unflagged, TableName); err != nil {
		return "", fmt.Errorf("rendering plan: %w", err)
	}
	var blocks []string
	for _, s := range p.Sets {
		b, err := renderSet(s)
		if err != nil {
			return "", err
		}
		blocks = append(blocks, b)
	}
	for _, t := range p.Tables {
		for _, c := range t.Chains {
			var sb strings.Builder
			fmt.Fprintf(&sb, "\tchain %s {\n", ChainName(t.Name, c.Name))
			if c.IsBase() {
				fmt.Fprintf(&sb, "\t\ttype %s hook %s priority %s; policy %s;\n", c.Type, c.Hook, priorityName(c.Hook, c.Priority), c.Policy)
			}
			for i, r := range c.Rules {
				line, err := renderRule(t.Name, r)
				if err != nil {
					return "", fmt.Errorf("rendering %s/%s rule %d: %w", t.Name, c.Name, i+1, err)
				}
				fmt.Fprintf(&sb, "\t\t%s\n", line)
			}
			sb.WriteString("\t}\n")
			blocks = append(blocks, sb.String())
		}
	}
	var out strings.Builder
	fmt.Fprintf(&out, "table inet %s {\n", TableName)
	if p.TableFlags != 0 {
		fmt.Fprintf(&out, "\tflags %s\n\n", p.TableFlags)
	}
	out.WriteString(strings.Join(blocks, "\n"))
	out.WriteString("}\n")
	for _, r := range p.Routes {
		ip := "ip"
		if r.Family == redirect.FamilyIPv6 {
			ip = "ip -6"
		}
		fmt.Fprintf(&out, "# %s rule add fwmark %d lookup %d\n", ip, r.Mark, r.Table)
		fmt.Fprintf(&out, "# %s route add local default dev lo table %d\n", ip, r.Table)
	}
	for _, a := range p.LoopbackAddrs {
		ip := "ip"
		if a.Addr().Is6() {
			ip = "ip -6"
		}
		fmt.Fprintf(&out, "# %s addr add %s dev lo nodad\n", ip, a)
	}
	return out.String(), nil
}

func renderSet(s redirect.Set) (string, error) {
	var sb strings.Builder
	fmt.Fprintf(&sb, "\tset %s {\n", s.Name)
	var elems []string
	switch s.Kind {
	case redirect.SetPort:
		sb.WriteString("\t\ttype inet_service\n\t\tflags interval\n")
		for _, r := range redirect.MergePorts(s.Ports) {
			elems = append(elems, r.String())
		}
	case redirect.SetIPv4, redirect.SetIPv6:
		fmt.Fprintf(&sb, "\t\ttype %s\n\t\tflags interval\n", s.Kind)
		for _, r := range redirect.MergePrefixes(s.Prefixes) {
			elems = append(elems, r.String())
		}
	default:
		return "", fmt.Errorf("set %s: unsupported kind %s", s.Name, s.Kind)
	}
	if len(elems) > 0 {
		fmt.Fprintf(&sb, "\t\telements = { %s }\n", strings.Join(elems, ", "))
	}
	sb.WriteString("\t}\n")
	return sb.String(), nil
}

// priorityName is nft's symbolic name for a standard priority of the inet
// family, as `nft list` prints it.
func priorityName(h redirect.Hook, prio int32) string {
	switch {
	case prio == -300:
		return "raw"
	case prio == -150:
		return "mangle"
	case prio == -100 && h == redirect.HookPrerouting:
		return "dstnat"
	case prio == 0:
		return "filter"
	case prio == 50:
		return "security"
	}
	return fmt.Sprint(prio)
}

func neq(neg bool) string {
	if neg {
		return "!= "
	}
	return ""
}

func ipName(f redirect.Family) string {
	if f == redirect.FamilyIPv6 {
		return "ip6"
	}
	return "ip"
}

func renderRule(table redirect.TableName, r redirect.Rule) (string, error) {
	var parts []string
	hasAddr := slices.ContainsFunc(r.Matches, func(m redirect.Match) bool {
		switch m := m.(type) {
		case redirect.MatchAddr:
			return true
		case redirect.MatchSet:
			return m.Kind != redirect.SetPort
		}
		return false
	})
	switch r.Family {
	case redirect.FamilyAny:
	case redirect.FamilyIPv4, redirect.FamilyIPv6:
		if !hasAddr {
			parts = append(parts, "meta nfproto "+r.Family.String())
		}
	default:
		return "", fmt.Errorf("unsupported family %s", r.Family)
	}
	proto := "th"
	for i, m := range r.Matches {
		if mp, ok := m.(redirect.MatchProto); ok {
			proto = mp.Proto.String()
			if !portFollows(r.Matches[i+1:]) {
				parts = append(parts, "meta l4proto "+proto)
			}
			continue
		}
		part, err := renderMatch(r.Family, proto, m)
		if err != nil {
			return "", err
		}
		parts = append(parts, part)
	}
	v, err := renderVerdict(table, r.Family, r.Verdict)
	if err != nil {
		return "", err
	}
	return strings.Join(append(parts, v), " "), nil
}

// renderMatch prints one match other than the protocol; proto is the
// protocol matched before it ("th" without one).
func renderMatch(fam redirect.Family, proto string, m redirect.Match) (string, error) {
	switch m := m.(type) {
	case redirect.MatchPort:
		dir := "dport"
		if m.Source {
			dir = "sport"
		}
		if len(m.Ports) == 1 {
			return fmt.Sprintf("%s %s %s%d", proto, dir, neq(m.Negate), m.Ports[0]), nil
		}
		var ps []string
		for _, p := range redirect.SortedPorts(m.Ports) {
			ps = append(ps, fmt.Sprint(p))
		}
		return fmt.Sprintf("%s %s %s{ %s }", proto, dir, neq(m.Negate), strings.Join(ps, ", ")), nil
	case redirect.MatchAddr:
		dir := "daddr"
		if m.Source {
			dir = "saddr"
		}
		pfx := m.Prefix.Masked()
		a := pfx.String()
		if pfx.IsSingleIP() {
			a = pfx.Addr().String()
		}
		return fmt.Sprintf("%s %s %s%s", ipName(fam), dir, neq(m.Negate), a), nil
	case redirect.MatchSet:
		if m.Kind == redirect.SetPort {
			return fmt.Sprintf("%s dport %s@%s", proto, neq(m.Negate), m.Set), nil
		}
		return fmt.Sprintf("%s daddr %s@%s", ipName(fam), neq(m.Negate), m.Set), nil
	case redirect.MatchIface:
		dir := "iifname"
		if m.Out {
			dir = "oifname"
		}
		name := m.Name
		if p, ok := strings.CutSuffix(name, "+"); ok {
			name = p + "*"
		}
		return fmt.Sprintf("%s %s%q", dir, neq(m.Negate), name), nil
	case redirect.MatchOwner:
		what := "skuid"
		if m.GID {
			what = "skgid"
		}
		return fmt.Sprintf("meta %s %s%d", what, neq(m.Negate), m.ID), nil
	case redirect.MatchMark:
		return renderMarkMatch(m), nil
	case redirect.MatchCTState:
		// nft prints a negated flag match, (state & x) == 0, as "! x".
		not := ""
		if m.Negate {
			not = "! "
		}
		return fmt.Sprintf("ct state %s%s", not, m.States), nil
	}
	return "", fmt.Errorf("unsupported match %T", m)
}

func renderMarkMatch(m redirect.MatchMark) string {
	what := "meta mark"
	if m.Conn {
		what = "ct mark"
	}
	mask := redirect.FullMask(m.Mask)
	if mask == 0xffffffff {
		return fmt.Sprintf("%s %s0x%08x", what, neq(m.Negate), m.Value)
	}
	op := "=="
	if m.Negate {
		op = "!="
	}
	return fmt.Sprintf("%s & 0x%08x %s 0x%08x", what, mask, op, m.Value&mask)
}

func renderVerdict(table redirect.TableName, fam redirect.Family, v redirect.Verdict) (string, error) {
	switch v := v.(type) {
	case redirect.Accept:
		return "accept", nil
	case redirect.Drop:
		return "drop", nil
	case redirect.Return:
		return "return", nil
	case redirect.Jump:
		return "jump " + ChainName(table, v.Chain), nil
	case redirect.Redirect:
		return fmt.Sprintf("redirect to :%d", v.Port), nil
	case redirect.TProxy:
		return fmt.Sprintf("tproxy %s to :%d %s accept", ipName(fam), v.Port, renderMarkSet(v.Mark, v.Mask)), nil
	case redirect.SetMark:
		return renderMarkSet(v.Mark, 0), nil
	case redirect.SaveMark:
		return "ct mark set meta mark", nil
	case redirect.RestoreMark:
		return "meta mark set ct mark", nil
	case redirect.SetCTZone:
		return fmt.Sprintf("ct zone set %d", v.Zone), nil
	}
	return "", fmt.Errorf("unsupported verdict %T", v)
}

func renderMarkSet(value, mask uint32) string {
	if mask = redirect.FullMask(mask); mask == 0xffffffff {
		return fmt.Sprintf("meta mark set 0x%08x", value)
	}
	// The kernel computes (mark & ^mask) ^ value; nft prints the same
	// operation as "& (^mask | value) | value".
	return fmt.Sprintf("meta mark set meta mark & 0x%08x | 0x%08x", ^mask|value, value)
}

// portFollows reports whether a port match uses the protocol match just
// before it, which makes nft print "tcp dport" instead of "meta l4proto tcp".
func portFollows(ms []redirect.Match) bool {
	for _, m := range ms {
		switch m := m.(type) {
		case redirect.MatchProto:
			return false
		case redirect.MatchPort:
			return true
		case redirect.MatchSet:
			if m.Kind == redirect.SetPort {
				return true
			}
		}
	}
	return false
}
