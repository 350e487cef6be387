package iptables

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/nftmesh/nftmesh/redirect"
)

// x_tables keeps the ip header fields (addresses, interfaces, protocol) in
// fixed slots and forgets in which order a Plan listed them, and it has no
// per-family-pair rules. So the Plan we read back is canonical: in every
// rule the header matches come first (source, destination, in, out,
// protocol), then the other matches in order; a rule present in both
// families at the same place is FamilyAny; base chains come first, then
// regular chains by name. Canonical puts a wanted Plan in the same form, and
// Check compares canonical forms.

// Canonical returns p with the rule, match and chain order x_tables can
// represent; it is equivalent to p packet for packet.
func Canonical(p redirect.Plan) redirect.Plan {
	out := p
	out.Tables = nil
	for _, t := range p.Tables {
		nt := redirect.Table{Name: t.Name}
		for _, c := range canonicalChains(t.Chains) {
			nc := c
			var seq [2][]redirect.Rule
			for i, fam := range []redirect.Family{redirect.FamilyIPv4, redirect.FamilyIPv6} {
				for _, r := range c.Rules {
					if r.Family.Includes(fam) {
						seq[i] = append(seq[i], redirect.Rule{Family: fam, Matches: canonicalMatches(r.Matches), Verdict: r.Verdict})
					}
				}
			}
			nc.Rules = mergeFamilies(seq[0], seq[1])
			nt.Chains = append(nt.Chains, nc)
		}
		out.Tables = append(out.Tables, nt)
	}
	return out
}

func canonicalChains(cs []redirect.Chain) []redirect.Chain {
	out := slices.Clone(cs)
	rank := func(c redirect.Chain) int {
		switch c.Name {
		case redirect.ChainPrerouting:
			return 0
		case redirect.ChainOutput:
			return 1
		}
		return 2
	}
	slices.SortStableFunc(out, func(a, b redirect.Chain) int {
		if d := rank(a) - rank(b); d != 0 {
			return d
		}
		if rank(a) < 2 {
			return 0
		}
		return strings.Compare(a.Name, b.Name)
	})
	return out
}

// matchSlot orders header matches as x_tables stores them; everything
// else keeps its place after them.
func matchSlot(m redirect.Match) int {
	switch m := m.(type) {
	case redirect.MatchAddr:
		if m.Source {
			return 0
		}
		return 1
	case redirect.MatchSet:
		if m.Kind != redirect.SetPort {
			return 1
		}
	case redirect.MatchIface:
		if m.Out {
			return 3
		}
		return 2
	case redirect.MatchProto:
		return 4
	}
	return 5
}

func canonicalMatches(ms []redirect.Match) []redirect.Match {
	out := slices.Clone(ms)
	slices.SortStableFunc(out, func(a, b redirect.Match) int { return matchSlot(a) - matchSlot(b) })
	return out
}

// mergeFamilies interleaves the IPv4 and IPv6 rule sequences of one chain:
// rules equal but for the family (on a longest common subsequence) become
// one FamilyAny rule; between them, IPv4-only rules come before IPv6-only.
func mergeFamilies(v4, v6 []redirect.Rule) []redirect.Rule {
	keys := func(rs []redirect.Rule) []string {
		out := make([]string, len(rs))
		for i, r := range rs {
			r.Family = redirect.FamilyAny
			out[i] = r.String()
		}
		return out
	}
	a, b := keys(v4), keys(v6)
	var out []redirect.Rule
	for _, st := range redirect.Align(len(a), len(b), func(i, j int) bool { return a[i] == b[j] }, true) {
		switch {
		case st.A >= 0 && st.B >= 0:
			r := v4[st.A]
			r.Family = redirect.FamilyAny
			out = append(out, r)
		case st.A >= 0:
			out = append(out, v4[st.A])
		default:
			out = append(out, v6[st.B])
		}
	}
	return out
}

// decodedTable is our part of one table of one family, as read.
type decodedTable struct {
	name   string
	chains []xchain // builtin chains holding our rules, then our user chains
}

