package redirect

import (
	"fmt"
	"slices"
	"strings"
)

// Describe renders a Plan as canonical, backend-neutral lines, one per set,
// chain, rule, route and address. It is the form Diff compares. Chains go
// by ChainName, as everywhere the CLI prints them.
func Describe(p Plan) []string {
	var out []string
	if p.TableFlags != 0 {
		out = append(out, "table flags "+p.TableFlags.String())
	}
	sets := slices.Clone(p.Sets)
	slices.SortFunc(sets, func(x, y Set) int { return strings.Compare(x.Name, y.Name) })
	for _, s := range sets {
		out = append(out, fmt.Sprintf("set %s %s { %s }", s.Name, s.Kind, setElements(s)))
	}
	for _, t := range p.Tables {
		for _, c := range t.Chains {
			name := ChainName(t.Name, c.Name)
			if c.IsBase() {
				// Accept, the policy of every chain Build makes, goes
				// unsaid: a policy is named where it differs.
				out = append(out, fmt.Sprintf("chain %s { type %s hook %s priority %d%s }", name, c.Type, c.Hook, c.Priority,
					pick(c.Policy != PolicyAccept, " policy "+c.Policy.String(), "")))
			} else {
				out = append(out, "chain "+name)
			}
			// No rule numbers: a missing rule then shows as one line, not
			// as every later rule renumbered.
			for _, r := range c.Rules {
				out = append(out, fmt.Sprintf("rule %s: %s", name, r.Text(t.Name)))
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

// setElements lists a set's elements as its interval set holds them, as
// `nft list ruleset` shows them: each once, merged into ranges.
func setElements(s Set) string {
	if s.Kind == SetPort {
		return join(MergePorts(s.Ports), ", ")
	}
	return join(MergePrefixes(s.Prefixes), ", ")
}

// String renders a rule in the neutral form "[family] match match ... ->
// verdict", a jump naming its target as the Plan does (the rule does not
// know its table); Text is the form the CLI prints.
func (r Rule) String() string {
	return r.format(VerdictString(r.Verdict))
}

// Text is the rule of table t as Describe, the tracer and the CLI print
// it: String, with a jump naming its target by ChainName.
func (r Rule) Text(t TableName) string {
	if j, ok := r.Verdict.(Jump); ok {
		return r.format("jump " + ChainName(t, j.Chain))
	}
	return r.String()
}

func (r Rule) format(verdict string) string {
	var parts []string
	if r.Family != FamilyAny {
		parts = append(parts, r.Family.String())
	}
	for _, m := range r.Matches {
		parts = append(parts, MatchString(m))
	}
	parts = append(parts, "->", verdict)
	return strings.Join(parts, " ")
}

// pick is yes when cond holds, else no.
func pick(cond bool, yes, no string) string {
	if cond {
		return yes
	}
	return no
}

func not(neg bool) string { return pick(neg, "!= ", "") }

// MatchString renders one match canonically.
func MatchString(m Match) string {
	switch m := m.(type) {
	case MatchProto:
		return "l4proto " + m.Proto.String()
	case MatchPort:
		dir := pick(m.Source, "sport", "dport")
		if len(m.Ports) == 1 {
			return fmt.Sprintf("%s %s%d", dir, not(m.Negate), m.Ports[0])
		}
		// A port list is a set in the kernel: order and repeats do not count.
		return fmt.Sprintf("%s %s{ %s }", dir, not(m.Negate), join(SortedPorts(m.Ports), ", "))
	case MatchAddr:
		return fmt.Sprintf("%s %s%s", pick(m.Source, "saddr", "daddr"), not(m.Negate), m.Prefix)
	case MatchSet:
		return fmt.Sprintf("%s %s@%s", pick(m.Kind == SetPort, "dport", "daddr"), not(m.Negate), m.Set)
	case MatchIface:
		return fmt.Sprintf("%s %s%q", pick(m.Out, "oifname", "iifname"), not(m.Negate), m.Name)
	case MatchOwner:
		return fmt.Sprintf("%s %s%d", pick(m.GID, "skgid", "skuid"), not(m.Negate), m.ID)
	case MatchMark:
		what := pick(m.Conn, "ct mark", "mark")
		if mask := FullMask(m.Mask); mask != 0xffffffff {
			return fmt.Sprintf("%s and 0x%x %s%d", what, mask, not(m.Negate), m.Value)
		}
		return fmt.Sprintf("%s %s%d", what, not(m.Negate), m.Value)
	case MatchCTState:
		return fmt.Sprintf("ct state %s%s", not(m.Negate), m.States)
	}
	return fmt.Sprintf("<unknown match %T>", m)
}

// VerdictString renders one verdict canonically.
func VerdictString(v Verdict) string {
	switch v := v.(type) {
	case Accept:
		return "accept"
	case Drop:
		return "drop"
	case Return:
		return "return"
	case Jump:
		return "jump " + v.Chain
	case Redirect:
		return fmt.Sprintf("redirect to :%d", v.Port)
	case TProxy:
		return fmt.Sprintf("tproxy to :%d mark %d/0x%x", v.Port, v.Mark, FullMask(v.Mask))
	case SetMark:
		return fmt.Sprintf("mark set %d", v.Mark)
	case SaveMark:
		return "ct mark set mark"
	case RestoreMark:
		return "mark set ct mark"
	case SetCTZone:
		return fmt.Sprintf("ct zone set %d", v.Zone)
	}
	return fmt.Sprintf("<unknown verdict %T>", v)
}

// String lists the states as "invalid,established,related,new".
func (s CTState) String() string {
	var out []string
	for _, st := range []struct {
		bit  CTState
		name string
	}{{CTStateInvalid, "invalid"}, {CTStateEstablished, "established"}, {CTStateRelated, "related"}, {CTStateNew, "new"}} {
		if s&st.bit != 0 {
			out = append(out, st.name)
		}
	}
	if len(out) == 0 {
		return "none"
	}
	return strings.Join(out, ",")
}
