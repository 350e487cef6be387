package nft

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/nftmesh/nftmesh/testkit/scenarios"
)

// tableMsg is the data of one NFT_MSG_NEWTABLE message: nfgenmsg and
// attributes.
func tableMsg(t *testing.T, fam uint8, attrs ...netlink.Attribute) []byte {
	t.Helper()
	b, err := netlink.MarshalAttributes(attrs)
	if err != nil {
		t.Fatal(err)
	}
	return append([]byte{fam, unix.NFNETLINK_V0, 0, 0}, b...)
}

func TestParseTable(t *testing.T) {
	name := func(s string) netlink.Attribute {
		return netlink.Attribute{Type: unix.NFTA_TABLE_NAME, Data: []byte(s + "\x00")}
	}
	flags := netlink.Attribute{Type: unix.NFTA_TABLE_FLAGS, Data: []byte{0, 0, 0, 0}}
	for _, tc := range []struct {
		name string
		data []byte
		want TableRef
		err  string
	}{
		{name: "inet nftmesh", data: tableMsg(t, unix.NFPROTO_INET, flags, name("nftmesh")), want: TableRef{Family: unix.NFPROTO_INET, Name: "nftmesh"}},
		{name: "ip nat", data: tableMsg(t, unix.NFPROTO_IPV4, name("nat")), want: TableRef{Family: unix.NFPROTO_IPV4, Name: "nat"}},
		{name: "short", data: []byte{1, 0}, err: "short table message"},
		{name: "no name", data: tableMsg(t, unix.NFPROTO_INET, flags), err: "without a name"},
		{name: "bad attributes", data: append([]byte{1, 0, 0, 0}, 0xff, 0xff, 0, 0), err: "parsing table message"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseTable(tc.data)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("parseTable = %v, %v; want an error containing %q", got, err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("parseTable = %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}

// FuzzParseTable: whatever a table dump holds, parsing it never panics.
func FuzzParseTable(f *testing.F) {
	b, _ := netlink.MarshalAttributes([]netlink.Attribute{{Type: unix.NFTA_TABLE_NAME, Data: []byte("nftmesh\x00")}})
	f.Add(append([]byte{unix.NFPROTO_INET, 0, 0, 0}, b...))
	f.Fuzz(func(t *testing.T, b []byte) { _, _ = parseTable(b) })
}

// TestPreparePanicFailsClosed: a panic in the work Prepare runs on its own
// goroutine (outside any handler's recover) fails that plan's Apply, which
// sends nothing, and the process goes on serving: the next Apply works.
func TestPreparePanicFailsClosed(t *testing.T) {
	p := scenarios.MustPlan(t, "defaults")
	prepareHook = func() { panic("injected") }
	pr := prepare(p, TableName, true) // on a goroutine, as with GOMAXPROCS > 1
	<-pr.done
	prepareHook = nil
	if os.Geteuid() != 0 {
		err := New().With(pr).Apply(context.Background(), "/nonexistent/netns", p)
		if err == nil || !strings.Contains(err.Error(), "panicked: injected") {
			t.Fatalf("Apply after a panicking prepare: %v; want the panic as its error", err)
		}
		return
	}
	ns, cleanup := newNetns(t)
	defer cleanup()
	err := New().With(pr).Apply(context.Background(), ns, p)
	if err == nil || !strings.Contains(err.Error(), "panicked: injected") {
		t.Fatalf("Apply after a panicking prepare: %v; want the panic as its error", err)
	}
	if got, err := New().List(context.Background(), ns); err != nil || len(got.Tables) != 0 {
		t.Fatalf("after the failed Apply: %d tables listed (%v); want none", len(got.Tables), err)
	}
	b := New()
	if err := b.With(b.Prepare(p)).Apply(context.Background(), ns, p); err != nil {
		t.Fatalf("the next Apply: %v", err)
	}
}
