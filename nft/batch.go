package nft

import (
	"fmt"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
)

// queue puts prog's batch on cc: the table created exclusively or, with
// replace, deleted and re-created; then, in nft's order, the named sets with
// their first maxElemsPerMsg elements, the chains, each rule after its
// anonymous sets, and the named sets' further elements. The kernel commits
// a batch whole or not at all.
func queue(cc *nftables.Conn, prog *program, replace bool) error {
	if err := prog.fits(); err != nil {
		return err
	}
	if replace {
		cc.DelTable(prog.table)
		cc.AddTable(prog.table)
	} else {
		cc.CreateTable(prog.table)
	}
	for _, s := range prog.sets {
		first := s.elems
		if len(first) > maxElemsPerMsg {
			first = first[:maxElemsPerMsg]
		}
		if err := cc.AddSet(s.set, first); err != nil {
			return err
		}
	}
	for _, c := range prog.chains {
		cc.AddChain(c)
	}
	for _, r := range prog.rules {
		for _, a := range r.anon {
			if err := cc.AddSet(a.set, a.elems); err != nil {
				return err
			}
		}
		cc.AddRule(&nftables.Rule{Table: prog.table, Chain: r.chain, Exprs: r.exprs})
	}
	for _, c := range prog.tailChunks() {
		if err := cc.SetAddElements(c.set, c.elems); err != nil {
			return err
		}
	}
	return nil
}

// batchSize bounds from above the size of prog's batch on the wire (~8 KiB
// for the default dual-stack pod): whether a send buffer must grow.
func (prog *program) batchSize() int {
	n := 256 + 64*len(prog.chains) + 320*len(prog.rules)
	for _, s := range prog.sets {
		n += 128 + 40*len(s.elems)
	}
	return n
}

// maxAttrLen is the most a netlink attribute holds: its length is 16 bits.
const maxAttrLen = 0xffff

// fits refuses a program with an element list longer than one netlink
// attribute holds: google/nftables v0.3.0 (mdlayher/netlink's
// MarshalAttributes) writes such a length modulo 2^16 without an error.
// Named sets go in chunks of maxElemsPerMsg; an anonymous set in one.
func (prog *program) fits() error {
	check := func(s *nftables.Set, elems []nftables.SetElement) error {
		if n := elemListLen(elems); n > maxAttrLen {
			return fmt.Errorf("set %s: %d elements take %d bytes, more than one netlink attribute holds (%d)", s.Name, len(elems), n, maxAttrLen)
		}
		return nil
	}
	for _, s := range prog.sets {
		if err := check(s.set, s.elems[:min(len(s.elems), maxElemsPerMsg)]); err != nil {
			return err
		}
	}
	for _, c := range prog.tailChunks() {
		if err := check(c.set, c.elems); err != nil {
			return err
		}
	}
	for _, r := range prog.rules {
		for _, a := range r.anon {
			if err := check(a.set, a.elems); err != nil {
				return err
			}
		}
	}
	return nil
}

// elemListLen is the length of NFTA_SET_ELEM_LIST_ELEMENTS: per element a
// nest, flags for an interval end, and the key's NFTA_DATA_VALUE in a
// nest, each padded to 4 bytes.
func elemListLen(elems []nftables.SetElement) int {
	n := 4
	for _, e := range elems {
		n += 4 + 4 + 4 + (len(e.Key)+3)&^3
		if e.IntervalEnd {
			n += 8
		}
	}
	return n
}

// marshal is the batch that creates prog's table (with replace, that
// deletes and re-creates it), as google/nftables' Flush sends it to a dial function that keeps and acknowledges it, with
// the echo flag cleared (raw.go, 1) and sequence, PID and length left to
// the sending socket.
func marshal(prog *program, replace bool) ([]netlink.Message, error) {
	var msgs []netlink.Message
	cc, err := nftables.New(nftables.WithTestDial(func(req []netlink.Message) ([]netlink.Message, error) {
		msgs = append(msgs, req...)
		acks := make([]netlink.Message, len(req))
		for i, m := range req {
			acks[i] = netlink.Message{
				Header: netlink.Header{Type: netlink.Error, Sequence: m.Header.Sequence, PID: m.Header.PID},
				Data:   make([]byte, 4),
			}
		}
		return acks, nil
	}))
	if err != nil {
		return nil, err
	}
	if err := queue(cc, prog, replace); err != nil {
		return nil, err
	}
	if err := cc.Flush(); err != nil {
		return nil, err
	}
	for i := range msgs {
		h := &msgs[i].Header
		h.Flags &^= netlink.Echo
		h.Sequence, h.PID, h.Length = 0, 0, 0
	}
	return msgs, nil
}
