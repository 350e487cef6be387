package nft

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/nftmesh/nftmesh/redirect"
)

// reg is the one data register every rule uses; rules are short and never
// need two values live at once.
const reg = unix.NFT_REG_1

// ifnameLen is IFNAMSIZ: the kernel compares interface names as 16 bytes.
const ifnameLen = unix.IFNAMSIZ

// Offsets in the IPv4, IPv6 and transport headers.
const (
	ip4SaddrOff = 12
	ip4DaddrOff = 16
	ip6SaddrOff = 8
	ip6DaddrOff = 24
	thSportOff  = 0
	thDportOff  = 2
)

// program is a Plan translated into nftables objects. Building it is pure;
// only queue talks to a Conn.
type program struct {
	table  *nftables.Table
	sets   []setObj
	chains []*nftables.Chain
	rules  []ruleObj
}

type setObj struct {
	set   *nftables.Set
	elems []nftables.SetElement
}

type ruleObj struct {
	chain *nftables.Chain
	exprs []expr.Any
	anon  []setObj // the rule's anonymous sets, queued right before it as nft does
}

// maxElemsPerMsg keeps one NEWSETELEM message well below the 64 KiB limit
// of a netlink attribute (an interval element is ~40 bytes).
const maxElemsPerMsg = 1024

func encode(p redirect.Plan, table string) (*program, error) {
	if err := p.Verify(); err != nil {
		return nil, fmt.Errorf("verifying plan: %w", err)
	}
	if p.TableFlags != 0 {
		// Only List finds them (google/nftables v0.3.0 writes none).
		return nil, fmt.Errorf("table flags %s: nftmesh writes none", p.TableFlags)
	}
	prog := &program{table: &nftables.Table{Name: table, Family: nftables.TableFamilyINet}}
	// Set IDs are chosen here, not by google/nftables' global counter, so
	// concurrent Applies never share state; they only need to be unique
	// within one batch.
	var nextID uint32
	id := func() uint32 { nextID++; return nextID }
	sets := map[string]*nftables.Set{}
	for _, s := range p.Sets {
		so, err := encodeSet(prog.table, s)
		if err != nil {
			return nil, err
		}
		so.set.ID = id()
		sets[s.Name] = so.set
		prog.sets = append(prog.sets, so)
	}
	for _, t := range p.Tables {
		for _, c := range t.Chains {
			if err := checkChainName(t.Name, c.Name); err != nil {
				return nil, err
			}
			ch := &nftables.Chain{Name: ChainName(t.Name, c.Name), Table: prog.table}
			if c.IsBase() {
				hook, herr := encodeHook(c.Hook)
				typ, terr := encodeChainType(c.Type)
				if err := cmp.Or(herr, terr); err != nil {
					return nil, fmt.Errorf("chain %s/%s: %w", t.Name, c.Name, err)
				}
				pol, perr := encodePolicy(c.Policy)
				if perr != nil {
					return nil, fmt.Errorf("chain %s/%s: %w", t.Name, c.Name, perr)
				}
				ch.Hooknum, ch.Type, ch.Policy = hook, typ, &pol
				ch.Priority = nftables.ChainPriorityRef(nftables.ChainPriority(c.Priority))
			}
			prog.chains = append(prog.chains, ch)
			for i, r := range c.Rules {
				ro, err := encodeRule(prog.table, t.Name, r, sets, id)
				if err != nil {
					return nil, fmt.Errorf("encoding %s/%s rule %d (%s): %w", t.Name, c.Name, i+1, r, err)
				}
				ro.chain = ch
				prog.rules = append(prog.rules, ro)
			}
		}
	}
	return prog, nil
}