// raise turns the decoded tables of both families into a canonical Plan.
func raise(byFam map[redirect.Family][]decodedTable) (redirect.Plan, error) {
	var p redirect.Plan
	sets := map[string]*setAcc{}
	var setOrder []string
	type famRules map[redirect.Family][]redirect.Rule
	for _, tname := range []redirect.TableName{redirect.TableMangle, redirect.TableNat, redirect.TableRaw} {
		chains := map[string]famRules{}
		// A builtin chain's policy is per family; either dropping is a
		// drop for the one chain of the Plan.
		policies := map[string]redirect.ChainPolicy{}
		var names []string
		for _, fam := range []redirect.Family{redirect.FamilyIPv4, redirect.FamilyIPv6} {
			for _, dt := range byFam[fam] {
				if dt.name != string(tname) {
					continue
				}
				for _, xc := range dt.chains {
					if xc.builtin && len(xc.rules) == 0 {
						continue
					}
					if chains[xc.name] == nil {
						chains[xc.name] = famRules{}
						names = append(names, xc.name)
					}
					rules, err := raiseRules(xc.rules, fam, sets, &setOrder)
					if err != nil {
						return p, fmt.Errorf("reading %s %s/%s: %w", fam, tname, xc.name, err)
					}
					chains[xc.name][fam] = rules
					policies[xc.name] = max(policies[xc.name], xc.policy)
				}
			}
		}
		if len(names) == 0 {
			continue
		}
		t := redirect.Table{Name: tname}
		for _, name := range names {
			fr := chains[name]
			c := redirect.Chain{Name: name, Rules: mergeFamilies(fr[redirect.FamilyIPv4], fr[redirect.FamilyIPv6])}
			if h, ok := hookOf(name); ok {
				bc, ok := redirect.BuiltinChain(tname, name)
				if !ok || h != hookPrerouting && h != hookOutput {
					return p, fmt.Errorf("our rules in %s/%s, a chain nftmesh never uses", tname, name)
				}
				c.Hook, c.Type, c.Priority, c.Policy = bc.Hook, bc.Type, bc.Priority, policies[name]
			}
			t.Chains = append(t.Chains, c)
		}
		t.Chains = canonicalChains(t.Chains)
		p.Tables = append(p.Tables, t)
	}
	for _, name := range setOrder {
		p.Sets = append(p.Sets, sets[name].set)
	}
	return p, nil
}

// raiseRules converts one chain's rules and folds runs of rules expanded
// from one set (same set tag, equal but for the element) into one rule.
func raiseRules(xs []xrule, fam redirect.Family, sets map[string]*setAcc, order *[]string) ([]redirect.Rule, error) {
	var out []redirect.Rule
	lastKey, lastSet := "", ""
	for i, x := range xs {
		r, setName, el, err := raiseRule(x, fam)
		if err != nil {
			return nil, fmt.Errorf("rule %d: %w", i+1, err)
		}
		if setName != "" {
			s := sets[setName]
			if s == nil {
				s = &setAcc{set: redirect.Set{Name: setName, Kind: el.kind}, prefixes: map[netip.Prefix]bool{}, ports: map[uint16]bool{}}
				sets[setName] = s
				*order = append(*order, setName)
			}
			if s.set.Kind != el.kind {
				return nil, fmt.Errorf("rule %d: set %s holds %s and %s elements", i+1, setName, s.set.Kind, el.kind)
			}
			s.add(el)
			key := r.String()
			if setName == lastSet && key == lastKey {
				continue // another element of the same expanded rule
			}
			lastKey, lastSet = key, setName
		} else {
			lastKey, lastSet = "", ""
		}
		out = append(out, r)
	}
	return out, nil
}

// setAcc gathers a set from the rules it was expanded into, each element
// once, in the order first seen. The maps keep it linear: a port set can
// hold 45,000 ports (one rule each).
type setAcc struct {
	set      redirect.Set
	prefixes map[netip.Prefix]bool
	ports    map[uint16]bool
}

func (s *setAcc) add(el setElems) {
	for _, pr := range el.prefixes {
		if !s.prefixes[pr] {
			s.prefixes[pr] = true
			s.set.Prefixes = append(s.set.Prefixes, pr)
		}
	}
	for _, pt := range el.ports {
		if !s.ports[pt] {
			s.ports[pt] = true
			s.set.Ports = append(s.set.Ports, pt)
		}
	}
}

type setElems struct {
	kind     redirect.SetKind
	prefixes []netip.Prefix
	ports    []uint16
}

// raiseRule converts one decoded entry; for a set-tagged entry it replaces
// the element with a MatchSet and returns the set's name and element.
func raiseRule(x xrule, fam redirect.Family) (redirect.Rule, string, setElems, error) {
	r := redirect.Rule{Family: fam}
	setName, err := setTag(x.matches)
	if err != nil {
		return r, "", setElems{}, err
	}
	rs := raising{setName: setName, setAt: -1, portAt: -1}
	if err := rs.header(x, fam); err != nil {
		return r, "", setElems{}, err
	}
	for _, m := range x.matches {
		if err := rs.match(x, m); err != nil {
			return r, "", setElems{}, err
		}
	}
	if setName != "" && rs.setAt < 0 {
		// The element is the last plain destination port.
		if rs.portAt < 0 {
			return r, "", setElems{}, fmt.Errorf("rule tagged with set %s has no element to fold", setName)
		}
		p := rs.ms[rs.portAt].(redirect.MatchPort)
		rs.el = setElems{kind: redirect.SetPort, ports: p.Ports}
		rs.ms[rs.portAt] = redirect.MatchSet{Set: setName, Kind: redirect.SetPort}
	}
	r.Matches = rs.ms
	if r.Verdict, err = raiseTarget(x.target); err != nil {
		return r, "", setElems{}, err
	}
	return r, setName, rs.el, nil
}

// setTag reads our comment: the set the entry was expanded from, or "".
func setTag(ms []xmatch) (string, error) {
	comment := ""
	for _, m := range ms {
		if c, ok := m.(mComment); ok {
			comment = c.text
		}
	}
	switch {
	case comment == commentTag:
		return "", nil
	case strings.HasPrefix(comment, commentSetTag):
		return strings.TrimPrefix(comment, commentSetTag), nil
	}
	return "", fmt.Errorf("rule in our chain without the %q comment (%q)", commentTag, comment)
}

