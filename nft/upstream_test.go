package nft

import (
	"encoding/binary"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/nftmesh/nftmesh/redirect"
)

// TestUpstreamStillMisreads pins what raw.go works around in
// google/nftables v0.3.0. Each case fails once an upgrade no longer needs
// the workaround, saying what to drop.
func TestUpstreamStillMisreads(t *testing.T) {
	t.Run("ct set drops its source register (fixed upstream by #301)", func(t *testing.T) {
		b, err := expr.Marshal(byte(nftables.TableFamilyINet), &expr.Ct{Key: expr.CtKeyMARK, Register: 1, SourceRegister: true})
		if err != nil {
			t.Fatal(err)
		}
		var got expr.Ct
		if err := expr.Unmarshal(byte(nftables.TableFamilyINet), exprData(t, b), &got); err != nil {
			t.Fatal(err)
		}
		if got.SourceRegister {
			t.Fatal("google/nftables now reads NFTA_CT_SREG: parse ct with expr.Unmarshal in raw.go's parseExpr")
		}
	})
	t.Run("a short verdict panics", func(t *testing.T) {
		data, err := netlink.MarshalAttributes([]netlink.Attribute{{
			Type: unix.NLA_F_NESTED | unix.NFTA_IMMEDIATE_DATA,
			Data: mustAttrs(t, netlink.Attribute{Type: unix.NFTA_DATA_VERDICT, Data: []byte{0, 0}}),
		}})
		if err != nil {
			t.Fatal(err)
		}
		panicked := func() (p bool) {
			defer func() { p = recover() != nil }()
			_ = expr.Unmarshal(byte(nftables.TableFamilyINet), data, &expr.Verdict{})
			return false
		}()
		if !panicked {
			t.Fatal("google/nftables no longer panics on a short verdict: drop unmarshalExpr's recover in raw.go")
		}
	})
	t.Run("table flags read in host byte order", misreadsTableFlags)
	t.Run("GetRules skips tproxy and expressions it does not know", func(t *testing.T) {
		tproxy, err := expr.Marshal(byte(nftables.TableFamilyINet), &expr.TProxy{Family: unix.NFPROTO_IPV4, TableFamily: byte(nftables.TableFamilyINet), RegPort: 1})
		if err != nil {
			t.Fatal(err)
		}
		unknown := mustAttrs(t, netlink.Attribute{Type: unix.NFTA_EXPR_NAME, Data: []byte("bogus\x00")},
			netlink.Attribute{Type: unix.NLA_F_NESTED | unix.NFTA_EXPR_DATA, Data: mustAttrs(t, netlink.Attribute{Type: 1, Data: []byte{0, 0, 0, 1}})})
		rule := mustAttrs(t,
			netlink.Attribute{Type: unix.NFTA_RULE_TABLE, Data: []byte(TableName + "\x00")},
			netlink.Attribute{Type: unix.NFTA_RULE_CHAIN, Data: []byte("c\x00")},
			netlink.Attribute{Type: unix.NLA_F_NESTED | unix.NFTA_RULE_EXPRESSIONS, Data: mustAttrs(t,
				netlink.Attribute{Type: unix.NLA_F_NESTED | unix.NFTA_LIST_ELEM, Data: tproxy},
				netlink.Attribute{Type: unix.NLA_F_NESTED | unix.NFTA_LIST_ELEM, Data: unknown},
			)},
		)
		cc, err := nftables.New(nftables.WithTestDial(func(req []netlink.Message) ([]netlink.Message, error) {
			return []netlink.Message{{
				Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_NEWRULE), Sequence: req[0].Header.Sequence},
				Data:   append([]byte{unix.NFPROTO_INET, unix.NFNETLINK_V0, 0, 0}, rule...),
			}}, nil
		}))
		if err != nil {
			t.Fatal(err)
		}
		tbl := &nftables.Table{Name: TableName, Family: nftables.TableFamilyINet}
		rules, err := cc.GetRules(tbl, &nftables.Chain{Name: "c", Table: tbl})
		if err != nil {
			t.Fatalf("GetRules: %v", err)
		}
		if len(rules) != 1 || len(rules[0].Exprs) != 0 {
			t.Fatalf("google/nftables now returns %d rules, the first with %d expressions (%#v): see whether raw.go's dumpRules can become Conn.GetRules", len(rules), len(rules[0].Exprs), rules[0].Exprs)
		}
	})
}

// misreadsTableFlags: v0.3.0 reads NFTA_TABLE_FLAGS in host byte order
// (raw.go, 3).
func misreadsTableFlags(t *testing.T) {
	if binary.NativeEndian.Uint16([]byte{0, 1}) == 1 {
		t.Skip("big-endian host: host order is the kernel's")
	}
	table := mustAttrs(t,
		netlink.Attribute{Type: unix.NFTA_TABLE_NAME, Data: []byte(TableName + "\x00")},
		netlink.Attribute{Type: unix.NFTA_TABLE_FLAGS, Data: []byte{0, 0, 0, 1}}, // dormant, big-endian
	)
	cc, err := nftables.New(nftables.WithTestDial(func(req []netlink.Message) ([]netlink.Message, error) {
		return []netlink.Message{{
			Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_NEWTABLE), Sequence: req[0].Header.Sequence},
			Data:   append([]byte{unix.NFPROTO_INET, unix.NFNETLINK_V0, 0, 0}, table...),
		}}, nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	got, err := cc.ListTableOfFamily(TableName, nftables.TableFamilyINet)
	if err != nil {
		t.Fatalf("ListTableOfFamily: %v", err)
	}
	if got.Flags == 1 {
		t.Fatal("google/nftables now reads NFTA_TABLE_FLAGS big-endian: drop raw.go's tableFlags")
	}
	if f := tableFlags(got); f != redirect.TableDormant {
		t.Fatalf("tableFlags = %s, want dormant", f)
	}
}

// exprData is the NFTA_EXPR_DATA of one marshalled expression.
func exprData(t *testing.T, b []byte) []byte {
	t.Helper()
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		t.Fatal(err)
	}
	for ad.Next() {
		if ad.Type() == unix.NFTA_EXPR_DATA {
			return ad.Bytes()
		}
	}
	t.Fatalf("no NFTA_EXPR_DATA in % x", b)
	return nil
}

func mustAttrs(t *testing.T, attrs ...netlink.Attribute) []byte {
	t.Helper()
	b, err := netlink.MarshalAttributes(attrs)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