// tailChunks are the named sets' elements beyond the first chunk, one
// NEWSETELEM message each. They may go anywhere after the set in the batch.
func (prog *program) tailChunks() []setObj {
	var out []setObj
	for _, s := range prog.sets {
		if len(s.elems) <= maxElemsPerMsg {
			continue
		}
		for rest := s.elems[maxElemsPerMsg:]; len(rest) > 0; {
			n := min(len(rest), maxElemsPerMsg)
			out = append(out, setObj{s.set, rest[:n]})
			rest = rest[n:]
		}
	}
	return out
}

func encodeHook(h redirect.Hook) (*nftables.ChainHook, error) {
	switch h {
	case redirect.HookPrerouting:
		return nftables.ChainHookRef(unix.NF_INET_PRE_ROUTING), nil
	case redirect.HookOutput:
		return nftables.ChainHookRef(unix.NF_INET_LOCAL_OUT), nil
	}
	return nil, fmt.Errorf("unsupported hook %q", h)
}

func encodePolicy(p redirect.ChainPolicy) (nftables.ChainPolicy, error) {
	switch p {
	case redirect.PolicyAccept:
		return nftables.ChainPolicyAccept, nil
	case redirect.PolicyDrop:
		return nftables.ChainPolicyDrop, nil
	}
	return 0, fmt.Errorf("unsupported policy %s", p)
}

func encodeChainType(t redirect.ChainType) (nftables.ChainType, error) {
	switch t {
	case redirect.ChainTypeNat, redirect.ChainTypeFilter, redirect.ChainTypeRoute:
		return nftables.ChainType(t), nil // the same names (decodeChain)
	}
	return "", fmt.Errorf("unsupported chain type %q", t)
}

func encodeSet(t *nftables.Table, s redirect.Set) (setObj, error) {
	so := setObj{set: &nftables.Set{Table: t, Name: s.Name}}
	switch s.Kind {
	case redirect.SetPort:
		// An interval set of merged ranges, not a plain set: for a 2-byte
		// key the kernel keeps a plain set as a bitmap whose every insert
		// walks the elements already there, ~10 s for 45,000 ports in
		// one batch; an interval set takes any port list in ~0.2 s at
		// worst (docs/performance.md, "Large port lists").
		so.set.KeyType = nftables.TypeInetService
		so.set.Interval = true
		so.elems = portIntervalElements(redirect.MergePorts(s.Ports))
	case redirect.SetIPv4, redirect.SetIPv6:
		so.set.KeyType = nftables.TypeIPAddr
		if s.Kind == redirect.SetIPv6 {
			so.set.KeyType = nftables.TypeIP6Addr
		}
		so.set.Interval = true
		so.elems = intervalElements(redirect.MergePrefixes(s.Prefixes))
	default:
		return so, fmt.Errorf("set %s: unsupported kind %s", s.Name, s.Kind)
	}
	return so, nil
}

// intervalElements encodes ranges the way the kernel's interval sets store
// them: a start element, then an end element holding end+1 flagged
// IntervalEnd. A range reaching the top of the address space has no end+1;
// it is left open (a start without an end), as nft does.
func intervalElements(rs []redirect.AddrRange) []nftables.SetElement {
	out := make([]nftables.SetElement, 0, 2*len(rs))
	if len(rs) == 0 {
		return out
	}
	// One backing array for all keys: at 10,000 ranges, per-key
	// allocations are a visible share of Apply.
	n := rs[0].From.BitLen() / 8
	buf := make([]byte, 0, 2*n*len(rs))
	key := func(a netip.Addr) []byte {
		start := len(buf)
		buf, _ = a.AppendBinary(buf) // no zone: 4 or 16 bytes
		return buf[start:len(buf):len(buf)]
	}
	for _, r := range rs {
		out = append(out, nftables.SetElement{Key: key(r.From)})
		if next := r.To.Next(); next.IsValid() {
			out = append(out, nftables.SetElement{Key: key(next), IntervalEnd: true})
		}
	}
	return out
}

