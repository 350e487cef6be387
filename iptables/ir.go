package iptables

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/nftmesh/nftmesh/redirect"
)

// The lowered form of a Plan for one address family: what one x_tables entry
// holds. Render prints it, the encoder turns it into bytes and the decoder
// produces it from bytes, so the text and the kernel blob cannot drift apart.

// commentTag marks every rule we install. Rules expanded from a set carry
// the set's name after it, so List can fold them back into one set match.
const (
	commentTag    = "nftmesh"
	commentSetTag = commentTag + " set "
	ourChainPref  = "ISTIO_"
)

// Netfilter hooks in x_tables numbering.
const (
	hookPrerouting = iota
	hookInput
	hookForward
	hookOutput
	hookPostrouting
	numHooks
)

var hookChainNames = [numHooks]string{"PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"}

// builtinHooks lists the hooks of each table we may touch, as registered by
// the kernel (iptable_nat, iptable_mangle, iptable_raw, iptable_filter).
var builtinHooks = map[string][]int{
	"raw":    {hookPrerouting, hookOutput},
	"mangle": {hookPrerouting, hookInput, hookForward, hookOutput, hookPostrouting},
	"nat":    {hookPrerouting, hookInput, hookOutput, hookPostrouting},
	"filter": {hookInput, hookForward, hookOutput},
}

func hookOf(chain string) (int, bool) {
	h := slices.Index(hookChainNames[:], chain)
	return h, h >= 0
}

// xrule is one x_tables rule: the fixed ip header part, matches, a target.
type xrule struct {
	src, dst       netip.Prefix // zero value = any
	invSrc, invDst bool
	in, out        string
	invIn, invOut  bool
	proto          uint8
	invProto       bool
	matches        []xmatch
	target         xtarget
}

type xmatch interface{ save(b *strings.Builder) }

type (
	// mPort is the "tcp" / "udp" match with one port.
	mPort struct {
		udp, src, inv bool
		port          uint16
	}
	mMultiport struct {
		src, inv bool
		ports    []uint16
	}
	mOwner struct {
		gid, inv bool
		id       uint32
	}
	mMark struct {
		conn, inv   bool
		value, mask uint32
	}
	mConntrack struct {
		states redirect.CTState
		inv    bool
	}
	mComment struct{ text string }
)

type xtarget interface {
	save(b *strings.Builder, fam redirect.Family)
}

// Standard verdicts as x_tables stores them (-NF_x - 1; RETURN is -NF_REPEAT - 1).
const (
	verdictDrop   int32 = -1
	verdictAccept int32 = -2
	verdictReturn int32 = -5
)

type (
	tVerdict  struct{ v int32 }
	tJump     struct{ chain string }
	tRedirect struct{ port uint16 }
	tTProxy   struct {
		port       uint16
		mark, mask uint32
	}
	tMark     struct{ mark, mask uint32 }
	tConnmark struct {
		mode           uint8 // xtConnmarkSave or xtConnmarkRestore
		nfmask, ctmask uint32
	}
	tCT struct{ zone uint16 }
)

const (
	xtConnmarkSave    = 1
	xtConnmarkRestore = 2
)

type xchain struct {
	name    string
	builtin bool
	// policy is a builtin chain's, as read (its owner's: never written).
	policy redirect.ChainPolicy
	rules  []xrule
}

// xtable is the part of one table that is ours, for one family.
type xtable struct {
	name   string
	chains []xchain // builtin chains in hook order, then user chains sorted by name
}

