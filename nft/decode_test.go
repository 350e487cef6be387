package nft

import (
	"strings"
	"testing"

	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/nftmesh/nftmesh/redirect"
	"github.com/nftmesh/nftmesh/testkit/scenarios"
)

// asLive turns encoder output into what the rule dump yields (tproxy is
// parsed by us, anonymous sets get kernel names).
func asLive(ro ruleObj) ([]any, map[string][]uint16) {
	anon := map[string][]uint16{}
	var out []any
	for i, a := range ro.anon {
		name := "__set" + string(rune('0'+i))
		ports, _ := decodePorts(a.elems)
		anon[name] = ports
		for _, e := range ro.exprs {
			if lk, ok := e.(*expr.Lookup); ok && lk.SetID == a.set.ID {
				lk.SetName = name
			}
		}
	}
	for _, e := range ro.exprs {
		if t, ok := e.(*expr.TProxy); ok {
			out = append(out, &tproxyExpr{family: uint32(t.Family), regPort: t.RegPort, regAddr: t.RegAddr})
			continue
		}
		out = append(out, e)
	}
	return out, anon
}

// TestEncodeDecodeRoundTrip runs every rule of every scenario (and the
// vocabulary plan) through the encoder and back through the decoder, without
// a kernel.
func TestEncodeDecodeRoundTrip(t *testing.T) {
	plans := []redirect.Plan{vocabularyPlan()}
	for _, sc := range scenarios.All {
		p, err := sc.Plan()
		if err != nil {
			t.Fatal(err)
		}
		plans = append(plans, p)
	}
	for _, p := range plans {
		prog, err := encode(p, TableName)
		if err != nil {
			t.Fatal(err)
		}
		kinds := map[string]redirect.SetKind{}
		for _, s := range p.Sets {
			kinds[s.Name] = s.Kind
		}
		i := 0
		for _, tb := range p.Tables {
			for _, c := range tb.Chains {
				for _, want := range c.Rules {
					es, anon := asLive(prog.rules[i])
					i++
					d := ruleDecoder{table: tb.Name, es: es, anon: anon, sets: kinds}
					got, err := d.decode()
					if err != nil {
						t.Fatalf("%s/%s %s: %v", tb.Name, c.Name, want, err)
					}
					if got.String() != want.String() {
						t.Errorf("%s/%s: decoded %s, want %s", tb.Name, c.Name, got, want)
					}
				}
			}
		}
	}
}

func TestDecodeRejectsForeignRules(t *testing.T) {
	reg1 := uint32(unix.NFT_REG_1)
	meta := func(k expr.MetaKey) *expr.Meta { return &expr.Meta{Key: k, Register: reg1} }
	cmp := func(op expr.CmpOp, b ...byte) *expr.Cmp { return &expr.Cmp{Op: op, Register: reg1, Data: b} }
	accept := &expr.Verdict{Kind: expr.VerdictAccept}
	for _, c := range []struct {
		name string
		es   []any
		want string
	}{
		{"empty", nil, "no verdict"},
		{"counter", []any{&expr.Counter{}, accept}, "unexpected *expr.Counter"},
		{"lt compare", []any{meta(expr.MetaKeyL4PROTO), cmp(expr.CmpOpLt, 6), accept}, "equality"},
		{"negated l4proto", []any{meta(expr.MetaKeyL4PROTO), cmp(expr.CmpOpNeq, 6), accept}, "equality"},
		{"unknown meta", []any{meta(expr.MetaKeyCPU), cmp(expr.CmpOpEq, 0, 0, 0, 0), accept}, "unsupported meta key"},
		{"load without compare", []any{meta(expr.MetaKeySKUID), accept}, "comparison"},
		{"after verdict", []any{accept, meta(expr.MetaKeySKUID), cmp(expr.CmpOpEq, 0, 0, 0, 0)}, "after the verdict"},
		{"address without family", []any{&expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4}, cmp(expr.CmpOpEq, 1, 2, 3, 4), accept}, "not an address"},
		{"ttl", []any{meta(expr.MetaKeyNFPROTO), cmp(expr.CmpOpEq, unix.NFPROTO_IPV4), &expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseNetworkHeader, Offset: 8, Len: 1}, cmp(expr.CmpOpEq, 1), accept}, "not an address"},
		{"bad ifname", []any{meta(expr.MetaKeyIIFNAME), cmp(expr.CmpOpEq, []byte("lo\x00x\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00")...), accept}, "NUL-padded"},
		{"jump to other table", []any{&expr.Verdict{Kind: expr.VerdictJump, Chain: "mangle-istio-divert"}}, "jump from table nat"},
		{"jump to foreign chain", []any{&expr.Verdict{Kind: expr.VerdictJump, Chain: "KUBE-SERVICES"}}, "jump"},
		{"unknown set", []any{&expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2}, &expr.Lookup{SourceRegister: reg1, SetName: "nope"}, accept}, "unknown set"},
		{"lone immediate", []any{&expr.Immediate{Register: reg1, Data: []byte{0, 1}}, accept}, "immediate not followed"},
		{"queue verdict", []any{&expr.Verdict{Kind: expr.VerdictQueue}}, "unsupported verdict"},
	} {
		d := ruleDecoder{table: redirect.TableNat, es: c.es, sets: map[string]redirect.SetKind{}}
		r, err := d.decode()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: decoded %v, err %v; want an error containing %q", c.name, r, err, c.want)
		}
	}
}

