package redirect

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// Direction says where a traced packet comes from.
type Direction uint8

const (
	// DirOut is a connection a process in the pod opens (the app, or the
	// proxy under its UID/GID).
	DirOut Direction = iota + 1
	// DirIn is a connection arriving at the pod from outside.
	DirIn
)

func (d Direction) String() string {
	switch d {
	case DirOut:
		return "out"
	case DirIn:
		return "in"
	}
	return fmt.Sprintf("direction(%d)", uint8(d))
}

// Packet is the first packet of a connection, as the tracer sees it.
type Packet struct {
	Dir   Direction
	Proto Proto // ProtoTCP or ProtoUDP
	// Src is the source address; the zero value means unknown, and a rule
	// that needs it is then an error rather than a guess.
	Src netip.Addr
	// SrcPort is the source port; 0 means an ephemeral port, which no
	// service port of a plan matches.
	SrcPort uint16
	Dst     netip.AddrPort
	// UID and GID of the sending socket (DirOut only).
	UID, GID uint32
	// Iface is the output interface for DirOut ("lo" for the pod's own
	// addresses and loopback), the input interface for DirIn.
	Iface string
}

// Family is the packet's address family (FamilyIPv4 or FamilyIPv6).
func (p Packet) Family() Family {
	if p.Dst.Addr().Unmap().Is4() {
		return FamilyIPv4
	}
	return FamilyIPv6
}

func (p Packet) String() string {
	src := "?"
	if p.Src.IsValid() {
		src = p.Src.String()
	}
	s := fmt.Sprintf("%s %s %s → %s", p.Dir, p.Proto, src, p.Dst)
	if p.Dir == DirOut {
		return s + fmt.Sprintf(" uid %d gid %d oif %s", p.UID, p.GID, p.Iface)
	}
	return s + " iif " + p.Iface
}

// Outcome is where the traced connection ends up.
type Outcome string

const (
	OutcomeAccept   Outcome = "accept"   // left alone: it goes where it was sent
	OutcomeDrop     Outcome = "drop"     // dropped
	OutcomeRedirect Outcome = "redirect" // NAT to a local port (Port)
	OutcomeTProxy   Outcome = "tproxy"   // assigned to a transparent socket on Port, with Mark
)

// TraceVerdict is the end of a trace.
type TraceVerdict struct {
	Outcome Outcome `json:"outcome"`
	Port    uint16  `json:"port,omitempty"`
	Mark    uint32  `json:"mark,omitempty"`
}

// String is the verdict line: "redirect :15001", "tproxy :15006 mark 1337",
// "accept", "drop".
func (v TraceVerdict) String() string {
	switch v.Outcome {
	case OutcomeRedirect:
		return fmt.Sprintf("redirect :%d", v.Port)
	case OutcomeTProxy:
		return fmt.Sprintf("tproxy :%d mark %d", v.Port, v.Mark)
	}
	return string(v.Outcome)
}

// TraceStep is one rule the packet met (Rule ≥ 1, with Matched), or a note
// about a chain (Rule 0: entered, left through its policy, skipped). Chain
// is the Plan's name; people read ChainName(Table, Chain), as Format
// prints it.
type TraceStep struct {
	Hook    Hook
	Table   TableName
	Chain   string
	Rule    int    // 1-based position in the chain
	Text    string // the rule as Rule.Text prints it
	Matched bool
	// Decided marks the rule that gave the verdict.
	Decided bool
}

// Trace is the path of one packet through a plan.
type Trace struct {
	Packet  Packet
	Steps   []TraceStep
	Verdict TraceVerdict
}

// ErrUnknownSource is returned (wrapped) when a rule the packet reaches
// matches the source address and the Packet has none.
var ErrUnknownSource = errors.New("the rule matches the source address, which the packet does not give")

// maxJumpDepth bounds nested jumps, so a plan with a jump loop is an error
// instead of a hang (the kernel refuses loops when rules are loaded).
const maxJumpDepth = 16

