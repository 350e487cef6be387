package redirect

import "slices"

// Equal reports whether p and q are the same plan, in the same order (a nil
// and an empty list alike): reflect.DeepEqual at a small part of its cost,
// for the node agent, which keys work it has done by plan.
func (p Plan) Equal(q Plan) bool {
	return slices.EqualFunc(p.Tables, q.Tables, tableEqual) &&
		slices.EqualFunc(p.Sets, q.Sets, setEqual) &&
		slices.Equal(p.Routes, q.Routes) &&
		slices.Equal(p.LoopbackAddrs, q.LoopbackAddrs) && p.TableFlags == q.TableFlags
}

func tableEqual(a, b Table) bool {
	return a.Name == b.Name && slices.EqualFunc(a.Chains, b.Chains, chainEqual)
}

func chainEqual(a, b Chain) bool {
	return a.Name == b.Name && a.Hook == b.Hook && a.Type == b.Type && a.Priority == b.Priority && a.Policy == b.Policy &&
		slices.EqualFunc(a.Rules, b.Rules, ruleEqual)
}

func ruleEqual(a, b Rule) bool {
	// Every Verdict type is comparable.
	return a.Family == b.Family && a.Verdict == b.Verdict && slices.EqualFunc(a.Matches, b.Matches, matchEqual)
}

// matchEqual compares two matches: MatchPort by its ports, every other
// match type (all comparable; a test keeps them so) with ==.
func matchEqual(a, b Match) bool {
	if ap, ok := a.(MatchPort); ok {
		bp, ok := b.(MatchPort)
		return ok && ap.Source == bp.Source && ap.Negate == bp.Negate && slices.Equal(ap.Ports, bp.Ports)
	}
	return a == b
}

func setEqual(a, b Set) bool {
	return a.Name == b.Name && a.Kind == b.Kind && slices.Equal(a.Prefixes, b.Prefixes) && slices.Equal(a.Ports, b.Ports)
}

// Clone returns a copy of p that shares no memory with it.
func (p Plan) Clone() Plan {
	q := Plan{
		Tables:        slices.Clone(p.Tables),
		Sets:          slices.Clone(p.Sets),
		Routes:        slices.Clone(p.Routes),
		LoopbackAddrs: slices.Clone(p.LoopbackAddrs),
		TableFlags:    p.TableFlags,
	}
	for i := range q.Tables {
		t := &q.Tables[i]
		t.Chains = slices.Clone(t.Chains)
		for j := range t.Chains {
			c := &t.Chains[j]
			c.Rules = slices.Clone(c.Rules)
			for k := range c.Rules {
				r := &c.Rules[k]
				r.Matches = slices.Clone(r.Matches)
				for m, x := range r.Matches {
					if mp, ok := x.(MatchPort); ok {
						mp.Ports = slices.Clone(mp.Ports)
						r.Matches[m] = mp
					}
				}
			}
		}
	}
	for i := range q.Sets {
		s := &q.Sets[i]
		s.Prefixes = slices.Clone(s.Prefixes)
		s.Ports = slices.Clone(s.Ports)
	}
	return q
}
