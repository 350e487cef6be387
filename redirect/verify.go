package redirect

import (
	"errors"
	"fmt"
)

// badf records one broken invariant; Verify reports them all at once.
type badf func(format string, args ...any)

// Verify checks the invariants backends rely on: every set a rule matches
// exists with the right kind, every jump targets a chain of the same table,
// port matches and nat/tproxy verdicts follow a protocol match, address
// matches agree with the rule's family, base chains carry a type and
// priority. Build's Plans always pass; the backends verify what they get.
func (p Plan) Verify() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	sets := verifySets(p.Sets, bad)
	for _, t := range p.Tables {
		chains := verifyChains(t, bad)
		for _, c := range t.Chains {
			for i, r := range c.Rules {
				// Formatted only for an error: Verify runs on every
				// Apply, and a valid plan has none.
				where := func() string { return fmt.Sprintf("%s %s rule %d", t.Name, c.Name, i+1) }
				proto := verifyMatches(r, sets, where, bad)
				verifyVerdict(t.Name, r, proto, chains, where, bad)
			}
		}
	}
	return errors.Join(errs...)
}

// verifySets checks the sets and returns their kinds by name.
func verifySets(ss []Set, bad badf) map[string]SetKind {
	sets := map[string]SetKind{}
	for _, s := range ss {
		if _, dup := sets[s.Name]; dup {
			bad("set %s: defined twice", s.Name)
		}
		sets[s.Name] = s.Kind
		for _, pr := range s.Prefixes {
			if (s.Kind == SetIPv4) != pr.Addr().Is4() || s.Kind == SetPort {
				bad("set %s (%s): element %s has the wrong family", s.Name, s.Kind, pr)
			}
		}
	}
	return sets
}

// verifyChains checks the chains of t and returns their names.
func verifyChains(t Table, bad badf) map[string]bool {
	chains := map[string]bool{}
	for _, c := range t.Chains {
		if chains[c.Name] {
			bad("table %s: chain %s defined twice", t.Name, c.Name)
		}
		chains[c.Name] = true
		if c.IsBase() && (c.Type == "" || c.Priority == 0) {
			bad("table %s: base chain %s lacks a type or priority", t.Name, c.Name)
		}
	}
	return chains
}

// verifyMatches checks a rule's matches and reports whether it has a
// protocol match.
func verifyMatches(r Rule, sets map[string]SetKind, where func() string, bad badf) bool {
	proto := false
	for _, m := range r.Matches {
		switch m := m.(type) {
		case MatchProto:
			proto = true
		case MatchPort:
			if !proto || len(m.Ports) == 0 {
				bad("%s: port match without a protocol match before it, or without ports", where())
			}
		case MatchAddr:
			if !m.Prefix.IsValid() || (r.Family == FamilyIPv4) != m.Prefix.Addr().Is4() || r.Family == FamilyAny {
				bad("%s: address %s does not fit rule family %s", where(), m.Prefix, r.Family)
			}
		case MatchSet:
			k, ok := sets[m.Set]
			switch {
			case !ok:
				bad("%s: set %s does not exist", where(), m.Set)
			case k != m.Kind:
				bad("%s: set %s is %s, matched as %s", where(), m.Set, k, m.Kind)
			case k == SetPort && !proto:
				bad("%s: port set match without a protocol match before it", where())
			case k == SetIPv4 && r.Family != FamilyIPv4, k == SetIPv6 && r.Family != FamilyIPv6:
				bad("%s: %s set in a %s rule", where(), k, r.Family)
			}
		case nil:
			bad("%s: nil match", where())
		}
	}
	return proto
}

func verifyVerdict(table TableName, r Rule, proto bool, chains map[string]bool, where func() string, bad badf) {
	switch v := r.Verdict.(type) {
	case Jump:
		if !chains[v.Chain] {
			bad("%s: jump to missing chain %s", where(), v.Chain)
		}
	case Redirect:
		if !proto || table != TableNat {
			bad("%s: redirect needs a protocol match and the nat table", where())
		}
	case TProxy:
		if !proto || r.Family == FamilyAny || table != TableMangle {
			bad("%s: tproxy needs a protocol match, one family and the mangle table", where())
		}
	case nil:
		bad("%s: no verdict", where())
	}
}
