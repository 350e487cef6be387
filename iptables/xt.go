package iptables

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/nftmesh/nftmesh/redirect"
)

// x_tables binary layouts (linux/netfilter_ipv4/ip_tables.h,
// linux/netfilter_ipv6/ip6_tables.h, linux/netfilter/x_tables.h and the
// per-extension headers). Sizes and offsets are checked against the C
// headers in xt_test.go. Multi-byte fields are in host order except where
// the kernel declares __be16/__be32 (addresses, NAT and TPROXY ports).

var hostEndian = binary.NativeEndian

// xtAlign is XT_ALIGN: every match, target and entry is 8-byte aligned.
func xtAlign(n int) int { return (n + 7) &^ 7 }

const (
	xtTableMaxNameLen = 32
	xtExtMaxNameLen   = 29 // XT_EXTENSION_MAXNAMELEN
	xtFuncMaxNameLen  = 30 // XT_FUNCTION_MAXNAMELEN (ERROR target data)
	ifNameSize        = 16

	xtMatchHdrLen  = 32 // struct xt_entry_match / xt_entry_target header
	stdTargetSize  = 40 // struct xt_standard_target
	errTargetSize  = 64 // struct xt_error_target
	getInfoLen     = 84 // struct ipt_getinfo (== ip6t_getinfo)
	replaceHdrLen  = 96 // struct ipt_replace (== ip6t_replace)
	getEntriesHdr  = 40 // struct ipt_get_entries
	countersInfoHd = 40 // struct xt_counters_info
	counterLen     = 16 // struct xt_counters
	getRevisionLen = 30 // struct xt_get_revision
)

type layout struct {
	fam        redirect.Family
	entryLen   int // sizeof(struct ipt_entry) / ip6t_entry
	addrLen    int
	ifaceOff   int // iniface; outiface, masks follow at +16, +32, +48
	protoOff   int
	flagsOff   int
	invOff     int
	nfcacheOff int
	tgtOffOff  int // target_offset u16; next_offset follows
	comeOff    int
	cntOff     int
	af         int // AF_INET / AF_INET6 for the raw socket
	sockLevel  int // SOL_IP / SOL_IPV6 for the getsockopt calls
}

var (
	layout4 = layout{fam: redirect.FamilyIPv4, entryLen: 112, addrLen: 4, ifaceOff: 16, protoOff: 80, flagsOff: 82, invOff: 83,
		nfcacheOff: 84, tgtOffOff: 88, comeOff: 92, cntOff: 96, af: unix.AF_INET, sockLevel: unix.SOL_IP}
	layout6 = layout{fam: redirect.FamilyIPv6, entryLen: 168, addrLen: 16, ifaceOff: 64, protoOff: 128, flagsOff: 131, invOff: 132,
		nfcacheOff: 136, tgtOffOff: 140, comeOff: 144, cntOff: 152, af: unix.AF_INET6, sockLevel: unix.SOL_IPV6}
)

func layoutFor(f redirect.Family) *layout {
	if f == redirect.FamilyIPv6 {
		return &layout6
	}
	return &layout4
}

// ipt_ip / ip6t_ip6 flag bits.
const (
	invViaIn   = 0x01
	invViaOut  = 0x02
	invSrcIP   = 0x08
	invDstIP   = 0x10
	invProto   = 0x40
	ip6FProto  = 0x01 // IP6T_F_PROTO: ip6tables sets it whenever -p is given
	ipFGoto    = 0x02 // IPT_F_GOTO
	ip6FGoto   = 0x04 // IP6T_F_GOTO
	invMaskAll = 0x7f
)

