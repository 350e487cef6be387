package redirect_test

import (
	"net/netip"
	"reflect"
	"testing"

	"github.com/nftmesh/nftmesh/redirect"
	"github.com/nftmesh/nftmesh/testkit/scenarios"
)

// scenarioPlans builds every scenario's plan, with IPv6 on and off.
func scenarioPlans(t *testing.T) []redirect.Plan {
	t.Helper()
	var out []redirect.Plan
	for _, sc := range scenarios.All {
		s, err := sc.Spec()
		if err != nil {
			t.Fatal(err)
		}
		for _, v6 := range []bool{false, true} {
			s.IPv6 = v6
			p, err := redirect.Build(s)
			if err != nil {
				continue // a scenario of invalid input
			}
			out = append(out, p)
		}
	}
	if len(out) < 10 {
		t.Fatalf("only %d scenario plans", len(out))
	}
	return out
}

// TestPlanEqualIsDeepEqual: over every pair of scenario plans, and every
// plan against itself rebuilt, Equal says what reflect.DeepEqual says.
func TestPlanEqualIsDeepEqual(t *testing.T) {
	plans := scenarioPlans(t)
	equal := 0
	for i, p := range plans {
		for j, q := range plans {
			if got, want := p.Equal(q), reflect.DeepEqual(p, q); got != want {
				t.Errorf("plans %d and %d: Equal %v, DeepEqual %v", i, j, got, want)
			}
			if i != j && p.Equal(q) {
				equal++
			}
		}
	}
	t.Logf("%d plans, %d equal pairs besides themselves", len(plans), equal)
}

// TestPlanEqualSeesEveryField: a change to any one field of any rule,
// match, set, route or address makes a plan unequal to the original.
func TestPlanEqualSeesEveryField(t *testing.T) {
	for i, p := range scenarioPlans(t) {
		changes := planChanges(p)
		for name, change := range changes {
			q := p.Clone()
			change(&q)
			if p.Equal(q) || q.Equal(p) {
				t.Errorf("plan %d: %s: still Equal", i, name)
			}
			if reflect.DeepEqual(p, q) {
				t.Errorf("plan %d: %s changed nothing", i, name)
			}
		}
	}
}

// planChanges are single-field edits of p, by name.
func planChanges(p redirect.Plan) map[string]func(*redirect.Plan) {
	c := map[string]func(*redirect.Plan){
		"route added": func(q *redirect.Plan) {
			q.Routes = append(q.Routes, redirect.PolicyRoute{Family: redirect.FamilyIPv6, Mark: 7, Table: 9})
		},
		"address added": func(q *redirect.Plan) { q.LoopbackAddrs = append(q.LoopbackAddrs, netip.MustParsePrefix("::7/128")) },
		"table flags":   func(q *redirect.Plan) { q.TableFlags = redirect.TableDormant },
		"set added": func(q *redirect.Plan) {
			q.Sets = append(q.Sets, redirect.Set{Name: "x", Kind: redirect.SetPort, Ports: []uint16{1}})
		},
	}
	for si := range p.Sets {
		c["set port or prefix"] = func(q *redirect.Plan) {
			s := &q.Sets[si]
			if len(s.Ports) > 0 {
				s.Ports[0]++
			} else if len(s.Prefixes) > 0 {
				s.Prefixes[0] = netip.PrefixFrom(s.Prefixes[0].Addr().Next(), s.Prefixes[0].Bits())
			} else {
				s.Name += "x"
			}
		}
	}
	for ti, t := range p.Tables {
		for ci, ch := range t.Chains {
			c["chain priority"] = func(q *redirect.Plan) { q.Tables[ti].Chains[ci].Priority++ }
			c["chain policy"] = func(q *redirect.Plan) { q.Tables[ti].Chains[ci].Policy = redirect.PolicyDrop }
			for ri, r := range ch.Rules {
				c["rule family"] = func(q *redirect.Plan) { q.Tables[ti].Chains[ci].Rules[ri].Family ^= 3 }
				c["rule verdict"] = func(q *redirect.Plan) { q.Tables[ti].Chains[ci].Rules[ri].Verdict = redirect.Jump{Chain: "elsewhere"} }
				for mi, m := range r.Matches {
					if mp, ok := m.(redirect.MatchPort); ok && len(mp.Ports) > 0 {
						c["match port"] = func(q *redirect.Plan) {
							mp := q.Tables[ti].Chains[ci].Rules[ri].Matches[mi].(redirect.MatchPort)
							mp.Ports[0]++
						}
					}
					c["match negated"] = func(q *redirect.Plan) {
						ms := q.Tables[ti].Chains[ci].Rules[ri].Matches
						ms[mi] = negate(ms[mi])
					}
				}
			}
		}
	}
	return c
}

// negate flips a match's Negate field, or replaces a match that has none.
func negate(m redirect.Match) redirect.Match {
	v := reflect.New(reflect.TypeOf(m)).Elem()
	v.Set(reflect.ValueOf(m))
	if f := v.FieldByName("Negate"); f.IsValid() {
		f.SetBool(!f.Bool())
		return v.Interface().(redirect.Match)
	}
	return redirect.MatchMark{Value: 0xdead}
}

// TestPlanCloneSharesNothing: a clone is Equal, and changing it (every
// slice, down to a match's ports) leaves the original as it was.
func TestPlanCloneSharesNothing(t *testing.T) {
	for i, p := range scenarioPlans(t) {
		before := p.Clone()
		if !before.Equal(p) || !reflect.DeepEqual(before, p) {
			t.Fatalf("plan %d: clone differs", i)
		}
		for name, change := range planChanges(p) {
			q := p.Clone()
			change(&q)
			if !p.Equal(before) {
				t.Fatalf("plan %d: %s on a clone changed the original", i, name)
			}
		}
	}
}

// TestMatchTypesComparable: Equal compares every match type but MatchPort
// with ==, which panics on a type holding a slice, map or func.
func TestMatchTypesComparable(t *testing.T) {
	for _, m := range []redirect.Match{redirect.MatchProto{}, redirect.MatchAddr{}, redirect.MatchSet{}, redirect.MatchIface{},
		redirect.MatchOwner{}, redirect.MatchMark{}, redirect.MatchCTState{}} {
		if !reflect.TypeOf(m).Comparable() {
			t.Errorf("%T is not comparable: Equal must compare it field by field", m)
		}
	}
	for _, v := range []redirect.Verdict{redirect.Accept{}, redirect.Drop{}, redirect.Return{}, redirect.Jump{}, redirect.Redirect{},
		redirect.TProxy{}, redirect.SetMark{}, redirect.SaveMark{}, redirect.RestoreMark{}, redirect.SetCTZone{}} {
		if !reflect.TypeOf(v).Comparable() {
			t.Errorf("%T is not comparable: Equal must compare it field by field", v)
		}
	}
}

func BenchmarkPlanEqual(b *testing.B) {
	s := redirect.DefaultSpec()
	s.IPv6 = true
	p, err := redirect.Build(s)
	if err != nil {
		b.Fatal(err)
	}
	q := p.Clone()
	for b.Loop() {
		if !p.Equal(q) {
			b.Fatal("unequal")
		}
	}
}
