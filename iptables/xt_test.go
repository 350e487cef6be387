package iptables

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/nftmesh/nftmesh/redirect"
	"github.com/nftmesh/nftmesh/testkit/scenarios"
)

// Sizes and offsets printed by a C program including the kernel UAPI
// headers (sizeof/offsetof on x86_64, gcc 12, linux-libc-dev 6.1).
func TestLayoutsMatchKernelHeaders(t *testing.T) {
	checks := []struct {
		name      string
		got, want int
	}{
		{"sizeof(ipt_entry)", layout4.entryLen, 112},
		{"ipt_entry.nfcache", layout4.nfcacheOff, 84},
		{"ipt_entry.target_offset", layout4.tgtOffOff, 88},
		{"ipt_entry.comefrom", layout4.comeOff, 92},
		{"ipt_entry.counters", layout4.cntOff, 96},
		{"sizeof(ip6t_entry)", layout6.entryLen, 168},
		{"ip6t_entry.nfcache", layout6.nfcacheOff, 136},
		{"ip6t_entry.target_offset", layout6.tgtOffOff, 140},
		{"ip6t_entry.comefrom", layout6.comeOff, 144},
		{"ip6t_entry.counters", layout6.cntOff, 152},
		{"ip6t_ip6.proto", layout6.protoOff, 128},
		{"ip6t_ip6.flags", layout6.flagsOff, 131},
		{"ip6t_ip6.invflags", layout6.invOff, 132},
		{"sizeof(ipt_getinfo)", getInfoLen, 84},
		{"sizeof(ipt_replace)", replaceHdrLen, 96},
		{"sizeof(ipt_get_entries)", getEntriesHdr, 40},
		{"sizeof(xt_counters_info)", countersInfoHd, 40},
		{"sizeof(xt_entry_match)", xtMatchHdrLen, 32},
		{"sizeof(xt_standard_target)", stdTargetSize, 40},
		{"sizeof(xt_error_target)", errTargetSize, 64},
		{"sizeof(xt_tcp)", tcpLen, 12},
		{"sizeof(xt_udp)", udpLen, 10},
		{"sizeof(xt_multiport_v1)", multiportLen, 48},
		{"sizeof(xt_owner_match_info)", ownerLen, 20},
		{"sizeof(xt_mark_mtinfo1)", markLen, 12},
		{"sizeof(xt_conntrack_mtinfo3)", conntrackLen, 164},
		{"sizeof(xt_comment_info)", commentLen, 256},
		{"sizeof(xt_ct_target_info_v1)", ctTgLen, 72},
		{"sizeof(xt_tproxy_target_info_v1)", tproxyLen, 28},
		{"sizeof(nf_nat_ipv4_multi_range_compat)", natCompatLen, 20},
		{"sizeof(nf_nat_range)", natRangeLen, 40},
		{"sizeof(xt_connmark_tginfo2)", connmarkTgLen, 16},
		{"sizeof(xt_get_revision)", getRevisionLen, 30},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %d, want %d", c.name, c.got, c.want)
		}
	}
}

func TestEncodedSizesAreAligned(t *testing.T) {
	enc := &encoder{l: &layout4}
	for _, c := range []struct {
		m    xmatch
		size int
	}{
		{mPort{port: 1}, 48}, {mPort{udp: true, port: 1}, 48}, {mMultiport{ports: []uint16{1, 2}}, 80},
		{mOwner{id: 1}, 56}, {mMark{value: 1, mask: 1}, 48}, {mConntrack{states: 1}, 200}, {mComment{text: "x"}, 288},
	} {
		b, err := enc.match(c.m)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) != c.size || int(binary.NativeEndian.Uint16(b)) != len(b) {
			t.Errorf("%T: %d bytes, match_size %d, want %d", c.m, len(b), binary.NativeEndian.Uint16(b), c.size)
		}
	}
	for _, c := range []struct {
		fam  redirect.Family
		t    xtarget
		size int
	}{
		{redirect.FamilyIPv4, tVerdict{verdictAccept}, 40}, {redirect.FamilyIPv4, tRedirect{port: 1}, 56},
		{redirect.FamilyIPv6, tRedirect{port: 1}, 72}, {redirect.FamilyIPv4, tTProxy{port: 1}, 64},
		{redirect.FamilyIPv4, tMark{mark: 1}, 40}, {redirect.FamilyIPv4, tConnmark{mode: 1}, 48}, {redirect.FamilyIPv4, tCT{zone: 1}, 104},
	} {
		b, err := (&encoder{l: layoutFor(c.fam)}).target(c.t)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) != c.size || int(binary.NativeEndian.Uint16(b)) != len(b) {
			t.Errorf("%T (%s): %d bytes, want %d", c.t, c.fam, len(b), c.size)
		}
	}
}