// TracePacket follows pkt through p as the kernel would: for DirOut the
// output hook (raw, mangle, nat OUTPUT by priority) and, when the packet
// leaves on lo (its own addresses, loopback, or after a REDIRECT), its return
// through prerouting on lo (raw and mangle: nat already saw the connection);
// for DirIn the prerouting hook. It traces the first packet of a connection
// (conntrack state new, marks zero) and assumes the proxy listens, so a
// TPROXY rule delivers. A match or verdict the tracer does not know, or one
// that cannot apply at the hook, is an error, never a silent pass.
func TracePacket(p *Plan, pkt Packet) (Trace, error) {
	if err := pkt.validate(); err != nil {
		return Trace{}, err
	}
	t := &tracer{plan: p, pkt: pkt, fam: pkt.Family(), dst: pkt.Dst, src: pkt.Src.Unmap(), decided: -1}
	var err error
	var final *TraceVerdict
	if pkt.Dir == DirIn {
		t.iif = pkt.Iface
		final, err = t.hook(HookPrerouting, false)
	} else {
		t.oif = pkt.Iface
		final, err = t.hook(HookOutput, false)
		if err == nil && final == nil && (t.oif == "lo" || t.landing != nil) {
			// Back in through lo: nat already decided this connection.
			t.oif, t.iif = "", "lo"
			final, err = t.hook(HookPrerouting, true)
		}
	}
	if err != nil {
		return Trace{}, fmt.Errorf("tracing %s: %w", pkt, err)
	}
	tr := Trace{Packet: pkt, Steps: t.steps, Verdict: TraceVerdict{Outcome: OutcomeAccept}}
	switch {
	case final != nil:
		tr.Verdict = *final
	case t.landing != nil:
		tr.Verdict = *t.landing
	}
	if t.decided >= 0 {
		tr.Steps[t.decided].Decided = true
	}
	return tr, nil
}

func (pkt Packet) validate() error {
	switch {
	case pkt.Dir != DirOut && pkt.Dir != DirIn:
		return fmt.Errorf("tracing a packet: direction %s is not out or in", pkt.Dir)
	case pkt.Proto != ProtoTCP && pkt.Proto != ProtoUDP:
		return fmt.Errorf("tracing a packet: protocol %s is not tcp or udp", pkt.Proto)
	case !pkt.Dst.IsValid() || pkt.Dst.Port() == 0:
		return fmt.Errorf("tracing a packet: destination %s needs an address and a port", pkt.Dst)
	case pkt.Src.IsValid() && pkt.Src.Unmap().Is4() != pkt.Dst.Addr().Unmap().Is4():
		return fmt.Errorf("tracing a packet: source %s and destination %s are of different families", pkt.Src, pkt.Dst)
	case pkt.Iface == "":
		return fmt.Errorf("tracing a packet: no interface")
	}
	return nil
}

type tracer struct {
	plan     *Plan
	pkt      Packet
	fam      Family
	src      netip.Addr
	dst      netip.AddrPort
	iif, oif string
	mark     uint32
	ctmark   uint32
	zone     uint16
	steps    []TraceStep
	// landing is a REDIRECT already applied; decided indexes the step that
	// gave the verdict (-1: none did, the policies accepted).
	landing *TraceVerdict
	decided int
}

// exit records a matched accept or return as the rule that decided (for a
// packet left alone, the last rule that let it go), unless a redirect did.
func (t *tracer) exit(step int) {
	if t.landing == nil {
		t.decided = step
	}
}

// result of running a chain.
type chainEnd uint8

const (
	endFallThrough chainEnd = iota // end of chain or return
	endAccept
	endDrop
	endRedirect
	endTProxy
	endNext // within a chain only: go on with the next rule
)

type baseChain struct {
	table *Table
	chain *Chain
}

// hook runs the base chains attached to h by priority. A non-nil verdict
// ends the packet's path (drop, tproxy).
func (t *tracer) hook(h Hook, natDone bool) (*TraceVerdict, error) {
	if t.plan.TableFlags&TableDormant != 0 {
		return nil, nil // no chain of a dormant table sees a packet
	}
	var bases []baseChain
	for ti := range t.plan.Tables {
		tab := &t.plan.Tables[ti]
		for ci := range tab.Chains {
			if c := &tab.Chains[ci]; c.Hook == h {
				bases = append(bases, baseChain{tab, c})
			}
		}
	}
	slices.SortStableFunc(bases, func(a, b baseChain) int { return cmp.Compare(a.chain.Priority, b.chain.Priority) })
	for _, b := range bases {
		if natDone && b.chain.Type == ChainTypeNat {
			t.note(h, b.table.Name, b.chain.Name, "not consulted: nat saw this connection on its way out")
			continue
		}
		t.note(h, b.table.Name, b.chain.Name, fmt.Sprintf("enter (iif %s, oif %s, mark %d)", cmp.Or(t.iif, "-"), cmp.Or(t.oif, "-"), t.mark))
		end, err := t.chain(h, b.table, b.chain, 0)
		if err != nil {
			return nil, err
		}
		switch end {
		case endFallThrough:
			t.note(h, b.table.Name, b.chain.Name, "policy "+b.chain.Policy.String())
			if b.chain.Policy == PolicyDrop {
				return &TraceVerdict{Outcome: OutcomeDrop}, nil
			}
		case endDrop:
			return &TraceVerdict{Outcome: OutcomeDrop}, nil
		case endTProxy:
			return t.landing, nil
		}
	}
	return nil, nil
}