// portIntervalElements is intervalElements for port ranges: a range up to
// 65535 has no end element.
func portIntervalElements(rs []redirect.PortRange) []nftables.SetElement {
	out := make([]nftables.SetElement, 0, 2*len(rs))
	buf := make([]byte, 0, 4*len(rs))
	key := func(p uint16) []byte {
		buf = binary.BigEndian.AppendUint16(buf, p)
		return buf[len(buf)-2 : len(buf) : len(buf)]
	}
	for _, r := range rs {
		out = append(out, nftables.SetElement{Key: key(r.From)})
		if r.To < 0xffff {
			out = append(out, nftables.SetElement{Key: key(r.To + 1), IntervalEnd: true})
		}
	}
	return out
}

func be16(v uint16) []byte { return binary.BigEndian.AppendUint16(nil, v) }

func ne32(v uint32) []byte { return binaryutil.NativeEndian.PutUint32(v) }

func ne16(v uint16) []byte { return binaryutil.NativeEndian.PutUint16(v) }

func nfproto(f redirect.Family) byte {
	if f == redirect.FamilyIPv6 {
		return unix.NFPROTO_IPV6
	}
	return unix.NFPROTO_IPV4
}

func cmpOp(negate bool) expr.CmpOp {
	if negate {
		return expr.CmpOpNeq
	}
	return expr.CmpOpEq
}

// encodeRule: a family guard for one-family rules, the matches in order,
// then the verdict.
func encodeRule(nt *nftables.Table, table redirect.TableName, r redirect.Rule, sets map[string]*nftables.Set, id func() uint32) (ruleObj, error) {
	// A family guard, three expressions a match at most, three for the
	// verdict, the mark after a tproxy: room for all, one allocation.
	ro := ruleObj{exprs: make([]expr.Any, 0, 2+3*len(r.Matches)+6)}
	switch r.Family {
	case redirect.FamilyAny:
	case redirect.FamilyIPv4, redirect.FamilyIPv6:
		ro.add(&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: reg},
			&expr.Cmp{Op: expr.CmpOpEq, Register: reg, Data: []byte{nfproto(r.Family)}})
	default:
		return ro, fmt.Errorf("unsupported family %s", r.Family)
	}
	for _, m := range r.Matches {
		if err := ro.match(nt, r.Family, m, sets, id); err != nil {
			return ro, err
		}
	}
	err := ro.verdict(table, r.Family, r.Verdict)
	return ro, err
}

func (ro *ruleObj) add(es ...expr.Any) { ro.exprs = append(ro.exprs, es...) }

func (ro *ruleObj) match(nt *nftables.Table, fam redirect.Family, m redirect.Match, sets map[string]*nftables.Set, id func() uint32) error {
	switch m := m.(type) {
	case redirect.MatchProto:
		ro.add(&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg},
			&expr.Cmp{Op: expr.CmpOpEq, Register: reg, Data: []byte{byte(m.Proto)}})
	case redirect.MatchPort:
		ro.portMatch(nt, m, id)
	case redirect.MatchAddr:
		off, length := addrField(fam, m.Source)
		ro.add(&expr.Payload{DestRegister: reg, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: length})
		pfx := m.Prefix.Masked()
		if pfx.Bits() < pfx.Addr().BitLen() {
			ro.add(&expr.Bitwise{SourceRegister: reg, DestRegister: reg, Len: length,
				Mask: net.CIDRMask(pfx.Bits(), pfx.Addr().BitLen()), Xor: make([]byte, length)})
		}
		ro.add(&expr.Cmp{Op: cmpOp(m.Negate), Register: reg, Data: pfx.Addr().AsSlice()})
	case redirect.MatchSet:
		return ro.setMatch(fam, m, sets)
	case redirect.MatchIface:
		key := expr.MetaKeyIIFNAME
		if m.Out {
			key = expr.MetaKeyOIFNAME
		}
		data, err := ifnameBytes(m.Name)
		if err != nil {
			return err
		}
		ro.add(&expr.Meta{Key: key, Register: reg}, &expr.Cmp{Op: cmpOp(m.Negate), Register: reg, Data: data})
	case redirect.MatchOwner:
		key := expr.MetaKeySKUID
		if m.GID {
			key = expr.MetaKeySKGID
		}
		ro.add(&expr.Meta{Key: key, Register: reg}, &expr.Cmp{Op: cmpOp(m.Negate), Register: reg, Data: ne32(m.ID)})
	case redirect.MatchMark:
		ro.markMatch(m)
	case redirect.MatchCTState:
		if m.States == 0 {
			return fmt.Errorf("ct state match without states")
		}
		// "ct state x": (state & x) != 0; negated: == 0.
		op := expr.CmpOpNeq
		if m.Negate {
			op = expr.CmpOpEq
		}
		ro.add(&expr.Ct{Key: expr.CtKeySTATE, Register: reg},
			&expr.Bitwise{SourceRegister: reg, DestRegister: reg, Len: 4, Mask: ne32(uint32(m.States)), Xor: ne32(0)},
			&expr.Cmp{Op: op, Register: reg, Data: ne32(0)})
	default:
		return fmt.Errorf("unsupported match %T", m)
	}
	return nil
}