// lowerPlan projects a Plan onto one family. Tables with no rule for the
// family are left out; the others list every builtin chain of the table and
// every regular chain of the plan's table (the way iptables-save prints them).
func lowerPlan(p redirect.Plan, fam redirect.Family) ([]xtable, error) {
	if fam != redirect.FamilyIPv4 && fam != redirect.FamilyIPv6 {
		return nil, fmt.Errorf("lowering plan: family %s is not ipv4 or ipv6", fam)
	}
	if p.TableFlags != 0 {
		return nil, fmt.Errorf("lowering plan: table flags %s: x_tables has none", p.TableFlags)
	}
	var out []xtable
	for _, t := range p.Tables {
		hooks, ok := builtinHooks[string(t.Name)]
		if !ok {
			return nil, fmt.Errorf("lowering plan: table %s is not an x_tables table", t.Name)
		}
		xt := xtable{name: string(t.Name)}
		for _, h := range hooks {
			xt.chains = append(xt.chains, xchain{name: hookChainNames[h], builtin: true})
		}
		var users []xchain
		any := false
		for _, c := range t.Chains {
			var rules []xrule
			for i, r := range c.Rules {
				if !r.Family.Includes(fam) {
					continue
				}
				xs, err := lowerRule(p, r, fam)
				if err != nil {
					return nil, fmt.Errorf("lowering %s rule %d of %s/%s: %w", fam, i+1, t.Name, c.Name, err)
				}
				rules = append(rules, xs...)
				any = true
			}
			if _, builtin := hookOf(c.Name); builtin {
				i := slices.IndexFunc(xt.chains, func(x xchain) bool { return x.name == c.Name })
				if i < 0 {
					return nil, fmt.Errorf("lowering plan: table %s has no builtin chain %s", t.Name, c.Name)
				}
				xt.chains[i].rules = append(xt.chains[i].rules, rules...)
				xt.chains[i].policy = c.Policy
				continue
			}
			if c.Policy != redirect.PolicyAccept {
				return nil, fmt.Errorf("lowering plan: %s/%s: a user chain has no policy", t.Name, c.Name)
			}
			if !strings.HasPrefix(c.Name, ourChainPref) || len(c.Name) > maxChainName {
				return nil, fmt.Errorf("lowering plan: chain name %q must start with %s and be at most %d bytes", c.Name, ourChainPref, maxChainName)
			}
			users = append(users, xchain{name: c.Name, rules: rules})
		}
		if !any {
			continue
		}
		slices.SortFunc(users, func(a, b xchain) int { return strings.Compare(a.name, b.name) })
		xt.chains = append(xt.chains, users...)
		out = append(out, xt)
	}
	return out, nil
}

// maxChainName is XT_EXTENSION_MAXNAMELEN-1 for the ERROR target's name.
const maxChainName = 28

// maxMultiport is XT_MULTI_PORTS.
const maxMultiport = 15

// lowerRule turns one Plan rule into one or more x_tables rules: a set match
// becomes one rule per element (iptables has no sets without ipset).
func lowerRule(p redirect.Plan, r redirect.Rule, fam redirect.Family) ([]xrule, error) {
	lw := lowering{p: p, fam: fam, comment: commentTag}
	for _, m := range r.Matches {
		if err := lw.match(m); err != nil {
			return nil, err
		}
	}
	t, err := lowerVerdict(r.Verdict, fam, lw.haveProto)
	if err != nil {
		return nil, err
	}
	lw.base.target = t
	return lw.rules()
}

// lowering is the state of lowering one rule: the rule built so far and
// which of x_tables' single slots its matches used.
type lowering struct {
	p       redirect.Plan
	fam     redirect.Family
	base    xrule
	comment string
	// proto is the protocol match seen so far, if haveProto.
	proto     redirect.Proto
	haveProto bool
	// expand holds the alternatives produced by a set match or a long port
	// list; each alternative adds one match or header field to the base
	// rule, at a nil placeholder in base.matches.
	expand                            []func(*xrule) error
	setUsed                           bool
	usedSrc, usedDst, usedIn, usedOut bool
}

func (lw *lowering) setAddr(x *xrule, src bool, pr netip.Prefix, inv bool) error {
	if (lw.fam == redirect.FamilyIPv4) != pr.Addr().Is4() {
		return fmt.Errorf("address %s in an %s rule", pr, lw.fam)
	}
	if src {
		x.src, x.invSrc = pr.Masked(), inv
	} else {
		x.dst, x.invDst = pr.Masked(), inv
	}
	return nil
}

func (lw *lowering) addMatch(m xmatch) { lw.base.matches = append(lw.base.matches, m) }

// alternatives makes each of ms one alternative of the rule, in place of a
// placeholder.
func (lw *lowering) alternatives(ms []xmatch) {
	for _, m := range ms {
		lw.expand = append(lw.expand, func(x *xrule) error { x.matches = append(x.matches, m); return nil })
	}
	lw.addMatch(nil)
}