// Extension data sizes (before XT_ALIGN) and the flags they use.
const (
	tcpLen        = 12 // struct xt_tcp
	udpLen        = 10 // struct xt_udp
	multiportLen  = 48 // struct xt_multiport_v1
	ownerLen      = 20 // struct xt_owner_match_info
	markLen       = 12 // struct xt_mark_mtinfo1 / xt_connmark_mtinfo1
	conntrackLen  = 164
	commentLen    = 256
	natCompatLen  = 20 // struct nf_nat_ipv4_multi_range_compat
	natRangeLen   = 40 // struct nf_nat_range
	tproxyLen     = 28 // struct xt_tproxy_target_info_v1
	markTgLen     = 8  // struct xt_mark_tginfo2
	connmarkTgLen = 16 // struct xt_connmark_tginfo1/2
	ctTgLen       = 72 // struct xt_ct_target_info_v1

	xtTCPInvSrcPt   = 0x01
	xtTCPInvDstPt   = 0x02
	xtMultiSource   = 0
	xtMultiDest     = 1
	xtOwnerUID      = 0x01
	xtOwnerGID      = 0x02
	xtConntrackStat = 0x01
	natProtoSpec    = 0x02 // NF_NAT_RANGE_PROTO_SPECIFIED
)

// encoder turns xrules into entries for one family, with the revisions the
// kernel supports.
type encoder struct {
	l    *layout
	revs map[string]uint8 // target name -> chosen revision (see chooseRevisions)
}

// rev is the chosen revision of a target, def when none was chosen.
func (e *encoder) rev(name string, def uint8) uint8 {
	if r, ok := e.revs[name]; ok {
		return r
	}
	return def
}

func putName(b []byte, name string, rev uint8) {
	copy(b[2:2+xtExtMaxNameLen], name)
	b[2+xtExtMaxNameLen] = rev
}

func extBlob(name string, rev uint8, data []byte) []byte {
	size := xtMatchHdrLen + xtAlign(len(data))
	b := make([]byte, size)
	hostEndian.PutUint16(b, uint16(size))
	putName(b, name, rev)
	copy(b[xtMatchHdrLen:], data)
	return b
}

func (e *encoder) match(m xmatch) ([]byte, error) {
	switch m := m.(type) {
	case mPort:
		return encodePort(m), nil
	case mMultiport:
		return encodeMultiport(m)
	case mOwner:
		return encodeOwner(m), nil
	case mMark:
		d := make([]byte, markLen)
		hostEndian.PutUint32(d, m.value)
		hostEndian.PutUint32(d[4:], m.mask)
		if m.inv {
			d[8] = 1
		}
		name := "mark"
		if m.conn {
			name = "connmark"
		}
		return extBlob(name, 1, d), nil
	case mConntrack:
		d := make([]byte, conntrackLen)
		hostEndian.PutUint16(d[146:], xtConntrackStat)
		if m.inv {
			hostEndian.PutUint16(d[148:], xtConntrackStat)
		}
		hostEndian.PutUint16(d[150:], uint16(m.states))
		return extBlob("conntrack", 3, d), nil
	case mComment:
		if len(m.text) >= commentLen {
			return nil, fmt.Errorf("comment of %d bytes exceeds %d", len(m.text), commentLen-1)
		}
		d := make([]byte, commentLen)
		copy(d, m.text)
		return extBlob("comment", 0, d), nil
	}
	return nil, fmt.Errorf("no encoder for match %T", m)
}

func encodePort(m mPort) []byte {
	name, n := "tcp", tcpLen
	if m.udp {
		name, n = "udp", udpLen
	}
	d := make([]byte, n)
	// Unused port range is 0-65535 (match any), as libxt_tcp/udp init it.
	hostEndian.PutUint16(d[2:], 0xffff)
	hostEndian.PutUint16(d[6:], 0xffff)
	at, inv := 4, byte(xtTCPInvDstPt)
	if m.src {
		at, inv = 0, xtTCPInvSrcPt
	}
	hostEndian.PutUint16(d[at:], m.port)
	hostEndian.PutUint16(d[at+2:], m.port)
	if m.inv {
		if m.udp {
			d[8] = inv
		} else {
			d[11] = inv
		}
	}
	return extBlob(name, 0, d)
}

func encodeMultiport(m mMultiport) ([]byte, error) {
	if len(m.ports) == 0 || len(m.ports) > maxMultiport {
		return nil, fmt.Errorf("multiport with %d ports (1..%d)", len(m.ports), maxMultiport)
	}
	d := make([]byte, multiportLen)
	d[0] = xtMultiDest
	if m.src {
		d[0] = xtMultiSource
	}
	d[1] = byte(len(m.ports))
	for i, p := range m.ports {
		hostEndian.PutUint16(d[2+2*i:], p)
	}
	if m.inv {
		d[47] = 1
	}
	return extBlob("multiport", 1, d), nil
}

