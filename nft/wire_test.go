package nft

import (
	"bytes"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/nftmesh/nftmesh/redirect"
	"github.com/nftmesh/nftmesh/testkit/scenarios"
)

// The reference for wire.go: the batch google/nftables v0.3.0 marshals for
// the same program through a Conn that talks to no kernel, as the backend
// sent it until wire.go replaced it.

// googleMarshal runs build against a test-dial Conn and returns the
// messages it would have sent, batch begin/end included, with the echo
// flag cleared and sequence, PID and length left to the connection.
func googleMarshal(t testing.TB, build func(cc *nftables.Conn) error) []netlink.Message {
	t.Helper()
	var msgs []netlink.Message
	cc, err := nftables.New(nftables.WithTestDial(func(req []netlink.Message) ([]netlink.Message, error) {
		msgs = append(msgs, req...)
		acks := make([]netlink.Message, 0, len(req))
		for _, m := range req {
			acks = append(acks, netlink.Message{
				Header: netlink.Header{Type: netlink.Error, Sequence: m.Header.Sequence, PID: m.Header.PID},
				Data:   make([]byte, 4),
			})
		}
		return acks, nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	if err := build(cc); err != nil {
		t.Fatal(err)
	}
	if err := cc.Flush(); err != nil {
		t.Fatal(err)
	}
	for i := range msgs {
		h := &msgs[i].Header
		h.Flags &^= unix.NLM_F_ECHO
		h.Sequence, h.PID, h.Length = 0, 0, 0
	}
	return msgs
}

// googleProgram is prog's batch as google/nftables writes it: table, named
// sets with their first chunk of elements, chains, each rule after its
// anonymous sets, then the further chunks of elements before the end.
func googleProgram(t testing.TB, prog *program, replace bool) []netlink.Message {
	t.Helper()
	addSet := func(cc *nftables.Conn, s setObj) error {
		first := s.elems
		if len(first) > maxElemsPerMsg && !s.set.Anonymous {
			first = first[:maxElemsPerMsg]
		}
		return cc.AddSet(s.set, first)
	}
	msgs := googleMarshal(t, func(cc *nftables.Conn) error {
		if replace {
			cc.DelTable(prog.table)
			cc.AddTable(prog.table)
		} else {
			cc.CreateTable(prog.table)
		}
		for _, s := range prog.sets {
			if err := addSet(cc, s); err != nil {
				return err
			}
		}
		for _, c := range prog.chains {
			cc.AddChain(c)
		}
		for _, r := range prog.rules {
			for _, a := range r.anon {
				if err := addSet(cc, a.setObj); err != nil {
					return err
				}
			}
			cc.AddRule(&nftables.Rule{Table: prog.table, Chain: r.chain, Exprs: r.exprs})
		}
		return nil
	})
	end := msgs[len(msgs)-1]
	msgs = msgs[:len(msgs)-1]
	for _, c := range prog.tailChunks() {
		m := googleMarshal(t, func(cc *nftables.Conn) error { return cc.SetAddElements(c.set, c.elems) })
		if len(m) != 3 {
			t.Fatalf("elements of set %s: %d messages", c.set.Name, len(m))
		}
		msgs = append(msgs, m[1])
	}
	return append(msgs, end)
}

// sameBatch fails t at the first message that differs in type, flags or
// bytes, showing where.
func sameBatch(t testing.TB, name string, got, want []netlink.Message) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d messages, google/nftables writes %d", name, len(got), len(want))
	}
	for i := range want {
		g, w := got[i], want[i]
		if g.Header != w.Header {
			t.Fatalf("%s: message %d: header %+v, google/nftables writes %+v", name, i, g.Header, w.Header)
		}
		if !bytes.Equal(g.Data, w.Data) {
			at := 0
			for at < min(len(g.Data), len(w.Data)) && g.Data[at] == w.Data[at] {
				at++
			}
			t.Fatalf("%s: message %d (type %#x): %d bytes, google/nftables writes %d; first difference at byte %d\n got % x\nwant % x",
				name, i, uint16(w.Header.Type), len(g.Data), len(w.Data), at, g.Data, w.Data)
		}
	}
}

// checkWire compares marshalProgram with google/nftables for p, creating
// and replacing.
func checkWire(t testing.TB, name string, p redirect.Plan, table string) {
	t.Helper()
	for _, replace := range []bool{false, true} {
		prog, err := encode(p, table)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		got, err := marshalProgram(prog, replace)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		// A program of its own for the reference: marshalling must not
		// depend on anything the other one did to the objects.
		ref, err := encode(p, table)
		if err != nil {
			t.Fatal(err)
		}
		sameBatch(t, fmt.Sprintf("%s (replace %t)", name, replace), got, googleProgram(t, ref, replace))
	}
}

// TestWireMatchesGoogle: for every scenario's plan, the plan using the
// whole vocabulary, and one with sets long enough to need several element
// messages, the batch wire.go writes is google/nftables', message for
// message and byte for byte, creating and replacing the table.
func TestWireMatchesGoogle(t *testing.T) {
	for _, sc := range scenarios.All {
		p, err := sc.Plan()
		if err != nil {
			t.Fatal(err)
		}
		checkWire(t, sc.Name, p, TableName)
	}
	checkWire(t, "vocabulary", vocabularyPlan(), TableName)
	checkWire(t, "vocabulary in another table", vocabularyPlan(), "nftmesh-test")
	checkWire(t, "3000 excluded CIDRs", planWithExcludes(t, 3000), TableName)
	checkWire(t, "empty plan", redirect.Plan{}, TableName)
	sameBatch(t, "delete", marshalDelete(TableName), googleMarshal(t, func(cc *nftables.Conn) error {
		cc.DelTable(&nftables.Table{Name: TableName, Family: nftables.TableFamilyINet})
		return nil
	}))
}

// FuzzWireMatchesGoogle: for any annotations that give a plan, wire.go and
// google/nftables write the same batch.
func FuzzWireMatchesGoogle(f *testing.F) {
	f.Add("REDIRECT", "*", "", "*", "", "", "15020", "", "", false, false)
	f.Add("TPROXY", "80,443", "9000", "10.0.0.0/8,2001:db8::/32", "192.0.2.0/24", "5432,5433", "3306", "eth1", "tap0", true, true)
	f.Add("REDIRECT", "", "", "127.0.0.0/8", "::/0,0.0.0.0/0", "65535", "", "+", "eth+", true, false)
	f.Fuzz(func(t *testing.T, mode, inInc, inExc, outInc, outExc, outPorts, outExcPorts, exIf, rerouteIf string, dns, v6 bool) {
		base := redirect.DefaultSpec()
		base.CaptureDNS, base.IPv6 = dns, v6
		s, err := redirect.ParseAnnotations(base, map[string]string{
			redirect.AnnotationInterceptionMode:         mode,
			redirect.AnnotationIncludeInboundPorts:      inInc,
			redirect.AnnotationExcludeInboundPorts:      inExc,
			redirect.AnnotationIncludeOutboundIPRanges:  outInc,
			redirect.AnnotationExcludeOutboundIPRanges:  outExc,
			redirect.AnnotationIncludeOutboundPorts:     outPorts,
			redirect.AnnotationExcludeOutboundPorts:     outExcPorts,
			redirect.AnnotationExcludeInterfaces:        exIf,
			redirect.AnnotationRerouteVirtualInterfaces: rerouteIf,
		})
		if err != nil {
			return
		}
		p, err := redirect.Build(s)
		if err != nil {
			return
		}
		if _, err := encode(p, TableName); err != nil {
			return // refused before any marshalling: not wire.go's to compare
		}
		checkWire(t, "fuzzed", p, TableName)
	})
}

// TestWireRefuses: what encode never makes is refused with an error naming
// it, rather than written differently from google/nftables; so is an
// attribute too long for netlink's 16-bit length.
func TestWireRefuses(t *testing.T) {
	tbl := &nftables.Table{Name: TableName, Family: nftables.TableFamilyINet}
	ch := &nftables.Chain{Name: "c", Table: tbl}
	named := func(mod func(*nftables.Set)) *nftables.Set {
		s := &nftables.Set{Table: tbl, Name: "s", ID: 1, KeyType: nftables.TypeInetService}
		mod(s)
		return s
	}
	for _, tc := range []struct {
		name, want string
		prog       *program
	}{
		{"map", "set s", &program{table: tbl, sets: []setObj{{set: named(func(s *nftables.Set) { s.IsMap = true })}}}},
		{"timeout set", "set s", &program{table: tbl, sets: []setObj{{set: named(func(s *nftables.Set) { s.HasTimeout = true })}}}},
		{"set without ID", "set s", &program{table: tbl, sets: []setObj{{set: named(func(s *nftables.Set) { s.ID = 0 })}}}},
		{"element with timeout", "set s", &program{table: tbl, sets: []setObj{{set: named(func(*nftables.Set) {}),
			elems: []nftables.SetElement{{Key: []byte{0, 80}, Timeout: time.Second}}}}}},
		{"chain on a device", "chain c", &program{table: tbl, chains: []*nftables.Chain{{Name: "c", Table: tbl, Device: "eth0"}}}},
		{"counter", "*expr.Counter", &program{table: tbl, chains: []*nftables.Chain{ch},
			rules: []ruleObj{{chain: ch, exprs: []expr.Any{&expr.Counter{}}}}}},
		{"payload write", "payload", &program{table: tbl, chains: []*nftables.Chain{ch},
			rules: []ruleObj{{chain: ch, exprs: []expr.Any{&expr.Payload{OperationType: expr.PayloadWrite}}}}}},
		{"ct direction", "ct key", &program{table: tbl, chains: []*nftables.Chain{ch},
			rules: []ruleObj{{chain: ch, exprs: []expr.Any{&expr.Ct{Key: expr.CtKeySRC}}}}}},
		{"key of 70000 bytes", "longer than 65535", &program{table: tbl, sets: []setObj{{set: named(func(*nftables.Set) {}),
			elems: []nftables.SetElement{{Key: make([]byte, 70000)}}}}}},
		{"elements over 64 KiB in one message", "longer than 65535", &program{table: tbl, sets: []setObj{{set: named(func(*nftables.Set) {}),
			elems: func() []nftables.SetElement {
				e := make([]nftables.SetElement, 1000)
				for i := range e {
					e[i].Key = make([]byte, 100)
				}
				return e
			}()}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msgs, err := marshalProgram(tc.prog, false)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %d messages, error %v; want an error containing %q", len(msgs), err, tc.want)
			}
		})
	}
}

// BenchmarkMarshal: the batch for the default dual-stack pod and for one
// with 10,000 excluded CIDRs, written by wire.go and by google/nftables
// (the way the backend marshalled it before), side by side in one loop;
// reported per batch and as wire/google ratios of time and of bytes
// allocated.
func BenchmarkMarshal(b *testing.B) {
	for _, tc := range []struct {
		name string
		plan redirect.Plan
	}{
		{"default", scenarios.MustPlan(b, "defaults")},
		{"10k-cidrs", planWithExcludes(b, 10000)},
	} {
		prog, err := encode(tc.plan, TableName)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(tc.name, func(b *testing.B) {
			var wire, google time.Duration
			var wireBytes, googleBytes uint64
			var ms runtime.MemStats
			allocated := func() uint64 { runtime.ReadMemStats(&ms); return ms.TotalAlloc }
			n := 0
			for b.Loop() {
				// ReadMemStats stops the world: outside the timed parts.
				a0 := allocated()
				t0 := time.Now()
				if _, err := marshalProgram(prog, false); err != nil {
					b.Fatal(err)
				}
				wire += time.Since(t0)
				a1 := allocated()
				t1 := time.Now()
				googleProgram(b, prog, false)
				google += time.Since(t1)
				a2 := allocated()
				wireBytes, googleBytes = wireBytes+a1-a0, googleBytes+a2-a1
				n++
			}
			b.ReportMetric(float64(wire.Microseconds())/float64(n), "wire-us")
			b.ReportMetric(float64(google.Microseconds())/float64(n), "google-us")
			b.ReportMetric(float64(wire)/float64(google), "wire/google")
			b.ReportMetric(float64(wireBytes)/float64(googleBytes), "wire/google-bytes")
		})
	}
}
