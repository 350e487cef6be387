package nft

import (
	"strings"
	"testing"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
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
