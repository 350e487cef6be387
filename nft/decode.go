package nft

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"

	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/nftmesh/nftmesh/redirect"
)

// ruleDecoder turns one rule's expressions back into redirect vocabulary. It
// accepts exactly the patterns encodeRule produces; anything else is an
// error, because a rule we cannot name is drift we cannot report.
type ruleDecoder struct {
	table redirect.TableName
	es    []any
	i     int
	anon  map[string][]uint16         // anonymous sets' (__setN) ports
	sets  map[string]redirect.SetKind // named sets' kinds
	fam   redirect.Family
}

func (d *ruleDecoder) peek() any {
	if d.i < len(d.es) {
		return d.es[d.i]
	}
	return nil
}

func (d *ruleDecoder) next() any {
	e := d.peek()
	if e != nil {
		d.i++
	}
	return e
}

func (d *ruleDecoder) errf(format string, args ...any) error {
	return fmt.Errorf("expression %d: "+format, append([]any{d.i}, args...)...)
}

// cmp consumes a comparison on our register with the given operand length
// (0: any length) and returns its data and whether it is "!=".
func (d *ruleDecoder) cmp(length int) ([]byte, bool, error) {
	c, ok := d.next().(*expr.Cmp)
	if !ok || c.Register != reg || (c.Op != expr.CmpOpEq && c.Op != expr.CmpOpNeq) || (length > 0 && len(c.Data) != length) {
		return nil, false, d.errf("expected an == or != comparison of %d bytes", length)
	}
	return c.Data, c.Op == expr.CmpOpNeq, nil
}

func isLoad(e any, key expr.MetaKey) bool {
	m, ok := e.(*expr.Meta)
	return ok && m.Key == key && !m.SourceRegister && m.Register == reg
}

func isMetaSet(e any, key expr.MetaKey) bool {
	m, ok := e.(*expr.Meta)
	return ok && m.Key == key && m.SourceRegister && m.Register == reg
}

func isCtSet(e any, key expr.CtKey) bool {
	c, ok := e.(*expr.Ct)
	return ok && c.Key == key && c.SourceRegister && c.Register == reg
}

func (d *ruleDecoder) decode() (redirect.Rule, error) {
	var r redirect.Rule
	for d.peek() != nil {
		start := d.i
		if isLoad(d.peek(), expr.MetaKeyNFPROTO) {
			// The family guard: first in our rules; nft -f puts it right
			// before the ip/ip6 payload that needs it. Same meaning.
			d.i++
			f, err := d.family()
			if err != nil {
				return r, err
			}
			if d.fam != redirect.FamilyAny && d.fam != f {
				return r, d.errf("rule guarded for both %s and %s", d.fam, f)
			}
			d.fam = f
			continue
		}
		m, v, err := d.step()
		if err != nil {
			return r, err
		}
		if m != nil {
			r.Matches = append(r.Matches, m)
			continue
		}
		if v == nil {
			return r, fmt.Errorf("expression %d: nothing decoded", start)
		}
		if d.peek() != nil {
			return r, d.errf("expressions after the verdict %s", redirect.VerdictString(v))
		}
		r.Verdict = v
	}
	r.Family = d.fam
	if r.Verdict == nil {
		return r, fmt.Errorf("rule has no verdict")
	}
	return r, nil
}

func (d *ruleDecoder) family() (redirect.Family, error) {
	data, neg, err := d.cmp(1)
	if err != nil || neg {
		return 0, d.errf("meta nfproto must be an equality")
	}
	switch data[0] {
	case unix.NFPROTO_IPV4:
		return redirect.FamilyIPv4, nil
	case unix.NFPROTO_IPV6:
		return redirect.FamilyIPv6, nil
	}
	return 0, d.errf("unknown nfproto %d", data[0])
}

// step decodes one match or the verdict starting at the cursor.
func (d *ruleDecoder) step() (redirect.Match, redirect.Verdict, error) {
	switch e := d.next().(type) {
	case *expr.Meta:
		if e.SourceRegister || e.Register != reg {
			return nil, nil, d.errf("unexpected meta set")
		}
		return d.meta(e.Key)
	case *expr.Payload:
		if e.OperationType != expr.PayloadLoad || e.DestRegister != reg {
			return nil, nil, d.errf("unexpected payload write")
		}
		return d.payload(e)
	case *expr.Ct:
		if e.SourceRegister || e.Register != reg {
			return nil, nil, d.errf("unexpected ct set")
		}
		return d.ct(e.Key)
	case *expr.Immediate:
		if e.Register != reg {
			return nil, nil, d.errf("immediate into register %d", e.Register)
		}
		v, err := d.immediate(e)
		return nil, v, err
	case *expr.Verdict:
		v, err := d.verdict(e)
		return nil, v, err
	case nil:
		return nil, nil, d.errf("unexpected end of rule")
	default:
		return nil, nil, d.errf("unexpected %T", e)
	}
}