func encodeOwner(m mOwner) []byte {
	d := make([]byte, ownerLen)
	at, flag := 0, byte(xtOwnerUID)
	if m.gid {
		at, flag = 8, xtOwnerGID
	}
	hostEndian.PutUint32(d[at:], m.id)
	hostEndian.PutUint32(d[at+4:], m.id)
	d[16] = flag
	if m.inv {
		d[17] = flag
	}
	return extBlob("owner", 1, d)
}

// target encodes t; a jump's verdict is left for the table layout to fill.
func (e *encoder) target(t xtarget) ([]byte, error) {
	switch t := t.(type) {
	case tVerdict:
		return stdTarget(t.v), nil
	case tJump:
		return stdTarget(0), nil
	case tRedirect:
		if e.l.fam == redirect.FamilyIPv6 {
			d := make([]byte, natRangeLen)
			hostEndian.PutUint32(d, natProtoSpec)
			binary.BigEndian.PutUint16(d[36:], t.port)
			binary.BigEndian.PutUint16(d[38:], t.port)
			return extBlob("REDIRECT", 0, d), nil
		}
		d := make([]byte, natCompatLen)
		hostEndian.PutUint32(d, 1) // rangesize
		hostEndian.PutUint32(d[4:], natProtoSpec)
		binary.BigEndian.PutUint16(d[16:], t.port)
		binary.BigEndian.PutUint16(d[18:], t.port)
		return extBlob("REDIRECT", 0, d), nil
	case tTProxy:
		d := make([]byte, tproxyLen)
		hostEndian.PutUint32(d, t.mask)
		hostEndian.PutUint32(d[4:], t.mark)
		binary.BigEndian.PutUint16(d[24:], t.port)
		return extBlob("TPROXY", 1, d), nil
	case tMark:
		d := make([]byte, markTgLen)
		hostEndian.PutUint32(d, t.mark)
		hostEndian.PutUint32(d[4:], t.mask)
		return extBlob("MARK", 2, d), nil
	case tConnmark:
		d := make([]byte, connmarkTgLen)
		hostEndian.PutUint32(d[4:], t.ctmask)
		hostEndian.PutUint32(d[8:], t.nfmask)
		rev := e.rev("CONNMARK", 2)
		if rev >= 2 {
			d[14] = t.mode
		} else {
			d[12] = t.mode
		}
		return extBlob("CONNMARK", rev, d), nil
	case tCT:
		d := make([]byte, ctTgLen)
		hostEndian.PutUint16(d[2:], t.zone)
		return extBlob("CT", e.rev("CT", 2), d), nil
	}
	return nil, fmt.Errorf("no encoder for target %T", t)
}

func stdTarget(verdict int32) []byte {
	b := make([]byte, stdTargetSize)
	hostEndian.PutUint16(b, stdTargetSize)
	hostEndian.PutUint32(b[xtMatchHdrLen:], uint32(verdict))
	return b
}

func errorTarget(name string) []byte {
	b := make([]byte, errTargetSize)
	hostEndian.PutUint16(b, errTargetSize)
	putName(b, "ERROR", 0)
	copy(b[xtMatchHdrLen:xtMatchHdrLen+xtFuncMaxNameLen-1], name)
	return b
}