// portMatch compares one port, or looks a port list up in an anonymous set.
func (ro *ruleObj) portMatch(nt *nftables.Table, m redirect.MatchPort, id func() uint32) {
	off := uint32(thDportOff)
	if m.Source {
		off = thSportOff
	}
	ro.add(&expr.Payload{DestRegister: reg, Base: expr.PayloadBaseTransportHeader, Offset: off, Len: 2})
	if len(m.Ports) == 1 {
		ro.add(&expr.Cmp{Op: cmpOp(m.Negate), Register: reg, Data: be16(m.Ports[0])})
		return
	}
	set := &nftables.Set{Table: nt, Name: "__set%d", ID: id(), Anonymous: true, Constant: true, KeyType: nftables.TypeInetService}
	var elems []nftables.SetElement
	for _, p := range redirect.SortedPorts(m.Ports) {
		elems = append(elems, nftables.SetElement{Key: be16(p)})
	}
	ro.anon = append(ro.anon, setObj{set: set, elems: elems})
	ro.add(&expr.Lookup{SourceRegister: reg, SetName: set.Name, SetID: set.ID, Invert: m.Negate})
}

func (ro *ruleObj) setMatch(fam redirect.Family, m redirect.MatchSet, sets map[string]*nftables.Set) error {
	s := sets[m.Set]
	switch m.Kind {
	case redirect.SetPort:
		ro.add(&expr.Payload{DestRegister: reg, Base: expr.PayloadBaseTransportHeader, Offset: thDportOff, Len: 2})
	case redirect.SetIPv4, redirect.SetIPv6:
		off, length := addrField(fam, false)
		ro.add(&expr.Payload{DestRegister: reg, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: length})
	default:
		return fmt.Errorf("set %s: unsupported kind %s", m.Set, m.Kind)
	}
	ro.add(&expr.Lookup{SourceRegister: reg, SetName: s.Name, SetID: s.ID, Invert: m.Negate})
	return nil
}

func (ro *ruleObj) markMatch(m redirect.MatchMark) {
	if m.Conn {
		ro.add(&expr.Ct{Key: expr.CtKeyMARK, Register: reg})
	} else {
		ro.add(&expr.Meta{Key: expr.MetaKeyMARK, Register: reg})
	}
	mask := redirect.FullMask(m.Mask)
	if mask != 0xffffffff {
		ro.add(&expr.Bitwise{SourceRegister: reg, DestRegister: reg, Len: 4, Mask: ne32(mask), Xor: ne32(0)})
	}
	ro.add(&expr.Cmp{Op: cmpOp(m.Negate), Register: reg, Data: ne32(m.Value & mask)})
}

