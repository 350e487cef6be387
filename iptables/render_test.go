package iptables

import (
	"strings"
	"testing"

	"github.com/nftmesh/nftmesh/redirect"
	"github.com/nftmesh/nftmesh/testkit/golden"
	"github.com/nftmesh/nftmesh/testkit/scenarios"
)

var families = []struct {
	fam redirect.Family
	ext string
}{{redirect.FamilyIPv4, "v4"}, {redirect.FamilyIPv6, "v6"}}

func TestRenderGolden(t *testing.T) {
	for _, sc := range scenarios.All {
		p, err := sc.Plan()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range families {
			t.Run(sc.Name+"/"+f.ext, func(t *testing.T) {
				got, err := Render(p, f.fam)
				if err != nil {
					t.Fatalf("Render: %v", err)
				}
				golden.Check(t, "iptables/"+sc.Name+"."+f.ext, got)
			})
		}
	}
}

// lineDiff lists lines only in want (-) or only in got (+), in order.
func lineDiff(want, got string) string {
	a, b := strings.Split(want, "\n"), strings.Split(got, "\n")
	var out []string
	n := max(len(a), len(b))
	for i := 0; i < n; i++ {
		var x, y string
		if i < len(a) {
			x = a[i]
		}
		if i < len(b) {
			y = b[i]
		}
		if x != y {
			out = append(out, "- "+x, "+ "+y)
		}
	}
	return strings.Join(out, "\n")
}

func TestRenderFamilies(t *testing.T) {
	sc, _ := scenarios.ByName("ipv4-only")
	p, err := sc.Plan()
	if err != nil {
		t.Fatal(err)
	}
	v6, err := Render(p, redirect.FamilyIPv6)
	if err != nil || v6 != "" {
		t.Errorf("ipv4-only plan renders %q, %v for IPv6; want nothing", v6, err)
	}
	if _, err := Render(p, redirect.FamilyAny); err == nil {
		t.Error("Render accepted FamilyAny")
	}
}

func TestRenderErrors(t *testing.T) {
	tcp := redirect.MatchProto{Proto: redirect.ProtoTCP}
	many := make([]uint16, 16)
	for i := range many {
		many[i] = uint16(1000 + i)
	}
	cases := []struct {
		name string
		rule redirect.Rule
		sets []redirect.Set
		want string
	}{
		{"negated multiport too long", redirect.Rule{Matches: []redirect.Match{tcp, redirect.MatchPort{Ports: many, Negate: true}}, Verdict: redirect.Return{}}, nil, "exceeds multiport"},
		{"port without proto", redirect.Rule{Matches: []redirect.Match{redirect.MatchPort{Ports: []uint16{1}}}, Verdict: redirect.Return{}}, nil, "needs a tcp or udp"},
		{"missing set", redirect.Rule{Family: redirect.FamilyIPv4, Matches: []redirect.Match{redirect.MatchSet{Set: "x", Kind: redirect.SetIPv4}}, Verdict: redirect.Return{}}, nil, "set x missing"},
		{"negated addr set", redirect.Rule{Family: redirect.FamilyIPv4, Matches: []redirect.Match{redirect.MatchSet{Set: "x", Kind: redirect.SetIPv4, Negate: true}}, Verdict: redirect.Return{}},
			[]redirect.Set{{Name: "x", Kind: redirect.SetIPv4, Prefixes: []netipPrefix{mustPrefix("192.0.2.0/24"), mustPrefix("198.51.100.0/24")}}}, "negated address set"},
		{"no verdict", redirect.Rule{}, nil, "no verdict"},
		{"redirect without proto", redirect.Rule{Verdict: redirect.Redirect{Port: 1}}, nil, "REDIRECT needs"},
		{"long iface", redirect.Rule{Matches: []redirect.Match{redirect.MatchIface{Name: "abcdefghijklmnop"}}, Verdict: redirect.Return{}}, nil, "longer than 15"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := redirect.Plan{Sets: c.sets, Tables: []redirect.Table{{Name: redirect.TableNat, Chains: []redirect.Chain{{Name: "ISTIO_X", Rules: []redirect.Rule{c.rule}}}}}}
			_, err := Render(p, redirect.FamilyIPv4)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("err = %v, want one containing %q", err, c.want)
			}
		})
	}
}