// entry assembles header + matches + target.
func (e *encoder) entry(r xrule) ([]byte, error) {
	l := e.l
	hdr := make([]byte, l.entryLen)
	var inv byte
	put := func(at int, p netip.Prefix) error {
		if !p.IsValid() {
			return nil
		}
		if (l.addrLen == 4) != p.Addr().Is4() {
			return fmt.Errorf("address %s in an %s entry", p, l.fam)
		}
		copy(hdr[at:], p.Addr().AsSlice())
		copy(hdr[at+2*l.addrLen:], net.CIDRMask(p.Bits(), 8*l.addrLen))
		return nil
	}
	if err := put(0, r.src); err != nil {
		return nil, err
	}
	if err := put(l.addrLen, r.dst); err != nil {
		return nil, err
	}
	if r.invSrc {
		inv |= invSrcIP
	}
	if r.invDst {
		inv |= invDstIP
	}
	if r.in != "" {
		putIface(hdr[l.ifaceOff:], hdr[l.ifaceOff+2*ifNameSize:], r.in)
		if r.invIn {
			inv |= invViaIn
		}
	}
	if r.out != "" {
		putIface(hdr[l.ifaceOff+ifNameSize:], hdr[l.ifaceOff+3*ifNameSize:], r.out)
		if r.invOut {
			inv |= invViaOut
		}
	}
	if r.proto != 0 {
		hostEndian.PutUint16(hdr[l.protoOff:], uint16(r.proto))
		if l.fam == redirect.FamilyIPv6 {
			hdr[l.flagsOff] |= ip6FProto
		}
		if r.invProto {
			inv |= invProto
		}
	}
	hdr[l.invOff] = inv
	body := hdr
	for _, m := range r.matches {
		mb, err := e.match(m)
		if err != nil {
			return nil, err
		}
		body = append(body, mb...)
	}
	tgt, err := e.target(r.target)
	if err != nil {
		return nil, err
	}
	hostEndian.PutUint16(body[l.tgtOffOff:], uint16(len(body)))
	body = append(body, tgt...)
	if len(body) > 0xffff {
		return nil, fmt.Errorf("entry of %d bytes is too large", len(body))
	}
	hostEndian.PutUint16(body[l.tgtOffOff+2:], uint16(len(body)))
	return body, nil
}

// putIface stores a name and its mask as xtables_parse_interface does: a
// trailing '+' is kept in the name and the mask covers the prefix only;
// otherwise the mask covers the name and its NUL.
func putIface(name, mask []byte, s string) {
	copy(name[:ifNameSize], s)
	n := len(s) + 1
	if s[len(s)-1] == '+' {
		n = len(s) - 1
	}
	for i := 0; i < n && i < ifNameSize; i++ {
		mask[i] = 0xff
	}
}

var errNotOurs = errors.New("entry uses a match or target nftmesh does not install")

// rawEntry is a bounds-checked view of one entry.
type rawEntry struct {
	b            []byte
	targetOffset int
	matches      [][]byte // each: header + data
	targetName   string
	targetRev    uint8
	target       []byte // header + data
}

// parseEntry checks one entry's structure (sizes, alignment, bounds) and
// returns its parts. b starts at the entry and may extend past it.
func parseEntry(l *layout, b []byte) (rawEntry, int, error) {
	if len(b) < l.entryLen {
		return rawEntry{}, 0, fmt.Errorf("truncated entry header (%d bytes left)", len(b))
	}
	to := int(hostEndian.Uint16(b[l.tgtOffOff:]))
	next := int(hostEndian.Uint16(b[l.tgtOffOff+2:]))
	if next > len(b) || next%8 != 0 || to < l.entryLen || to+xtMatchHdrLen > next || to%8 != 0 {
		return rawEntry{}, 0, fmt.Errorf("bad entry offsets: target_offset %d, next_offset %d, %d bytes left", to, next, len(b))
	}
	e := rawEntry{b: b[:next], targetOffset: to}
	for off := l.entryLen; off < to; {
		if off+xtMatchHdrLen > to {
			return rawEntry{}, 0, fmt.Errorf("truncated match at %d", off)
		}
		size := int(hostEndian.Uint16(b[off:]))
		if size < xtMatchHdrLen || size%8 != 0 || off+size > to {
			return rawEntry{}, 0, fmt.Errorf("bad match size %d at %d", size, off)
		}
		e.matches = append(e.matches, b[off:off+size])
		off += size
	}
	tsize := int(hostEndian.Uint16(b[to:]))
	if tsize < xtMatchHdrLen || to+tsize != next {
		return rawEntry{}, 0, fmt.Errorf("bad target size %d at %d (next_offset %d)", tsize, to, next)
	}
	e.target = b[to:next]
	e.targetName, e.targetRev = extName(e.target)
	return e, next, nil
}

func cString(b []byte) string {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	return string(b)
}

func extName(m []byte) (string, uint8) {
	return cString(m[2 : 2+xtExtMaxNameLen]), m[2+xtExtMaxNameLen]
}