// A hand-assembled entry: -A ISTIO_INBOUND -s 127.0.0.6/32 -o lo -p tcp -m tcp
// --dport 15008 -m comment --comment nftmesh -j RETURN (IPv4, x86_64).
func TestEncodeEntryByteLayout(t *testing.T) {
	enc := &encoder{l: &layout4}
	r := xrule{src: mustPrefix("127.0.0.6/32"), out: "lo", proto: 6,
		matches: []xmatch{mPort{port: 15008}, mComment{text: commentTag}}, target: tVerdict{verdictReturn}}
	b, err := enc.entry(r)
	if err != nil {
		t.Fatal(err)
	}
	want := make([]byte, 112+48+288+40)
	copy(want[0:], []byte{127, 0, 0, 6})       // src
	copy(want[8:], []byte{255, 255, 255, 255}) // smsk
	copy(want[32:], "lo")                      // outiface
	copy(want[64:], []byte{255, 255, 255})     // outiface_mask: "lo" and its NUL
	want[80] = 6                               // proto (host order u16)
	binary.LittleEndian.PutUint16(want[88:], 112+48+288)
	binary.LittleEndian.PutUint16(want[90:], 112+48+288+40)
	m := want[112:]
	binary.LittleEndian.PutUint16(m, 48)
	copy(m[2:], "tcp")
	binary.LittleEndian.PutUint16(m[32+2:], 0xffff) // spts = 0-65535
	binary.LittleEndian.PutUint16(m[32+4:], 15008)
	binary.LittleEndian.PutUint16(m[32+6:], 15008)
	c := want[160:]
	binary.LittleEndian.PutUint16(c, 288)
	copy(c[2:], "comment")
	copy(c[32:], "nftmesh")
	tg := want[448:]
	binary.LittleEndian.PutUint16(tg, 40)
	binary.LittleEndian.PutUint32(tg[32:], 0xfffffffb) // -NF_REPEAT-1 (XT_RETURN)
	if binary.NativeEndian.Uint16([]byte{1, 0}) != 1 {
		t.Skip("hand-checked bytes are little-endian")
	}
	if !bytes.Equal(b, want) {
		t.Errorf("entry bytes differ:\n got % x\nwant % x", b, want)
	}
}

// TestInterfaceWildcard: a trailing '+' is kept and the mask covers the
// prefix only (xtables_parse_interface).
func TestInterfaceWildcard(t *testing.T) {
	name, mask := make([]byte, 16), make([]byte, 16)
	putIface(name, mask, "veth+")
	if string(name[:5]) != "veth+" || !bytes.Equal(mask, append(bytes.Repeat([]byte{0xff}, 4), make([]byte, 12)...)) {
		t.Errorf("veth+: name % x mask % x", name, mask)
	}
}

// emptyTable builds the table a fresh namespace starts with: an ACCEPT
// policy per hook and the final ERROR entry.
func emptyTable(t testing.TB, l *layout, name string) *table {
	t.Helper()
	var blob []byte
	info := tableInfo{}
	for _, h := range builtinHooks[name] {
		info.validHooks |= 1 << h
		info.hookEntry[h] = uint32(len(blob))
		info.underflow[h] = uint32(len(blob))
		e := append(make([]byte, l.entryLen), stdTarget(verdictAccept)...)
		setOffsets(l, e, l.entryLen)
		blob = append(blob, e...)
		info.numEntries++
	}
	e := append(make([]byte, l.entryLen), errorTarget("ERROR")...)
	setOffsets(l, e, l.entryLen)
	blob = append(blob, e...)
	info.numEntries++
	info.size = uint32(len(blob))
	tb, err := parseTable(l, name, info, blob)
	if err != nil {
		t.Fatal(err)
	}
	return tb
}