func (d *ruleDecoder) meta(key expr.MetaKey) (redirect.Match, redirect.Verdict, error) {
	switch key {
	case expr.MetaKeyL4PROTO:
		data, neg, err := d.cmp(1)
		if err != nil || neg {
			return nil, nil, d.errf("meta l4proto must be an equality")
		}
		return redirect.MatchProto{Proto: redirect.Proto(data[0])}, nil, nil
	case expr.MetaKeyIIFNAME, expr.MetaKeyOIFNAME:
		data, neg, err := d.cmp(0)
		if err != nil {
			return nil, nil, err
		}
		name, err := ifnameFromBytes(data)
		if err != nil {
			return nil, nil, d.errf("%v", err)
		}
		return redirect.MatchIface{Out: key == expr.MetaKeyOIFNAME, Name: name, Negate: neg}, nil, nil
	case expr.MetaKeySKUID, expr.MetaKeySKGID:
		data, neg, err := d.cmp(4)
		if err != nil {
			return nil, nil, err
		}
		return redirect.MatchOwner{GID: key == expr.MetaKeySKGID, ID: binaryutil.NativeEndian.Uint32(data), Negate: neg}, nil, nil
	case expr.MetaKeyMARK:
		switch n := d.peek().(type) {
		case *expr.Ct:
			if isCtSet(n, expr.CtKeyMARK) {
				d.i++
				return nil, redirect.SaveMark{}, nil
			}
		case *expr.Bitwise:
			if d.i+1 < len(d.es) && isMetaSet(d.es[d.i+1], expr.MetaKeyMARK) {
				v, mask, err := d.maskedMarkSet()
				if err != nil {
					return nil, nil, err
				}
				if _, ok := d.peek().(*expr.Verdict); ok {
					return nil, nil, d.errf("masked mark set followed by a verdict")
				}
				if mask != 0xffffffff {
					return nil, nil, d.errf("masked mark set outside tproxy")
				}
				return nil, redirect.SetMark{Mark: v}, nil
			}
		}
		m, err := d.markMatch(false)
		return m, nil, err
	}
	return nil, nil, d.errf("unsupported meta key %d", key)
}

// maskedMarkSet consumes "bitwise(^mask, value); meta mark set" after a
// meta mark load.
func (d *ruleDecoder) maskedMarkSet() (value, mask uint32, err error) {
	b, ok := d.next().(*expr.Bitwise)
	if !ok || b.Len != 4 || len(b.Mask) != 4 || len(b.Xor) != 4 {
		return 0, 0, d.errf("expected a 4-byte bitwise")
	}
	if !isMetaSet(d.next(), expr.MetaKeyMARK) {
		return 0, 0, d.errf("expected meta mark set")
	}
	return binaryutil.NativeEndian.Uint32(b.Xor), ^binaryutil.NativeEndian.Uint32(b.Mask), nil
}

// markMatch consumes "[bitwise mask] cmp" after a mark load.
func (d *ruleDecoder) markMatch(conn bool) (redirect.Match, error) {
	m := redirect.MatchMark{Conn: conn}
	if b, ok := d.peek().(*expr.Bitwise); ok {
		d.i++
		if b.Len != 4 || len(b.Mask) != 4 || !bytes.Equal(b.Xor, make([]byte, 4)) {
			return nil, d.errf("mark mask is not a plain AND")
		}
		m.Mask = binaryutil.NativeEndian.Uint32(b.Mask)
	}
	data, neg, err := d.cmp(4)
	if err != nil {
		return nil, err
	}
	m.Value, m.Negate = binaryutil.NativeEndian.Uint32(data), neg
	if m.Mask == 0xffffffff {
		m.Mask = 0
	}
	return m, nil
}

