package nft

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/nftmesh/nftmesh/redirect"
	"github.com/nftmesh/nftmesh/testkit/nstest"
	"github.com/nftmesh/nftmesh/testkit/scenarios"
)

// sent queues prog on a google/nftables Conn that talks to no kernel and
// returns the batch its Flush sends, begin and end included.
func sent(t testing.TB, prog *program, replace bool) []netlink.Message {
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
	if err := queue(cc, prog, replace); err != nil {
		t.Fatal(err)
	}
	if err := cc.Flush(); err != nil {
		t.Fatal(err)
	}
	return msgs
}

func msgType(m netlink.Message) int {
	if t := int(m.Header.Type); t == unix.NFNL_MSG_BATCH_BEGIN || t == unix.NFNL_MSG_BATCH_END {
		return t
	}
	return int(m.Header.Type) & 0xff
}

// elemList returns the length of a NEWSETELEM message's element list.
func elemList(t testing.TB, m netlink.Message) int {
	t.Helper()
	ad, err := netlink.NewAttributeDecoder(m.Data[4:])
	if err != nil {
		t.Fatal(err)
	}
	for ad.Next() {
		if ad.Type() == unix.NFTA_SET_ELEM_LIST_ELEMENTS {
			return 4 + len(ad.Bytes())
		}
	}
	t.Fatalf("NEWSETELEM without an element list: % x", m.Data)
	return 0
}

// TestQueueBatch: the batch google/nftables sends for a program is in the
// order nft sends it (the table created exclusively, or deleted and added
// when replacing; named sets with their first elements; chains; each rule
// after its anonymous set; then the named sets' further elements), and
// every element list is as long as fits computes, so that its refusal of
// lists over 64 KiB is exact.
func TestQueueBatch(t *testing.T) {
	plans := map[string]redirect.Plan{"vocabulary": vocabularyPlan(), "3000 excluded CIDRs": planWithExcludes(t, 3000)}
	for _, sc := range scenarios.All {
		plans[sc.Name] = scenarios.MustPlan(t, sc.Name)
	}
	for name, p := range plans {
		for _, replace := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/replace=%t", name, replace), func(t *testing.T) {
				prog, err := encode(p, TableName)
				if err != nil {
					t.Fatal(err)
				}
				want := []int{unix.NFNL_MSG_BATCH_BEGIN}
				var lists [][]nftables.SetElement // each NEWSETELEM's elements, in order
				if replace {
					want = append(want, unix.NFT_MSG_DELTABLE)
				}
				want = append(want, unix.NFT_MSG_NEWTABLE)
				for _, s := range prog.sets {
					want = append(want, unix.NFT_MSG_NEWSET)
					if len(s.elems) > 0 {
						want = append(want, unix.NFT_MSG_NEWSETELEM)
						lists = append(lists, s.elems[:min(len(s.elems), maxElemsPerMsg)])
					}
				}
				for range prog.chains {
					want = append(want, unix.NFT_MSG_NEWCHAIN)
				}
				for _, r := range prog.rules {
					for _, a := range r.anon {
						want = append(want, unix.NFT_MSG_NEWSET, unix.NFT_MSG_NEWSETELEM)
						lists = append(lists, a.elems)
					}
					want = append(want, unix.NFT_MSG_NEWRULE)
				}
				for _, c := range prog.tailChunks() {
					want = append(want, unix.NFT_MSG_NEWSETELEM)
					lists = append(lists, c.elems)
				}
				want = append(want, unix.NFNL_MSG_BATCH_END)

				msgs := sent(t, prog, replace)
				got := make([]int, len(msgs))
				for i, m := range msgs {
					got[i] = msgType(m)
				}
				if fmt.Sprint(got) != fmt.Sprint(want) {
					t.Fatalf("message types\n got %v\nwant %v", got, want)
				}
				if !replace && msgs[1].Header.Flags&netlink.Excl == 0 {
					t.Fatalf("creating NEWTABLE flags %v: not exclusive", msgs[1].Header.Flags)
				}
				i := 0
				for _, m := range msgs {
					if msgType(m) != unix.NFT_MSG_NEWSETELEM {
						continue
					}
					if got, want := elemList(t, m), elemListLen(lists[i]); got != want {
						t.Fatalf("element list %d: %d bytes marshalled, elemListLen says %d", i, got, want)
					}
					i++
				}
			})
		}
	}
}

// portsPlan is the default plan with one more rule, first in its first
// chain, matching n literal ports, which the backend puts in the rule's
// anonymous set. (Build names a set for long port lists; a plan given as
// such may have any.)
func portsPlan(tb testing.TB, n int) redirect.Plan {
	tb.Helper()
	p := scenarios.MustPlan(tb, "defaults")
	ports := make([]uint16, n)
	for i := range ports {
		ports[i] = uint16(1000 + i)
	}
	c := &p.Tables[0].Chains[0]
	r := redirect.Rule{Family: redirect.FamilyAny, Matches: []redirect.Match{redirect.MatchProto{Proto: redirect.ProtoTCP}, redirect.MatchPort{Ports: ports}}, Verdict: redirect.Return{}}
	c.Rules = append([]redirect.Rule{r}, c.Rules...)
	if err := p.Verify(); err != nil {
		tb.Fatal(err)
	}
	return p
}