func (ro *ruleObj) verdict(table redirect.TableName, fam redirect.Family, v redirect.Verdict) error {
	switch v := v.(type) {
	case redirect.Accept:
		ro.add(&expr.Verdict{Kind: expr.VerdictAccept})
	case redirect.Drop:
		ro.add(&expr.Verdict{Kind: expr.VerdictDrop})
	case redirect.Return:
		ro.add(&expr.Verdict{Kind: expr.VerdictReturn})
	case redirect.Jump:
		ro.add(&expr.Verdict{Kind: expr.VerdictJump, Chain: ChainName(table, v.Chain)})
	case redirect.Redirect:
		ro.add(&expr.Immediate{Register: reg, Data: be16(v.Port)}, &expr.Redir{RegisterProtoMin: reg})
	case redirect.TProxy:
		if fam != redirect.FamilyIPv4 && fam != redirect.FamilyIPv6 {
			return fmt.Errorf("tproxy needs an IPv4 or IPv6 rule")
		}
		ro.add(&expr.Immediate{Register: reg, Data: be16(v.Port)},
			&expr.TProxy{Family: nfproto(fam), TableFamily: byte(nftables.TableFamilyINet), RegPort: reg})
		ro.add(markSet(v.Mark, v.Mask)...)
		ro.add(&expr.Verdict{Kind: expr.VerdictAccept})
	case redirect.SetMark:
		ro.add(markSet(v.Mark, 0xffffffff)...)
	case redirect.SaveMark:
		ro.add(&expr.Meta{Key: expr.MetaKeyMARK, Register: reg}, &expr.Ct{Key: expr.CtKeyMARK, Register: reg, SourceRegister: true})
	case redirect.RestoreMark:
		ro.add(&expr.Ct{Key: expr.CtKeyMARK, Register: reg}, &expr.Meta{Key: expr.MetaKeyMARK, Register: reg, SourceRegister: true})
	case redirect.SetCTZone:
		ro.add(&expr.Immediate{Register: reg, Data: ne16(v.Zone)}, &expr.Ct{Key: expr.CtKeyZONE, Register: reg, SourceRegister: true})
	default:
		return fmt.Errorf("unsupported verdict %T", v)
	}
	return nil
}

// markSet sets the packet mark to value under mask, as iptables' MARK and
// TPROXY --tproxy-mark value/mask do: mark = (mark & ^mask) ^ value.
func markSet(value, mask uint32) []expr.Any {
	mask = redirect.FullMask(mask)
	if mask == 0xffffffff {
		return []expr.Any{
			&expr.Immediate{Register: reg, Data: ne32(value)},
			&expr.Meta{Key: expr.MetaKeyMARK, Register: reg, SourceRegister: true},
		}
	}
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: reg},
		&expr.Bitwise{SourceRegister: reg, DestRegister: reg, Len: 4, Mask: ne32(^mask), Xor: ne32(value)},
		&expr.Meta{Key: expr.MetaKeyMARK, Register: reg, SourceRegister: true},
	}
}

func addrField(f redirect.Family, source bool) (off, length uint32) {
	if f == redirect.FamilyIPv6 {
		if source {
			return ip6SaddrOff, 16
		}
		return ip6DaddrOff, 16
	}
	if source {
		return ip4SaddrOff, 4
	}
	return ip4DaddrOff, 4
}

// ifnameBytes is the comparison operand for an interface name: the name
// NUL-padded to IFNAMSIZ, or just the prefix for a trailing "+" wildcard.
func ifnameBytes(name string) ([]byte, error) {
	if prefix, ok := strings.CutSuffix(name, "+"); ok {
		if prefix == "" || len(prefix) >= ifnameLen {
			return nil, fmt.Errorf("interface wildcard %q: prefix must be 1-%d bytes", name, ifnameLen-1)
		}
		return []byte(prefix), nil
	}
	if name == "" || len(name) >= ifnameLen {
		return nil, fmt.Errorf("interface name %q: must be 1-%d bytes", name, ifnameLen-1)
	}
	b := make([]byte, ifnameLen)
	copy(b, name)
	return b, nil
}