func (lw *lowering) tcpOrUDP() (ok, udp bool) {
	ok = lw.haveProto && (lw.proto == redirect.ProtoTCP || lw.proto == redirect.ProtoUDP)
	return ok, lw.proto == redirect.ProtoUDP
}

func (lw *lowering) match(m redirect.Match) error {
	switch m := m.(type) {
	case redirect.MatchProto:
		if lw.haveProto {
			return fmt.Errorf("two protocol matches")
		}
		lw.proto, lw.haveProto = m.Proto, true
		lw.base.proto = uint8(m.Proto)
	case redirect.MatchAddr:
		if (m.Source && lw.usedSrc) || (!m.Source && lw.usedDst) {
			return fmt.Errorf("two %s address matches (x_tables holds one)", srcDst(m.Source))
		}
		lw.usedSrc, lw.usedDst = lw.usedSrc || m.Source, lw.usedDst || !m.Source
		return lw.setAddr(&lw.base, m.Source, m.Prefix, m.Negate)
	case redirect.MatchIface:
		return lw.iface(m)
	case redirect.MatchPort:
		return lw.port(m)
	case redirect.MatchSet:
		return lw.set(m)
	case redirect.MatchOwner:
		lw.addMatch(mOwner{gid: m.GID, inv: m.Negate, id: m.ID})
	case redirect.MatchMark:
		lw.addMatch(mMark{conn: m.Conn, inv: m.Negate, value: m.Value, mask: redirect.FullMask(m.Mask)})
	case redirect.MatchCTState:
		lw.addMatch(mConntrack{states: m.States, inv: m.Negate})
	default:
		return fmt.Errorf("unsupported match %T", m)
	}
	return nil
}

func (lw *lowering) iface(m redirect.MatchIface) error {
	if len(m.Name) == 0 || len(m.Name) >= 16 {
		return fmt.Errorf("interface name %q is empty or longer than 15 bytes", m.Name)
	}
	if m.Out {
		if lw.usedOut {
			return fmt.Errorf("two output interface matches")
		}
		lw.usedOut, lw.base.out, lw.base.invOut = true, m.Name, m.Negate
		return nil
	}
	if lw.usedIn {
		return fmt.Errorf("two input interface matches")
	}
	lw.usedIn, lw.base.in, lw.base.invIn = true, m.Name, m.Negate
	return nil
}

// port lowers a port match: one port, a multiport list, or a list too
// long for multiport expanded into several rules.
func (lw *lowering) port(m redirect.MatchPort) error {
	ok, udp := lw.tcpOrUDP()
	if !ok || len(m.Ports) == 0 {
		return fmt.Errorf("port match needs a tcp or udp protocol match before it and at least one port")
	}
	switch {
	case len(m.Ports) == 1:
		lw.addMatch(mPort{udp: udp, src: m.Source, inv: m.Negate, port: m.Ports[0]})
	case len(m.Ports) <= maxMultiport:
		lw.addMatch(mMultiport{src: m.Source, inv: m.Negate, ports: slices.Clone(m.Ports)})
	case m.Negate:
		return fmt.Errorf("negated port list of %d ports exceeds multiport's %d", len(m.Ports), maxMultiport)
	default:
		if len(lw.expand) > 0 {
			return fmt.Errorf("more than one expanding match (long port list or set) in one rule")
		}
		var ms []xmatch
		for chunk := range slices.Chunk(m.Ports, maxMultiport) {
			ms = append(ms, mMultiport{src: m.Source, ports: slices.Clone(chunk)})
		}
		lw.alternatives(ms)
	}
	return nil
}

