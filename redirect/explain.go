package redirect

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// DriftEffect is one packet that the live rules treat differently from the
// planned ones.
type DriftEffect struct {
	Packet  Packet
	Planned TraceVerdict
	Live    TraceVerdict
	Why     string // the rule behind the difference (driftWhy)
}

func (e DriftEffect) String() string {
	return fmt.Sprintf("%s: planned %s, live %s (%s)", e.Packet, e.Planned, e.Live, e.Why)
}

// maxExplainPackets bounds the packets ExplainDrift traces, so a plan with
// huge sets stays quick to explain.
const maxExplainPackets = 20000

// Remote addresses (documentation ranges) standing for "anywhere else".
var (
	explainRemoteV4 = netip.MustParseAddr("203.0.113.10")
	explainRemoteV6 = netip.MustParseAddr("2001:db8:f::10")
)

// ExplainDrift traces representative packets through want and live and
// returns those whose verdicts differ, each with the rule that explains it.
// The packets are made from what either plan matches on (every address
// prefix and set element, port, owner ID and interface name), plus a remote
// address, ports 80 and 443 and an app sender (UID/GID 1000); local names
// the pod's own addresses (a packet to them leaves on lo). A packet the
// tracer cannot follow through either plan is skipped, not guessed.
func ExplainDrift(want, live *Plan, local []netip.Addr) []DriftEffect {
	var out []DriftEffect
	seen := map[string]bool{}
	for _, pkt := range explainPackets(want, live, local) {
		pw, errW := TracePacket(want, pkt)
		pl, errL := TracePacket(live, pkt)
		if errW != nil || errL != nil || pw.Verdict == pl.Verdict {
			continue
		}
		why := driftWhy(pw, pl, live, want)
		key := pw.Verdict.String() + "|" + pl.Verdict.String() + "|" + why
		if seen[key] {
			continue // one packet per distinct difference
		}
		seen[key] = true
		out = append(out, DriftEffect{Packet: pkt, Planned: pw.Verdict, Live: pl.Verdict, Why: why})
	}
	return out
}

// driftWhy names the rule behind a difference: a live table switched off,
// or a base chain hooked otherwise than planned; the planned deciding rule
// if the live chain does not have it, else the live deciding rule if the
// plan does not have it, else the first matched rule either lacks, else
// that the rules differ in order or in a set.
func driftWhy(pw, pl Trace, live, want *Plan) string {
	if live.TableFlags&TableDormant != 0 && want.TableFlags&TableDormant == 0 {
		return "the live table is dormant: none of its chains sees a packet"
	}
	if s := baseChainDiffers(live, want); s != "" {
		return s
	}
	for _, decidedOnly := range []bool{true, false} {
		if s := lackedStep(pw, live, decidedOnly); s != nil {
			return fmt.Sprintf("missing rule in %s: %s", ChainName(s.Table, s.Chain), s.Text)
		}
		if s := lackedStep(pl, want, decidedOnly); s != nil {
			return fmt.Sprintf("unexpected rule in %s: %s", ChainName(s.Table, s.Chain), s.Text)
		}
	}
	return "the rules are reordered, or a set's elements differ"
}

// baseChainDiffers describes the first base chain of want that live hooks
// with another hook, type, priority or policy, or "".
func baseChainDiffers(live, want *Plan) string {
	for _, t := range want.Tables {
		for _, w := range t.Chains {
			if !w.IsBase() {
				continue
			}
			lt := live.Table(t.Name)
			if lt == nil {
				continue
			}
			l := lt.Chain(w.Name)
			if l == nil || l.Hook == w.Hook && l.Type == w.Type && l.Priority == w.Priority && l.Policy == w.Policy {
				continue
			}
			return fmt.Sprintf("live chain %s is type %s hook %s priority %d policy %s, planned type %s hook %s priority %d policy %s",
				ChainName(t.Name, w.Name), l.Type, cmp.Or(string(l.Hook), "none"), l.Priority, l.Policy, w.Type, w.Hook, w.Priority, w.Policy)
		}
	}
	return ""
}

// lackedStep is the first matched rule of tr (the deciding one, if
// decidedOnly) that p does not have, or nil.
func lackedStep(tr Trace, p *Plan, decidedOnly bool) *TraceStep {
	for i, s := range tr.Steps {
		if s.Rule > 0 && s.Matched && (s.Decided || !decidedOnly) && !hasRule(p, &s) {
			return &tr.Steps[i]
		}
	}
	return nil
}

func hasRule(p *Plan, s *TraceStep) bool {
	if t := p.Table(s.Table); t != nil {
		if c := t.Chain(s.Chain); c != nil {
			return slices.ContainsFunc(c.Rules, func(r Rule) bool { return r.Text(t.Name) == s.Text })
		}
	}
	return false
}

// explainVocab is what the representative packets are made of (see
// ExplainDrift), and the families the plans have rules for.
type explainVocab struct {
	addrs     map[Family][]netip.Addr
	ports     []uint16
	ids       []uint32
	ifaces    []string
	hasFamily map[Family]bool
}

func (v *explainVocab) addAddr(a netip.Addr) {
	a = a.Unmap()
	f := FamilyIPv6
	if a.Is4() {
		f = FamilyIPv4
	}
	if !slices.Contains(v.addrs[f], a) {
		v.addrs[f] = append(v.addrs[f], a)
	}
}