// TestQueueRefusesOverlongLists: an element list longer than a netlink
// attribute holds (the library would write its length modulo 2^16) is
// refused, naming the set, before anything is queued; the longest that
// fits goes through.
func TestQueueRefusesOverlongLists(t *testing.T) {
	tbl := &nftables.Table{Name: TableName, Family: nftables.TableFamilyINet}
	named := &nftables.Set{Table: tbl, Name: "s", ID: 1, KeyType: nftables.TypeInetService}
	for _, tc := range []struct {
		name string
		prog *program
		want string // "" for a program that fits
	}{
		{"4095 ports in an anonymous set", mustEncode(t, portsPlan(t, 4095)), ""},
		{"4096 ports in an anonymous set", mustEncode(t, portsPlan(t, 4096)), "set __set%d: 4096 elements take 65540 bytes"},
		{"a key of 70000 bytes", &program{table: tbl, sets: []setObj{{set: named,
			elems: []nftables.SetElement{{Key: make([]byte, 70000)}}}}}, "set s: 1 elements take 70016 bytes"},
		{"1000 keys of 100 bytes in one chunk", &program{table: tbl, sets: []setObj{{set: named,
			elems: func() []nftables.SetElement {
				e := make([]nftables.SetElement, 1000)
				for i := range e {
					e[i].Key = make([]byte, 100)
				}
				return e
			}()}}}, "set s: 1000 elements take 112004 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cc, err := nftables.New(nftables.WithTestDial(func([]netlink.Message) ([]netlink.Message, error) {
				t.Fatal("a refused program reached the socket")
				return nil, nil
			}))
			if err != nil {
				t.Fatal(err)
			}
			err = queue(cc, tc.prog, false)
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("queue: %v; want an error containing %q", err, tc.want)
			}
			if err := cc.Flush(); err != nil {
				t.Fatalf("Flush after the refusal: %v (something was queued)", err)
			}
		})
	}
}

func mustEncode(tb testing.TB, p redirect.Plan) *program {
	tb.Helper()
	prog, err := encode(p, TableName)
	if err != nil {
		tb.Fatal(err)
	}
	return prog
}

// TestApplyRefusesOverlongList: into a namespace, a plan whose port list
// cannot be sent whole fails with the set named, and leaves no table.
func TestApplyRefusesOverlongList(t *testing.T) {
	nstest.NeedRoot(t)
	ns, cleanup := newNetns(t)
	defer cleanup()
	err := New().Apply(context.Background(), ns, portsPlan(t, 5000))
	if err == nil || !strings.Contains(err.Error(), "more than one netlink attribute holds") {
		t.Fatalf("Apply: %v; want the overlong list refused", err)
	}
	if got, err := New().List(context.Background(), ns); err != nil || len(got.Tables) != 0 {
		t.Fatalf("after the refusal: %d tables (%v); want none", len(got.Tables), err)
	}
}

// BenchmarkMarshal: google/nftables marshalling the batch that creates
// the table (marshal), for the default dual-stack pod and for one with
// 10,000 excluded CIDRs: what an Apply spends before its one sendmsg when
// its plan is not in the cache (created).
func BenchmarkMarshal(b *testing.B) {
	for _, tc := range []struct {
		name string
		plan redirect.Plan
	}{
		{"default", scenarios.MustPlan(b, "defaults")},
		{"10k-cidrs", planWithExcludes(b, 10000)},
	} {
		prog := mustEncode(b, tc.plan)
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := marshal(prog, false); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestMarshalIsTheLibrarysBatch: the creating and replacing batches sent by
// hand are the ones google/nftables' Flush sends for the program, message
// for message and byte for byte, less the echo flag on each rule.
func TestMarshalIsTheLibrarysBatch(t *testing.T) {
	for _, c := range []struct {
		p       redirect.Plan
		replace bool
	}{{scenarios.MustPlan(t, "defaults"), false}, {vocabularyPlan(), false}, {planWithExcludes(t, 3000), false}, {scenarios.MustPlan(t, "tproxy"), true}} {
		prog := mustEncode(t, c.p)
		got, err := marshal(prog, c.replace)
		if err != nil {
			t.Fatal(err)
		}
		want := sent(t, prog, c.replace)
		if len(got) != len(want) {
			t.Fatalf("%d messages, Flush sends %d", len(got), len(want))
		}
		for i := range want {
			g, w := got[i], want[i]
			if g.Header.Flags&netlink.Echo != 0 {
				t.Fatalf("message %d asks for an echo", i)
			}
			if g.Header.Type != w.Header.Type || g.Header.Flags != w.Header.Flags&^netlink.Echo || string(g.Data) != string(w.Data) {
				t.Fatalf("message %d: %+v % x; Flush sends %+v % x", i, g.Header, g.Data, w.Header, w.Data)
			}
		}
	}
}