// writeAndReparse lays a table out and parses the blob back, as the kernel
// round trip would.
func writeAndReparse(t testing.TB, tb *table) *table {
	t.Helper()
	blob, order, he, uf, err := tb.layout()
	if err != nil {
		t.Fatal(err)
	}
	info := tableInfo{validHooks: tb.info.validHooks, hookEntry: he, underflow: uf, numEntries: uint32(len(order)), size: uint32(len(blob))}
	out, err := parseTable(tb.l, tb.name, info, blob)
	if err != nil {
		t.Fatalf("re-parsing our own blob: %v", err)
	}
	return out
}

// TestEncodeDecodeRoundTrip: for every scenario, encode into empty tables,
// decode back, and compare with the canonical plan — no kernel needed.
func TestEncodeDecodeRoundTrip(t *testing.T) {
	for _, sc := range scenarios.All {
		t.Run(sc.Name, func(t *testing.T) {
			p, err := sc.Plan()
			if err != nil {
				t.Fatal(err)
			}
			byFam := map[redirect.Family][]decodedTable{}
			for _, fam := range allFamilies {
				xs, err := lowerPlan(p, fam)
				if err != nil {
					t.Fatal(err)
				}
				enc := &encoder{l: layoutFor(fam)}
				for _, x := range xs {
					tb := emptyTable(t, enc.l, x.name)
					if err := tb.addOurs(enc, x); err != nil {
						t.Fatal(err)
					}
					dt, err := writeAndReparse(t, tb).decodeOurs()
					if err != nil {
						t.Fatal(err)
					}
					byFam[fam] = append(byFam[fam], dt)
				}
			}
			got, err := raise(byFam)
			if err != nil {
				t.Fatal(err)
			}
			want := Canonical(p)
			want.Routes, want.LoopbackAddrs = nil, nil
			if d := redirect.Diff(want, got); len(d) > 0 {
				t.Errorf("decoded plan differs:\n%s", joinLines(d))
			}
			if err := got.Verify(); err != nil {
				t.Errorf("decoded plan fails Verify: %v", err)
			}
		})
	}
}

// TestCanonicalIsEquivalent: Canonical keeps every rule of every family
// (its projection per family equals the original's, as Render shows).
func TestCanonicalIsEquivalent(t *testing.T) {
	for _, sc := range scenarios.All {
		p, _ := sc.Plan()
		for _, f := range families {
			a, err := Render(p, f.fam)
			if err != nil {
				t.Fatal(err)
			}
			b, err := Render(Canonical(p), f.fam)
			if err != nil {
				t.Fatal(err)
			}
			if a != b {
				t.Errorf("%s/%s: Canonical changes the rules:\n%s", sc.Name, f.ext, lineDiff(a, b))
			}
		}
	}
}

// TestStripKeepsForeign: removing ours from a table with foreign entries
// around them gives back the foreign-only table byte for byte.
func TestStripKeepsForeign(t *testing.T) {
	sc, _ := scenarios.ByName("tproxy")
	p, _ := sc.Plan()
	xs, _ := lowerPlan(p, redirect.FamilyIPv4)
	enc := &encoder{l: &layout4}
	foreign := xtable{name: "mangle", chains: []xchain{
		{name: "PREROUTING", builtin: true, rules: []xrule{{proto: 17, target: tJump{chain: "A-FOREIGN"}}}},
		{name: "A-FOREIGN", rules: []xrule{{in: "eth0", target: tVerdict{verdictAccept}}}},
	}}
	base := emptyTable(t, enc.l, "mangle")
	if err := base.addOurs(enc, foreign); err != nil {
		t.Fatal(err)
	}
	base = writeAndReparse(t, base)
	want, _, _, _, _ := base.layout()
	for _, x := range xs {
		if x.name != "mangle" {
			continue
		}
		withOurs := base.clone()
		if err := withOurs.addOurs(enc, x); err != nil {
			t.Fatal(err)
		}
		again := writeAndReparse(t, withOurs)
		if err := again.stripOurs(); err != nil {
			t.Fatalf("stripOurs: %v", err)
		}
		got, _, _, _, err := again.layout()
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(scrub(enc.l, got), scrub(enc.l, want)) {
			t.Error("foreign entries changed after adding and removing ours")
		}
	}
}

func joinLines(s []string) string {
	var b bytes.Buffer
	for _, l := range s {
		b.WriteString(l + "\n")
	}
	return b.String()
}