func (v *explainVocab) addPort(p uint16) {
	if p != 0 && !slices.Contains(v.ports, p) {
		v.ports = append(v.ports, p)
	}
}

func (v *explainVocab) addPlan(p *Plan) {
	for _, s := range p.Sets {
		for _, pr := range s.Prefixes {
			v.addAddr(hostIn(pr))
		}
		for _, port := range s.Ports {
			v.addPort(port)
		}
	}
	for _, t := range p.Tables {
		for _, c := range t.Chains {
			for _, r := range c.Rules {
				v.hasFamily[FamilyIPv4] = v.hasFamily[FamilyIPv4] || r.Family.Includes(FamilyIPv4)
				v.hasFamily[FamilyIPv6] = v.hasFamily[FamilyIPv6] || r.Family.Includes(FamilyIPv6)
				for _, m := range r.Matches {
					v.addMatch(m)
				}
			}
		}
	}
}

func (v *explainVocab) addMatch(m Match) {
	switch m := m.(type) {
	case MatchPort:
		if !m.Source {
			for _, port := range m.Ports {
				v.addPort(port)
			}
		}
	case MatchAddr:
		if !m.Source {
			v.addAddr(hostIn(m.Prefix))
		}
	case MatchOwner:
		if !slices.Contains(v.ids, m.ID) {
			v.ids = append(v.ids, m.ID)
		}
	case MatchIface:
		name := strings.TrimSuffix(m.Name, "+")
		if strings.HasSuffix(m.Name, "+") {
			name += "0"
		}
		if !m.Out && name != "lo" && !slices.Contains(v.ifaces, name) {
			v.ifaces = append(v.ifaces, name)
		}
	}
}

// explainPackets builds the representative packets of want and live.
func explainPackets(want, live *Plan, local []netip.Addr) []Packet {
	v := &explainVocab{
		addrs: map[Family][]netip.Addr{
			FamilyIPv4: {explainRemoteV4},
			FamilyIPv6: {explainRemoteV6},
		},
		ports:     []uint16{80, 443},
		ifaces:    []string{"eth0"},
		hasFamily: map[Family]bool{},
	}
	for _, a := range local {
		v.addAddr(a)
	}
	v.addPlan(want)
	v.addPlan(live)
	var out []Packet
	for _, f := range []Family{FamilyIPv4, FamilyIPv6} {
		if !v.hasFamily[f] {
			continue
		}
		var full bool
		if out, full = v.outPackets(out, f, local); full {
			return out
		}
		out = v.inPackets(out, f, local)
		if len(out) >= maxExplainPackets {
			return out[:maxExplainPackets]
		}
	}
	return out
}

// outPackets appends the packets of family f leaving the pod, from each
// sender to each address and port; full reports that the bound is reached.
func (v *explainVocab) outPackets(out []Packet, f Family, local []netip.Addr) ([]Packet, bool) {
	type sender struct{ uid, gid uint32 }
	senders := []sender{{1000, 1000}}
	for _, id := range v.ids {
		senders = append(senders, sender{id, 1000}, sender{1000, id})
	}
	for _, dst := range v.addrs[f] {
		isLocal := dst.IsLoopback() || dst == InboundPassthroughV6.Addr() || slices.Contains(local, dst)
		for _, port := range v.ports {
			for _, proto := range []Proto{ProtoTCP, ProtoUDP} {
				ap := netip.AddrPortFrom(dst, port)
				for _, s := range senders {
					pkt := Packet{Dir: DirOut, Proto: proto, Dst: ap, UID: s.uid, GID: s.gid, Iface: "eth0", Src: explainSource(f, local)}
					if isLocal {
						pkt.Iface, pkt.Src = "lo", dst
						if f == FamilyIPv4 && dst.IsLoopback() {
							pkt.Src = netip.AddrFrom4([4]byte{127, 0, 0, 1})
						}
					}
					out = append(out, pkt)
				}
				if len(out) >= maxExplainPackets {
					return out, true
				}
			}
		}
	}
	return out, false
}

// inPackets appends the packets of family f arriving at the pod's address,
// on each interface a plan names.
func (v *explainVocab) inPackets(out []Packet, f Family, local []netip.Addr) []Packet {
	src, pod := explainRemoteV4, explainSource(f, local)
	if f == FamilyIPv6 {
		src = explainRemoteV6
	}
	for _, port := range v.ports {
		for _, proto := range []Proto{ProtoTCP, ProtoUDP} {
			for _, iface := range v.ifaces {
				out = append(out, Packet{Dir: DirIn, Proto: proto, Dst: netip.AddrPortFrom(pod, port), Src: src, Iface: iface})
			}
		}
	}
	return out
}

// hostIn is an address inside p: the first host of a network, the address
// itself for a single-address prefix.
func hostIn(p netip.Prefix) netip.Addr {
	a := p.Masked().Addr()
	if p.Bits() < a.BitLen() {
		if n := a.Next(); n.IsValid() && p.Contains(n) {
			return n
		}
	}
	return a
}

// explainSource is the source of a packet leaving the pod: its address of
// the family if known, else a documentation address no plan matches.
func explainSource(f Family, local []netip.Addr) netip.Addr {
	for _, a := range local {
		if a.Unmap().Is4() == (f == FamilyIPv4) && !a.IsLoopback() {
			return a.Unmap()
		}
	}
	if f == FamilyIPv4 {
		return netip.MustParseAddr("192.0.2.2")
	}
	return netip.MustParseAddr("2001:db8::2")
}