func (t *tracer) note(h Hook, tab TableName, chain, text string) {
	t.steps = append(t.steps, TraceStep{Hook: h, Table: tab, Chain: chain, Text: text})
}

func (t *tracer) chain(h Hook, tab *Table, c *Chain, depth int) (chainEnd, error) {
	if depth > maxJumpDepth {
		return 0, fmt.Errorf("chain %s: more than %d nested jumps", ChainName(tab.Name, c.Name), maxJumpDepth)
	}
	for i, r := range c.Rules {
		if !r.Family.Includes(t.fam) {
			continue // the other family's rule set (iptables vs ip6tables)
		}
		ok, err := t.matches(h, r.Matches)
		if err != nil {
			return 0, fmt.Errorf("chain %s rule %d (%s): %w", ChainName(tab.Name, c.Name), i+1, r.Text(tab.Name), err)
		}
		t.steps = append(t.steps, TraceStep{Hook: h, Table: tab.Name, Chain: c.Name, Rule: i + 1, Text: r.Text(tab.Name), Matched: ok})
		if !ok {
			continue
		}
		var end chainEnd
		if j, isJump := r.Verdict.(Jump); isJump {
			target := tab.Chain(j.Chain)
			if target == nil || target.IsBase() {
				return 0, fmt.Errorf("chain %s rule %d: jump to %s, which is not a regular chain of the table", ChainName(tab.Name, c.Name), i+1, ChainName(tab.Name, j.Chain))
			}
			if end, err = t.chain(h, tab, target, depth+1); err != nil {
				return 0, err
			}
			if end == endFallThrough {
				end = endNext
			}
		} else if end, err = t.verdict(h, tab.Name, r.Verdict, len(t.steps)-1); err != nil {
			return 0, fmt.Errorf("chain %s rule %d: %w", ChainName(tab.Name, c.Name), i+1, err)
		}
		if end != endNext {
			return end, nil
		}
	}
	return endFallThrough, nil
}

// verdict applies a matched rule's verdict other than a jump; at is the
// rule's step. endNext goes on with the chain's next rule.
func (t *tracer) verdict(h Hook, tab TableName, v Verdict, at int) (chainEnd, error) {
	switch v := v.(type) {
	case Accept:
		t.exit(at)
		return endAccept, nil
	case Drop:
		t.decided = at
		return endDrop, nil
	case Return:
		t.exit(at)
		return endFallThrough, nil
	case Redirect:
		if tab != TableNat {
			return 0, fmt.Errorf("redirect outside the nat table")
		}
		// Locally sent connections are redirected to the loopback
		// address; arriving ones to the input interface's address,
		// which only the port of matters here.
		addr := t.dst.Addr()
		if h == HookOutput {
			addr = netip.IPv6Loopback()
			if t.fam == FamilyIPv4 {
				addr = netip.AddrFrom4([4]byte{127, 0, 0, 1})
			}
			t.oif = "lo"
		}
		t.dst = netip.AddrPortFrom(addr, v.Port)
		t.landing = &TraceVerdict{Outcome: OutcomeRedirect, Port: v.Port}
		t.decided = at
		return endRedirect, nil
	case TProxy:
		if h != HookPrerouting || tab != TableMangle {
			return 0, fmt.Errorf("tproxy outside mangle prerouting")
		}
		mask := FullMask(v.Mask)
		t.mark = t.mark&^mask | v.Mark&mask
		t.landing = &TraceVerdict{Outcome: OutcomeTProxy, Port: v.Port, Mark: v.Mark}
		t.decided = at
		return endTProxy, nil
	case SetMark:
		t.mark = v.Mark
	case SaveMark:
		t.ctmark = t.mark
	case RestoreMark:
		t.mark = t.ctmark
	case SetCTZone:
		if t.zone == 0 {
			t.zone = v.Zone
		}
	default:
		return 0, fmt.Errorf("verdict %T is not supported by the tracer", v)
	}
	return endNext, nil
}

// matches evaluates a rule's matches in order, stopping at the first that
// fails, as the kernel does: a later one that cannot be evaluated is not reached.
func (t *tracer) matches(h Hook, ms []Match) (bool, error) {
	for _, m := range ms {
		ok, err := t.match(h, m)
		if err != nil || !ok {
			return false, err
		}
	}
	return true, nil
}