func TestEncodeRejects(t *testing.T) {
	base := func() redirect.Plan {
		return redirect.Plan{Tables: []redirect.Table{{Name: redirect.TableNat, Chains: []redirect.Chain{
			{Name: "OUTPUT", Hook: redirect.HookOutput, Type: redirect.ChainTypeNat, Priority: redirect.PriorityNat},
		}}}}
	}
	for _, c := range []struct {
		name string
		rule redirect.Rule
		want string
	}{
		{"nil match", redirect.Rule{Matches: []redirect.Match{nil}, Verdict: redirect.Accept{}}, "nil match"},
		{"nil verdict", redirect.Rule{}, "no verdict"},
		{"long ifname", redirect.Rule{Matches: []redirect.Match{redirect.MatchIface{Name: "averyveryverylongname"}}, Verdict: redirect.Accept{}}, "interface name"},
		{"bare wildcard", redirect.Rule{Matches: []redirect.Match{redirect.MatchIface{Name: "+"}}, Verdict: redirect.Accept{}}, "wildcard"},
		{"empty ct state", redirect.Rule{Matches: []redirect.Match{redirect.MatchCTState{}}, Verdict: redirect.Accept{}}, "without states"},
		{"bad family", redirect.Rule{Family: 9, Verdict: redirect.Accept{}}, "family"},
	} {
		p := base()
		p.Tables[0].Chains[0].Rules = []redirect.Rule{c.rule}
		_, err := encode(p, TableName)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err %v, want one containing %q", c.name, err, c.want)
		}
		if _, err := Render(p); err == nil {
			t.Errorf("%s: Render accepted what encode refuses", c.name)
		}
	}
	p := base()
	p.Tables[0].Chains[0].Name = "output"
	if _, err := encode(p, TableName); err == nil {
		t.Error("a lower-case chain name was encoded; List could not map it back")
	}
}

// FuzzParseRule feeds arbitrary bytes to the rule-message parser and the
// decoder: kernel replies are untrusted input too; no panics.
func FuzzParseRule(f *testing.F) {
	p, _ := scenarios.All[0].Plan()
	prog, _ := encode(p, TableName)
	for _, r := range prog.rules {
		var list []netlink.Attribute
		for _, e := range r.exprs {
			b, err := expr.Marshal(unix.NFPROTO_INET, e)
			if err != nil {
				f.Fatal(err)
			}
			list = append(list, netlink.Attribute{Type: unix.NLA_F_NESTED | unix.NFTA_LIST_ELEM, Data: b})
		}
		b, err := netlink.MarshalAttributes(list)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		es, err := parseExprs(b)
		if err != nil {
			return
		}
		d := ruleDecoder{table: redirect.TableNat, es: es, sets: map[string]redirect.SetKind{}}
		_, _ = d.decode()
		_, _ = parseRule(b)
	})
}

// TestParseRuleMalformed: a rule message whose attributes do not parse
// names what failed.
func TestParseRuleMalformed(t *testing.T) {
	if _, err := parseRule([]byte{1, 2, 3}); err == nil || !strings.HasPrefix(err.Error(), "parsing rule: ") {
		t.Fatalf("parseRule(3 bytes) = %v, want a \"parsing rule: \" error", err)
	}
}
