package iptables

import (
	"encoding/binary"
	"testing"

	"github.com/nftmesh/nftmesh/redirect"
	"github.com/nftmesh/nftmesh/testkit/scenarios"
)

// FuzzDecode feeds arbitrary table blobs (and hook offsets) to the table
// parser and the rule decoder: they must return errors, never panic, and a
// table they accept must lay out again.
func FuzzDecode(f *testing.F) {
	for _, name := range []string{"defaults", "tproxy", "dns-capture"} {
		sc, _ := scenarios.ByName(name)
		p, _ := sc.Plan()
		for _, fam := range allFamilies {
			xs, _ := lowerPlan(p, fam)
			enc := &encoder{l: layoutFor(fam)}
			for _, x := range xs {
				tb := emptyTable(f, enc.l, x.name)
				if err := tb.addOurs(enc, x); err != nil {
					f.Fatal(err)
				}
				blob, _, he, uf, err := tb.layout()
				if err != nil {
					f.Fatal(err)
				}
				f.Add(fam == redirect.FamilyIPv6, x.name, tb.info.validHooks, he[0], uf[0], he[3], uf[3], blob)
			}
		}
	}
	f.Add(false, "nat", uint32(0x1b), uint32(0), uint32(0), uint32(0), uint32(0), []byte{})
	f.Fuzz(func(t *testing.T, v6 bool, name string, valid, he0, uf0, he3, uf3 uint32, blob []byte) {
		l := &layout4
		if v6 {
			l = &layout6
		}
		info := tableInfo{validHooks: valid & 0x1f, size: uint32(len(blob))}
		info.hookEntry[0], info.underflow[0], info.hookEntry[3], info.underflow[3] = he0, uf0, he3, uf3
		// Count entries the way the kernel's info would, when possible.
		for off := 0; off+l.entryLen <= len(blob); {
			next := int(binary.NativeEndian.Uint16(blob[off+l.tgtOffOff+2:]))
			if next <= 0 {
				break
			}
			info.numEntries++
			off += next
		}
		tb, err := parseTable(l, name, info, blob)
		if err != nil {
			return
		}
		if _, err := tb.decodeOurs(); err == nil {
			_ = err
		}
		_ = tb.aheadOfOurs()
		for _, c := range tb.chains {
			for _, e := range c.rules {
				_, _ = decodeRule(l, e.parsed)
			}
		}
		if err := tb.stripOurs(); err == nil {
			_, _, _, _, _ = tb.layout()
		}
	})
}