// stdVerdict returns the verdict of a standard target (name "").
func (e rawEntry) stdVerdict() (int32, bool) {
	if e.targetName != "" || len(e.target) < xtMatchHdrLen+4 {
		return 0, false
	}
	return int32(hostEndian.Uint32(e.target[xtMatchHdrLen:])), true
}

// errorName returns the chain name of an ERROR target.
func (e rawEntry) errorName() (string, bool) {
	if e.targetName != "ERROR" || len(e.target) < xtMatchHdrLen+xtFuncMaxNameLen {
		return "", false
	}
	return cString(e.target[xtMatchHdrLen : xtMatchHdrLen+xtFuncMaxNameLen]), true
}

// comment returns the text of the entry's comment match, if any.
func (e rawEntry) comment() (string, bool) {
	for _, m := range e.matches {
		if n, _ := extName(m); n == "comment" && len(m) >= xtMatchHdrLen+commentLen {
			return cString(m[xtMatchHdrLen : xtMatchHdrLen+commentLen]), true
		}
	}
	return "", false
}

// unconditional reports an all-zero ip header and no matches (a chain
// policy or a user chain's trailing RETURN).
func (e rawEntry) unconditional(l *layout) bool {
	return allZero(e.b[:l.nfcacheOff]) && len(e.matches) == 0
}

func allZero(b []byte) bool { return !slices.ContainsFunc(b, func(c byte) bool { return c != 0 }) }

// decodeRule turns one of our entries back into an xrule. Jump targets are
// resolved by the caller (jump names the chain, filled from the verdict).
func decodeRule(l *layout, e rawEntry) (xrule, error) {
	var r xrule
	b := e.b
	get := func(at int, inv bool) (netip.Prefix, error) {
		a, _ := netip.AddrFromSlice(b[at : at+l.addrLen])
		m, _ := netip.AddrFromSlice(b[at+2*l.addrLen : at+3*l.addrLen])
		if a.IsUnspecified() && m.IsUnspecified() {
			if inv {
				return netip.Prefix{}, fmt.Errorf("inverted any-address")
			}
			return netip.Prefix{}, nil
		}
		bits, size := net.IPMask(m.AsSlice()).Size()
		if size == 0 {
			return netip.Prefix{}, fmt.Errorf("non-contiguous address mask %s", m)
		}
		return netip.PrefixFrom(a, bits), nil
	}
	inv := b[l.invOff]
	if inv&^(invViaIn|invViaOut|invSrcIP|invDstIP|invProto) != 0 {
		return r, fmt.Errorf("%w: inverse flags 0x%x", errNotOurs, inv)
	}
	var err error
	r.invSrc, r.invDst = inv&invSrcIP != 0, inv&invDstIP != 0
	if r.src, err = get(0, r.invSrc); err != nil {
		return r, err
	}
	if r.dst, err = get(l.addrLen, r.invDst); err != nil {
		return r, err
	}
	r.in, r.invIn = cString(b[l.ifaceOff:l.ifaceOff+ifNameSize]), inv&invViaIn != 0
	r.out, r.invOut = cString(b[l.ifaceOff+ifNameSize:l.ifaceOff+2*ifNameSize]), inv&invViaOut != 0
	p := hostEndian.Uint16(b[l.protoOff:])
	if p > 255 {
		return r, fmt.Errorf("protocol %d out of range", p)
	}
	r.proto, r.invProto = uint8(p), inv&invProto != 0
	flags := b[l.flagsOff]
	if (l.fam == redirect.FamilyIPv4 && flags != 0) || (l.fam == redirect.FamilyIPv6 && flags&^ip6FProto != 0) {
		return r, fmt.Errorf("%w: ip flags 0x%x (fragment, tos or goto)", errNotOurs, flags)
	}
	for _, m := range e.matches {
		xm, err := decodeMatch(m)
		if err != nil {
			return r, err
		}
		r.matches = append(r.matches, xm)
	}
	r.target, err = decodeTarget(l, e)
	return r, err
}

func need(m []byte, n int, what string) ([]byte, error) {
	if len(m) < xtMatchHdrLen+n {
		return nil, fmt.Errorf("%s data of %d bytes, want %d", what, len(m)-xtMatchHdrLen, n)
	}
	return m[xtMatchHdrLen : xtMatchHdrLen+n], nil
}