func (t *tracer) match(h Hook, m Match) (bool, error) {
	switch m := m.(type) {
	case MatchProto:
		return t.pkt.Proto == m.Proto, nil
	case MatchPort:
		port := t.dst.Port()
		if m.Source {
			port = t.pkt.SrcPort
		}
		return slices.Contains(m.Ports, port) != m.Negate, nil
	case MatchAddr:
		if m.Prefix.Addr().Is4() != (t.fam == FamilyIPv4) {
			return false, fmt.Errorf("address match %s in a rule for %s packets", m.Prefix, t.fam)
		}
		a := t.dst.Addr()
		if m.Source {
			if !t.src.IsValid() {
				return false, ErrUnknownSource
			}
			a = t.src
		}
		return m.Prefix.Contains(a.Unmap()) != m.Negate, nil
	case MatchSet:
		in, err := t.inSet(m)
		if err != nil {
			return false, err
		}
		return in != m.Negate, nil
	case MatchIface:
		name := t.iif
		switch {
		case m.Out && h != HookOutput:
			return false, fmt.Errorf("output interface match at hook %s, where there is none yet", h)
		case !m.Out && h != HookPrerouting:
			return false, fmt.Errorf("input interface match at hook %s, where there is none", h)
		case m.Out:
			name = t.oif
		}
		return ifaceMatches(m.Name, name) != m.Negate, nil
	case MatchOwner:
		if h != HookOutput {
			return false, fmt.Errorf("socket owner match at hook %s: only locally sent packets have one", h)
		}
		id := t.pkt.UID
		if m.GID {
			id = t.pkt.GID
		}
		return (id == m.ID) != m.Negate, nil
	case MatchMark:
		v := t.mark
		if m.Conn {
			v = t.ctmark
		}
		return (v&FullMask(m.Mask) == m.Value) != m.Negate, nil
	case MatchCTState:
		// The first packet of a connection is new.
		return (m.States&CTStateNew != 0) != m.Negate, nil
	}
	return false, fmt.Errorf("match %T is not supported by the tracer", m)
}

// inSet reports whether the packet's destination port or address is an
// element of the set m names.
func (t *tracer) inSet(m MatchSet) (bool, error) {
	set := t.plan.Set(m.Set)
	if set == nil {
		return false, fmt.Errorf("set %s does not exist", m.Set)
	}
	if set.Kind != m.Kind {
		return false, fmt.Errorf("set %s is of kind %s, the match expects %s", m.Set, set.Kind, m.Kind)
	}
	switch set.Kind {
	case SetPort:
		return slices.Contains(set.Ports, t.dst.Port()), nil
	case SetIPv4, SetIPv6:
		if (set.Kind == SetIPv4) != (t.fam == FamilyIPv4) {
			return false, fmt.Errorf("set %s holds %s, the packet is %s", m.Set, set.Kind, t.fam)
		}
		return slices.ContainsFunc(set.Prefixes, func(p netip.Prefix) bool { return p.Contains(t.dst.Addr().Unmap()) }), nil
	}
	return false, fmt.Errorf("set %s: kind %s is not supported by the tracer", m.Set, set.Kind)
}

// ifaceMatches is iptables' interface match: a trailing "+" matches any name
// with that prefix.
func ifaceMatches(pattern, name string) bool {
	if prefix, ok := strings.CutSuffix(pattern, "+"); ok {
		return strings.HasPrefix(name, prefix)
	}
	return pattern == name
}

// Format renders the trace for people: the packet, each chain entered with
// the rules met (matched ones marked, the deciding one called out), and a
// last line "verdict: ...".
func (tr Trace) Format() string {
	var b strings.Builder
	fmt.Fprintf(&b, "packet: %s\n", tr.Packet)
	var hook Hook
	where := ""
	for _, s := range tr.Steps {
		if s.Hook != hook {
			hook = s.Hook
			fmt.Fprintf(&b, "hook %s:\n", hook)
			where = ""
		}
		if w := ChainName(s.Table, s.Chain); w != where {
			where = w
			fmt.Fprintf(&b, "  %s\n", w)
		}
		switch {
		case s.Rule == 0:
			fmt.Fprintf(&b, "    - %s\n", s.Text)
		case s.Decided:
			fmt.Fprintf(&b, "    %3d %s   <== decides\n", s.Rule, s.Text)
		case s.Matched:
			fmt.Fprintf(&b, "    %3d %s   (matched)\n", s.Rule, s.Text)
		default:
			fmt.Fprintf(&b, "    %3d %s\n", s.Rule, s.Text)
		}
	}
	fmt.Fprintf(&b, "verdict: %s\n", tr.Verdict)
	return b.String()
}