func (d *ruleDecoder) ct(key expr.CtKey) (redirect.Match, redirect.Verdict, error) {
	switch key {
	case expr.CtKeySTATE:
		b, ok := d.next().(*expr.Bitwise)
		if !ok || b.Len != 4 || len(b.Mask) != 4 || !bytes.Equal(b.Xor, make([]byte, 4)) {
			return nil, nil, d.errf("ct state without a bitmask")
		}
		data, neg, err := d.cmp(4)
		if err != nil || !bytes.Equal(data, make([]byte, 4)) {
			return nil, nil, d.errf("ct state must compare the masked state with 0")
		}
		// (state & x) != 0 is the positive match.
		return redirect.MatchCTState{States: redirect.CTState(binaryutil.NativeEndian.Uint32(b.Mask)), Negate: !neg}, nil, nil
	case expr.CtKeyMARK:
		if isMetaSet(d.peek(), expr.MetaKeyMARK) {
			d.i++
			return nil, redirect.RestoreMark{}, nil
		}
		m, err := d.markMatch(true)
		return m, nil, err
	}
	return nil, nil, d.errf("unsupported ct key %d", key)
}

func (d *ruleDecoder) payload(p *expr.Payload) (redirect.Match, redirect.Verdict, error) {
	switch p.Base {
	case expr.PayloadBaseTransportHeader:
		if p.Len != 2 || (p.Offset != thDportOff && p.Offset != thSportOff) {
			return nil, nil, d.errf("transport payload at %d/%d is not a port", p.Offset, p.Len)
		}
		source := p.Offset == thSportOff
		if lk, ok := d.peek().(*expr.Lookup); ok {
			d.i++
			if lk.SourceRegister != reg || lk.IsDestRegSet {
				return nil, nil, d.errf("lookup registers")
			}
			if ports, ok := d.anon[lk.SetName]; ok {
				return redirect.MatchPort{Source: source, Ports: ports, Negate: lk.Invert}, nil, nil
			}
			if k, ok := d.sets[lk.SetName]; ok && k == redirect.SetPort && !source {
				return redirect.MatchSet{Set: lk.SetName, Kind: k, Negate: lk.Invert}, nil, nil
			}
			return nil, nil, d.errf("port lookup in unknown set %q", lk.SetName)
		}
		data, neg, err := d.cmp(2)
		if err != nil {
			return nil, nil, err
		}
		return redirect.MatchPort{Source: source, Ports: []uint16{binary.BigEndian.Uint16(data)}, Negate: neg}, nil, nil
	case expr.PayloadBaseNetworkHeader:
		saddr, alen := addrField(d.fam, true)
		daddr, _ := addrField(d.fam, false)
		// nft -f loads only the bytes a prefix covers (10.0.0.0/8 → one
		// byte); we load the whole address. Both start at the field.
		if d.fam == redirect.FamilyAny || (p.Offset != saddr && p.Offset != daddr) || p.Len == 0 || p.Len > alen {
			return nil, nil, d.errf("network payload at %d/%d in a %s rule is not an address", p.Offset, p.Len, d.fam)
		}
		source := p.Offset == saddr
		if lk, ok := d.peek().(*expr.Lookup); ok {
			d.i++
			k, known := d.sets[lk.SetName]
			want := redirect.SetIPv4
			if d.fam == redirect.FamilyIPv6 {
				want = redirect.SetIPv6
			}
			if !known || k != want || source || p.Len != alen || lk.SourceRegister != reg || lk.IsDestRegSet {
				return nil, nil, d.errf("address lookup in unknown or mismatched set %q", lk.SetName)
			}
			return redirect.MatchSet{Set: lk.SetName, Kind: k, Negate: lk.Invert}, nil, nil
		}
		bits := int(p.Len) * 8
		if b, ok := d.peek().(*expr.Bitwise); ok {
			d.i++
			if b.Len != p.Len || !bytes.Equal(b.Xor, make([]byte, p.Len)) {
				return nil, nil, d.errf("address mask is not a plain AND")
			}
			ones, size := net.IPMask(b.Mask).Size()
			if size != 8*len(b.Mask) {
				return nil, nil, d.errf("address mask %x is not a prefix", b.Mask)
			}
			bits = ones
		}
		data, neg, err := d.cmp(int(p.Len))
		if err != nil {
			return nil, nil, err
		}
		full := make([]byte, alen)
		copy(full, data)
		addr, _ := netip.AddrFromSlice(full)
		pfx := netip.PrefixFrom(addr, bits)
		if pfx.Masked() != pfx {
			return nil, nil, d.errf("address %s has host bits under its mask", pfx)
		}
		return redirect.MatchAddr{Source: source, Prefix: pfx, Negate: neg}, nil, nil
	}
	return nil, nil, d.errf("unsupported payload base %d", p.Base)
}