func decodeMatch(m []byte) (xmatch, error) {
	name, rev := extName(m)
	switch {
	case name == "tcp" || name == "udp":
		return decodePort(m, name)
	case name == "multiport" && rev == 1:
		return decodeMultiport(m)
	case name == "owner" && rev == 1:
		return decodeOwner(m)
	case (name == "mark" || name == "connmark") && rev == 1:
		d, err := need(m, markLen, name)
		if err != nil {
			return nil, err
		}
		return mMark{conn: name == "connmark", value: hostEndian.Uint32(d), mask: hostEndian.Uint32(d[4:]), inv: d[8] != 0}, nil
	case name == "conntrack" && rev >= 1 && rev <= 3:
		return decodeConntrack(m)
	case name == "comment":
		d, err := need(m, commentLen, name)
		if err != nil {
			return nil, err
		}
		return mComment{text: cString(d)}, nil
	}
	return nil, fmt.Errorf("%w: match %s revision %d", errNotOurs, name, rev)
}

// decodePort reads a tcp or udp match of one port, the form we install.
func decodePort(m []byte, name string) (xmatch, error) {
	n, invAt := tcpLen, 11
	if name == "udp" {
		n, invAt = udpLen, 8
	}
	d, err := need(m, n, name)
	if err != nil {
		return nil, err
	}
	sp := [2]uint16{hostEndian.Uint16(d), hostEndian.Uint16(d[2:])}
	dp := [2]uint16{hostEndian.Uint16(d[4:]), hostEndian.Uint16(d[6:])}
	inv := d[invAt]
	if name == "tcp" && (d[8] != 0 || d[9] != 0 || d[10] != 0) {
		return nil, fmt.Errorf("%w: tcp flags/option match", errNotOurs)
	}
	anyPort := [2]uint16{0, 0xffff}
	switch {
	case sp == anyPort && dp[0] == dp[1] && inv&^xtTCPInvDstPt == 0:
		return mPort{udp: name == "udp", port: dp[0], inv: inv != 0}, nil
	case dp == anyPort && sp[0] == sp[1] && inv&^xtTCPInvSrcPt == 0:
		return mPort{udp: name == "udp", src: true, port: sp[0], inv: inv != 0}, nil
	}
	return nil, fmt.Errorf("%w: %s port ranges %v/%v", errNotOurs, name, sp, dp)
}

func decodeMultiport(m []byte) (xmatch, error) {
	d, err := need(m, multiportLen, "multiport")
	if err != nil {
		return nil, err
	}
	n := int(d[1])
	if n == 0 || n > maxMultiport || d[0] > xtMultiDest {
		return nil, fmt.Errorf("%w: multiport flags %d count %d", errNotOurs, d[0], n)
	}
	mp := mMultiport{src: d[0] == xtMultiSource, inv: d[47] != 0}
	for i := 0; i < n; i++ {
		if d[32+i] != 0 {
			return nil, fmt.Errorf("%w: multiport range", errNotOurs)
		}
		mp.ports = append(mp.ports, hostEndian.Uint16(d[2+2*i:]))
	}
	return mp, nil
}

func decodeOwner(m []byte) (xmatch, error) {
	d, err := need(m, ownerLen, "owner")
	if err != nil {
		return nil, err
	}
	var o mOwner
	switch d[16] {
	case xtOwnerUID:
	case xtOwnerGID:
		o.gid = true
	default:
		return nil, fmt.Errorf("%w: owner flags 0x%x", errNotOurs, d[16])
	}
	at := 0
	if o.gid {
		at = 8
	}
	lo, hi := hostEndian.Uint32(d[at:]), hostEndian.Uint32(d[at+4:])
	if lo != hi || d[17]&^d[16] != 0 {
		return nil, fmt.Errorf("%w: owner range %d-%d", errNotOurs, lo, hi)
	}
	o.id, o.inv = lo, d[17] != 0
	return o, nil
}