// set lowers a set match into one rule per element, or a negated port set
// into one negated multiport; the comment names the set for List.
func (lw *lowering) set(m redirect.MatchSet) error {
	s := lw.p.Set(m.Set)
	if s == nil || s.Kind != m.Kind {
		return fmt.Errorf("set %s missing or of another kind", m.Set)
	}
	if lw.setUsed || len(lw.expand) > 0 {
		return fmt.Errorf("more than one set match in one rule")
	}
	lw.setUsed = true
	lw.comment = commentSetTag + s.Name
	switch s.Kind {
	case redirect.SetPort:
		ok, udp := lw.tcpOrUDP()
		if !ok {
			return fmt.Errorf("port set %s needs a tcp or udp protocol match before it", s.Name)
		}
		if m.Negate {
			if len(s.Ports) > maxMultiport {
				return fmt.Errorf("negated port set %s has %d ports, multiport holds %d", s.Name, len(s.Ports), maxMultiport)
			}
			lw.addMatch(mMultiport{inv: true, ports: slices.Clone(s.Ports)})
			return nil
		}
		var ms []xmatch
		for _, port := range s.Ports {
			ms = append(ms, mPort{udp: udp, port: port})
		}
		lw.alternatives(ms)
	case redirect.SetIPv4, redirect.SetIPv6:
		if lw.usedDst {
			return fmt.Errorf("address set %s and another destination match in one rule", s.Name)
		}
		lw.usedDst = true
		if m.Negate && len(s.Prefixes) != 1 {
			return fmt.Errorf("negated address set %s with %d elements cannot be one x_tables rule", s.Name, len(s.Prefixes))
		}
		for _, pr := range s.Prefixes {
			lw.expand = append(lw.expand, func(x *xrule) error { return lw.setAddr(x, false, pr, m.Negate) })
		}
	default:
		return fmt.Errorf("set %s has unknown kind %s", s.Name, s.Kind)
	}
	return nil
}

// rules is the lowered rule, or one rule per alternative, each ending
// with the comment.
func (lw *lowering) rules() ([]xrule, error) {
	finish := func(x xrule) xrule {
		x.matches = append(x.matches, mComment{text: lw.comment})
		return x
	}
	if len(lw.expand) == 0 {
		if lw.setUsed { // an address set with no elements matches nothing
			return nil, nil
		}
		return []xrule{finish(lw.base)}, nil
	}
	out := make([]xrule, 0, len(lw.expand))
	for _, alt := range lw.expand {
		x := lw.base
		x.matches = nil
		tmp := xrule{}
		if err := alt(&tmp); err != nil {
			return nil, err
		}
		// Fill the placeholder in place so match order follows the Plan.
		for _, m := range lw.base.matches {
			if m == nil {
				x.matches = append(x.matches, tmp.matches...)
				continue
			}
			x.matches = append(x.matches, m)
		}
		if tmp.dst.IsValid() {
			x.dst, x.invDst = tmp.dst, tmp.invDst
		}
		out = append(out, finish(x))
	}
	return out, nil
}

func srcDst(src bool) string {
	if src {
		return "source"
	}
	return "destination"
}

func lowerVerdict(v redirect.Verdict, fam redirect.Family, haveProto bool) (xtarget, error) {
	switch v := v.(type) {
	case redirect.Accept:
		return tVerdict{verdictAccept}, nil
	case redirect.Drop:
		return tVerdict{verdictDrop}, nil
	case redirect.Return:
		return tVerdict{verdictReturn}, nil
	case redirect.Jump:
		return tJump{v.Chain}, nil
	case redirect.Redirect:
		if !haveProto {
			return nil, fmt.Errorf("REDIRECT needs a protocol match")
		}
		return tRedirect{v.Port}, nil
	case redirect.TProxy:
		if !haveProto {
			return nil, fmt.Errorf("TPROXY needs a protocol match")
		}
		return tTProxy{port: v.Port, mark: v.Mark, mask: redirect.FullMask(v.Mask)}, nil
	case redirect.SetMark:
		return tMark{mark: v.Mark, mask: 0xffffffff}, nil
	case redirect.SaveMark:
		return tConnmark{mode: xtConnmarkSave, nfmask: 0xffffffff, ctmask: 0xffffffff}, nil
	case redirect.RestoreMark:
		return tConnmark{mode: xtConnmarkRestore, nfmask: 0xffffffff, ctmask: 0xffffffff}, nil
	case redirect.SetCTZone:
		return tCT{v.Zone}, nil
	case nil:
		return nil, fmt.Errorf("rule has no verdict")
	}
	return nil, fmt.Errorf("unsupported verdict %T", v)
}