func (d *ruleDecoder) verdict(v *expr.Verdict) (redirect.Verdict, error) {
	switch v.Kind {
	case expr.VerdictAccept:
		return redirect.Accept{}, nil
	case expr.VerdictDrop:
		return redirect.Drop{}, nil
	case expr.VerdictReturn:
		return redirect.Return{}, nil
	case expr.VerdictJump:
		t, c, err := splitChainName(v.Chain)
		if err != nil {
			return nil, d.errf("jump: %v", err)
		}
		if t != d.table {
			return nil, d.errf("jump from table %s to chain %s of table %s", d.table, v.Chain, t)
		}
		return redirect.Jump{Chain: c}, nil
	}
	return nil, d.errf("unsupported verdict kind %d", v.Kind)
}

// immediate decodes the statements that start by loading a constant: redirect,
// tproxy, mark set, ct zone set. The immediate itself is at d.i-1.
func (d *ruleDecoder) immediate(imm *expr.Immediate) (redirect.Verdict, error) {
	switch n := d.next().(type) {
	case *expr.Redir:
		if len(imm.Data) != 2 || n.RegisterProtoMin != reg || (n.RegisterProtoMax != 0 && n.RegisterProtoMax != reg) {
			return nil, d.errf("redirect operands")
		}
		return redirect.Redirect{Port: binary.BigEndian.Uint16(imm.Data)}, nil
	case *tproxyExpr:
		want := uint32(nfproto(d.fam))
		if len(imm.Data) != 2 || n.regPort != reg || n.regAddr != 0 || d.fam == redirect.FamilyAny || n.family != want {
			return nil, d.errf("tproxy operands")
		}
		t := redirect.TProxy{Port: binary.BigEndian.Uint16(imm.Data)}
		switch e := d.next().(type) {
		case *expr.Immediate:
			if e.Register != reg || len(e.Data) != 4 || !isMetaSet(d.next(), expr.MetaKeyMARK) {
				return nil, d.errf("tproxy mark set")
			}
			t.Mark, t.Mask = binaryutil.NativeEndian.Uint32(e.Data), 0xffffffff
		case *expr.Meta:
			if !isLoad(e, expr.MetaKeyMARK) {
				return nil, d.errf("tproxy mark set")
			}
			v, mask, err := d.maskedMarkSet()
			if err != nil {
				return nil, err
			}
			t.Mark, t.Mask = v, mask
		default:
			return nil, d.errf("tproxy without mark set")
		}
		if v, ok := d.next().(*expr.Verdict); !ok || v.Kind != expr.VerdictAccept {
			return nil, d.errf("tproxy must end with accept")
		}
		return t, nil
	case *expr.Meta:
		if !isMetaSet(n, expr.MetaKeyMARK) || len(imm.Data) != 4 {
			return nil, d.errf("immediate then meta %d", n.Key)
		}
		return redirect.SetMark{Mark: binaryutil.NativeEndian.Uint32(imm.Data)}, nil
	case *expr.Ct:
		if !isCtSet(n, expr.CtKeyZONE) || len(imm.Data) != 2 {
			return nil, d.errf("immediate then ct %d", n.Key)
		}
		return redirect.SetCTZone{Zone: binaryutil.NativeEndian.Uint16(imm.Data)}, nil
	}
	return nil, d.errf("immediate not followed by redirect, tproxy, mark or zone")
}

func ifnameFromBytes(b []byte) (string, error) {
	switch {
	case len(b) == ifnameLen:
		name, pad, _ := bytes.Cut(b, []byte{0})
		if len(name) == 0 || !bytes.Equal(pad, make([]byte, len(pad))) || len(name) == ifnameLen {
			return "", fmt.Errorf("interface name %q is not NUL-padded", b)
		}
		return string(name), nil
	case len(b) > 0 && len(b) < ifnameLen && bytes.IndexByte(b, 0) < 0:
		return string(b) + "+", nil
	}
	return "", fmt.Errorf("interface name operand %q", b)
}