func decodeConntrack(m []byte) (xmatch, error) {
	// Revisions 1-3 share the layout up to state_mask.
	d, err := need(m, 152, "conntrack")
	if err != nil {
		return nil, err
	}
	flags, inv := hostEndian.Uint16(d[146:]), hostEndian.Uint16(d[148:])
	if flags != xtConntrackStat || inv&^xtConntrackStat != 0 {
		return nil, fmt.Errorf("%w: conntrack flags 0x%x", errNotOurs, flags)
	}
	st := hostEndian.Uint16(d[150:])
	if st&^0xf != 0 || st == 0 {
		return nil, fmt.Errorf("%w: conntrack states 0x%x", errNotOurs, st)
	}
	return mConntrack{states: redirect.CTState(st), inv: inv != 0}, nil
}

func decodeTarget(l *layout, e rawEntry) (xtarget, error) {
	t := e.target
	switch name, rev := e.targetName, e.targetRev; {
	case name == "":
		v, _ := e.stdVerdict()
		switch v {
		case verdictAccept, verdictDrop, verdictReturn:
			return tVerdict{v}, nil
		}
		if v >= 0 {
			return tJump{}, nil // chain filled in by the table reader
		}
		return nil, fmt.Errorf("%w: verdict %d", errNotOurs, v)
	case name == "REDIRECT" && l.fam == redirect.FamilyIPv4:
		d, err := need(t, natCompatLen, name)
		if err != nil {
			return nil, err
		}
		lo, hi := binary.BigEndian.Uint16(d[16:]), binary.BigEndian.Uint16(d[18:])
		if hostEndian.Uint32(d) != 1 || hostEndian.Uint32(d[4:]) != natProtoSpec || lo != hi {
			return nil, fmt.Errorf("%w: REDIRECT range", errNotOurs)
		}
		return tRedirect{lo}, nil
	case name == "REDIRECT":
		d, err := need(t, natRangeLen, name)
		if err != nil {
			return nil, err
		}
		lo, hi := binary.BigEndian.Uint16(d[36:]), binary.BigEndian.Uint16(d[38:])
		if hostEndian.Uint32(d) != natProtoSpec || lo != hi {
			return nil, fmt.Errorf("%w: REDIRECT range", errNotOurs)
		}
		return tRedirect{lo}, nil
	case name == "TPROXY" && rev == 1:
		d, err := need(t, tproxyLen, name)
		if err != nil {
			return nil, err
		}
		if !allZero(d[8:24]) {
			return nil, fmt.Errorf("%w: TPROXY --on-ip", errNotOurs)
		}
		return tTProxy{mask: hostEndian.Uint32(d), mark: hostEndian.Uint32(d[4:]), port: binary.BigEndian.Uint16(d[24:])}, nil
	case name == "MARK" && rev == 2:
		d, err := need(t, markTgLen, name)
		if err != nil {
			return nil, err
		}
		return tMark{mark: hostEndian.Uint32(d), mask: hostEndian.Uint32(d[4:])}, nil
	case name == "CONNMARK" && (rev == 1 || rev == 2):
		d, err := need(t, connmarkTgLen, name)
		if err != nil {
			return nil, err
		}
		mode := d[12]
		if rev == 2 {
			if d[12] != 0 || d[13] != 0 {
				return nil, fmt.Errorf("%w: CONNMARK shift", errNotOurs)
			}
			mode = d[14]
		}
		if mode != xtConnmarkSave && mode != xtConnmarkRestore || hostEndian.Uint32(d) != 0 {
			return nil, fmt.Errorf("%w: CONNMARK mode %d", errNotOurs, mode)
		}
		return tConnmark{mode: mode, ctmask: hostEndian.Uint32(d[4:]), nfmask: hostEndian.Uint32(d[8:])}, nil
	case name == "CT" && (rev == 1 || rev == 2):
		d, err := need(t, 60, name) // up to the kernel-only pointer
		if err != nil {
			return nil, err
		}
		if hostEndian.Uint16(d) != 0 || !allZero(d[4:60]) {
			return nil, fmt.Errorf("%w: CT options besides --zone", errNotOurs)
		}
		return tCT{zone: hostEndian.Uint16(d[2:])}, nil
	}
	return nil, fmt.Errorf("%w: target %s revision %d", errNotOurs, e.targetName, e.targetRev)
}
