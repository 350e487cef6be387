package nft

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/nftables"

	"github.com/nftmesh/nftmesh/redirect"
	"github.com/nftmesh/nftmesh/testkit/golden"
	"github.com/nftmesh/nftmesh/testkit/scenarios"
)

func TestGolden(t *testing.T) {
	for _, sc := range scenarios.All {
		t.Run(sc.Name, func(t *testing.T) {
			p, err := sc.Plan()
			if err != nil {
				t.Fatal(err)
			}
			got, err := Render(p)
			if err != nil {
				t.Fatal(err)
			}
			again, _ := Render(p)
			if got != again {
				t.Fatal("Render is not deterministic")
			}
			golden.Check(t, "nft/"+sc.Name+".nft", got)
		})
	}
}

func TestChainName(t *testing.T) {
	for _, c := range []struct {
		table redirect.TableName
		chain string
		want  string
	}{
		{redirect.TableNat, "PREROUTING", "nat-prerouting"},
		{redirect.TableNat, "ISTIO_INBOUND", "nat-istio-inbound"},
		{redirect.TableMangle, "ISTIO_TPROXY", "mangle-istio-tproxy"},
		{redirect.TableRaw, "ISTIO_OUTPUT_DNS", "raw-istio-output-dns"},
	} {
		if got := ChainName(c.table, c.chain); got != c.want {
			t.Errorf("ChainName(%s, %s) = %s, want %s", c.table, c.chain, got, c.want)
		}
		tb, ch, err := splitChainName(c.want)
		if err != nil || tb != c.table || ch != c.chain {
			t.Errorf("splitChainName(%s) = %s, %s, %v", c.want, tb, ch, err)
		}
	}
	// The one-allocation path gives what lower-casing the joined name
	// gives, for any table and chain (Unicode included: the long way).
	for _, in := range [][2]string{{"nat", "A_b-C"}, {"MANGLE", "x"}, {"raw", ""}, {"", "_"}, {"nat", "ÄÖ_Ü"}, {"nat", "İSTIO"}, {"Ğ", "X_Y"}, {"nat", "\xff_A"}} {
		want := strings.ToLower(in[0] + "-" + strings.ReplaceAll(in[1], "_", "-"))
		if got := ChainName(redirect.TableName(in[0]), in[1]); got != want {
			t.Errorf("ChainName(%q, %q) = %q, want %q", in[0], in[1], got, want)
		}
	}
	for _, bad := range []string{"nat", "filter-x", "nat-", "-x"} {
		if _, _, err := splitChainName(bad); err == nil {
			t.Errorf("splitChainName(%q) accepted", bad)
		}
	}
	if err := checkChainName(redirect.TableNat, "istio_lower"); err == nil {
		t.Error("a lower-case chain name cannot come back from List; encode must refuse it")
	}
	if err := checkChainName(redirect.TableNat, "ISTIO-DASH"); err == nil {
		t.Error("a chain name with '-' cannot come back from List; encode must refuse it")
	}
	lower := redirect.Plan{Tables: []redirect.Table{{Name: redirect.TableNat, Chains: []redirect.Chain{{Name: "istio_lower"}}}}}
	if _, err := Render(lower); err == nil {
		t.Error("Render printed a chain name that Apply refuses")
	}
}

func TestIntervalElementsAllOnes(t *testing.T) {
	for _, c := range []struct {
		prefixes []string
		elems    int // start + end elements
	}{
		{[]string{"10.0.0.0/8"}, 2},
		{[]string{"255.255.255.0/24"}, 1},
		{[]string{"0.0.0.0/0"}, 1},
		{[]string{"10.0.0.0/8", "11.0.0.0/8"}, 2},
		{[]string{"ffff::/16"}, 1},
		{[]string{"::/0"}, 1},
		{[]string{"2001:db8::/32", "fe80::/10"}, 4},
	} {
		var ps []netip.Prefix
		for _, s := range c.prefixes {
			ps = append(ps, netip.MustParsePrefix(s))
		}
		rs := redirect.MergePrefixes(ps)
		elems := intervalElements(rs)
		if len(elems) != c.elems {
			t.Errorf("%v: %d elements, want %d", c.prefixes, len(elems), c.elems)
		}
		back, err := decodeIntervals(elems, ps[0].Addr().Is6())
		if err != nil {
			t.Fatalf("%v: %v", c.prefixes, err)
		}
		var got []netip.Prefix
		for _, r := range back {
			got = append(got, rangePrefixes(r)...)
		}
		if a, b := describeRanges(redirect.MergePrefixes(got)), describeRanges(rs); a != b {
			t.Errorf("%v: round trip gives %s, want %s", c.prefixes, a, b)
		}
	}
}

func describeRanges(rs []redirect.AddrRange) string {
	var s []string
	for _, r := range rs {
		s = append(s, r.String())
	}
	return strings.Join(s, ",")
}

func TestRangePrefixes(t *testing.T) {
	r := redirect.AddrRange{From: netip.MustParseAddr("10.0.0.1"), To: netip.MustParseAddr("10.0.0.6")}
	var got []string
	for _, p := range rangePrefixes(r) {
		got = append(got, p.String())
	}
	if want := "10.0.0.1/32,10.0.0.2/31,10.0.0.4/31,10.0.0.6/32"; strings.Join(got, ",") != want {
		t.Errorf("rangePrefixes = %v, want %s", got, want)
	}
}

// TestPortIntervalRoundTrip: port lists go to the kernel as merged ranges
// (a range up to 65535 without an end element) and come back as the same
// ports; nft's opening end element at 0 bounds nothing.
func TestPortIntervalRoundTrip(t *testing.T) {
	all := make([]uint16, 0, 65535)
	for p := 1; p <= 65535; p++ {
		all = append(all, uint16(p))
	}
	for _, c := range []struct {
		name  string
		ports []uint16
		elems int
	}{
		{"one port", []uint16{80}, 2},
		{"adjacent merge", []uint16{15021, 15090, 15020}, 4},
		{"repeats", []uint16{8080, 8080, 8081}, 2},
		{"top port", []uint16{65534, 65535}, 1},
		{"zero and top", []uint16{0, 65535}, 3},
		{"every port", all, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			elems := portIntervalElements(redirect.MergePorts(c.ports))
			if len(elems) != c.elems {
				t.Errorf("%d elements, want %d", len(elems), c.elems)
			}
			for _, withOpener := range []bool{false, true} {
				in := elems
				if withOpener && c.ports[0] != 0 {
					in = append([]nftables.SetElement{{Key: be16(0), IntervalEnd: true}}, elems...)
				}
				got, err := decodePortIntervals(in)
				if err != nil {
					t.Fatal(err)
				}
				if want := redirect.SortedPorts(c.ports); !slices.Equal(got, want) {
					t.Errorf("opener %v: round trip gives %d ports, want %d", withOpener, len(got), len(want))
				}
			}
		})
	}
	for _, bad := range [][]nftables.SetElement{
		{{Key: be16(80), IntervalEnd: true}, {Key: be16(81), IntervalEnd: true}},
		{{Key: []byte{1, 2, 3}}},
	} {
		if got, err := decodePortIntervals(bad); err == nil {
			t.Errorf("decodePortIntervals(%v) = %v, want an error", bad, got)
		}
	}
}