// raising is the state of raising one entry tagged with setName (or
// none). The set element is a destination address, else a negated
// multiport (negated port set), else the last plain destination port;
// setAt and portAt index them in ms.
type raising struct {
	setName       string
	ms            []redirect.Match
	el            setElems
	setAt, portAt int
}

// header raises the ip header fields, in x_tables' order.
func (rs *raising) header(x xrule, fam redirect.Family) error {
	if x.src.IsValid() {
		rs.ms = append(rs.ms, redirect.MatchAddr{Source: true, Prefix: x.src, Negate: x.invSrc})
	}
	if x.dst.IsValid() {
		if rs.setName != "" {
			kind := redirect.SetIPv4
			if fam == redirect.FamilyIPv6 {
				kind = redirect.SetIPv6
			}
			rs.el = setElems{kind: kind, prefixes: []netip.Prefix{x.dst}}
			rs.setAt = len(rs.ms)
			rs.ms = append(rs.ms, redirect.MatchSet{Set: rs.setName, Kind: kind, Negate: x.invDst})
		} else {
			rs.ms = append(rs.ms, redirect.MatchAddr{Prefix: x.dst, Negate: x.invDst})
		}
	}
	if x.in != "" {
		rs.ms = append(rs.ms, redirect.MatchIface{Name: x.in, Negate: x.invIn})
	}
	if x.out != "" {
		rs.ms = append(rs.ms, redirect.MatchIface{Out: true, Name: x.out, Negate: x.invOut})
	}
	if x.proto != 0 {
		if x.invProto || (x.proto != uint8(redirect.ProtoTCP) && x.proto != uint8(redirect.ProtoUDP)) {
			return fmt.Errorf("%w: protocol %s%d", errNotOurs, bang(x.invProto), x.proto)
		}
		rs.ms = append(rs.ms, redirect.MatchProto{Proto: redirect.Proto(x.proto)})
	}
	return nil
}

func (rs *raising) match(x xrule, m xmatch) error {
	switch m := m.(type) {
	case mPort:
		if m.udp != (x.proto == uint8(redirect.ProtoUDP)) || x.proto == 0 {
			return fmt.Errorf("%w: port match for another protocol", errNotOurs)
		}
		if !m.src && !m.inv {
			rs.portAt = len(rs.ms)
		}
		rs.ms = append(rs.ms, redirect.MatchPort{Source: m.src, Ports: []uint16{m.port}, Negate: m.inv})
	case mMultiport:
		if rs.setName != "" && rs.setAt < 0 && m.inv && !m.src {
			rs.el = setElems{kind: redirect.SetPort, ports: slices.Clone(m.ports)}
			rs.setAt = len(rs.ms)
			rs.ms = append(rs.ms, redirect.MatchSet{Set: rs.setName, Kind: redirect.SetPort, Negate: true})
			return nil
		}
		rs.ms = append(rs.ms, redirect.MatchPort{Source: m.src, Ports: slices.Clone(m.ports), Negate: m.inv})
	case mOwner:
		rs.ms = append(rs.ms, redirect.MatchOwner{GID: m.gid, ID: m.id, Negate: m.inv})
	case mMark:
		mask := m.mask
		if mask == 0xffffffff {
			mask = 0
		}
		rs.ms = append(rs.ms, redirect.MatchMark{Conn: m.conn, Value: m.value, Mask: mask, Negate: m.inv})
	case mConntrack:
		rs.ms = append(rs.ms, redirect.MatchCTState{States: m.states, Negate: m.inv})
	case mComment:
	default:
		return fmt.Errorf("%w: match %T", errNotOurs, m)
	}
	return nil
}

func raiseTarget(t xtarget) (redirect.Verdict, error) {
	switch t := t.(type) {
	case tVerdict:
		switch t.v {
		case verdictAccept:
			return redirect.Accept{}, nil
		case verdictDrop:
			return redirect.Drop{}, nil
		}
		return redirect.Return{}, nil
	case tJump:
		return redirect.Jump{Chain: t.chain}, nil
	case tRedirect:
		return redirect.Redirect{Port: t.port}, nil
	case tTProxy:
		return redirect.TProxy{Port: t.port, Mark: t.mark, Mask: t.mask}, nil
	case tMark:
		if t.mask != 0xffffffff {
			return nil, fmt.Errorf("%w: MARK with mask 0x%x", errNotOurs, t.mask)
		}
		return redirect.SetMark{Mark: t.mark}, nil
	case tConnmark:
		if t.nfmask != 0xffffffff || t.ctmask != 0xffffffff {
			return nil, fmt.Errorf("%w: CONNMARK masks", errNotOurs)
		}
		if t.mode == xtConnmarkSave {
			return redirect.SaveMark{}, nil
		}
		return redirect.RestoreMark{}, nil
	case tCT:
		return redirect.SetCTZone{Zone: t.zone}, nil
	}
	return nil, fmt.Errorf("%w: target %T", errNotOurs, t)
}
