package redirect

import (
	"net/netip"
	"strings"
	"testing"
)

// rulesOf returns the chain's rules, projected on one family, as Describe
// strings without the family prefix.
func rulesOf(t *testing.T, p Plan, table TableName, chain string, fam Family) []string {
	t.Helper()
	tab := p.Table(table)
	if tab == nil {
		return nil
	}
	c := tab.Chain(chain)
	if c == nil {
		return nil
	}
	var out []string
	for _, r := range c.Rules {
		if r.Family.Includes(fam) || fam == FamilyAny {
			r.Family = FamilyAny
			out = append(out, r.String())
		}
	}
	return out
}

func mustBuild(t *testing.T, s Spec) Plan {
	t.Helper()
	p, err := Build(s)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Verify(); err != nil {
		t.Fatal(err)
	}
	return p
}

func wantRules(t *testing.T, what string, got []string, want ...string) {
	t.Helper()
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("%s:\ngot:\n  %s\nwant:\n  %s", what, strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
}

// The default pod reproduces Istio's "basic" golden: nat only, the chains
// and rules in Istio's order.
func TestBuildDefaultsIsIstioBasic(t *testing.T) {
	p := mustBuild(t, DefaultSpec())
	if len(p.Tables) != 1 || p.Tables[0].Name != TableNat {
		t.Fatalf("tables = %v, want nat only", p.Tables)
	}
	var names []string
	for _, c := range p.Tables[0].Chains {
		names = append(names, c.Name)
	}
	wantRules(t, "nat chains", names, "PREROUTING", "OUTPUT", "ISTIO_INBOUND", "ISTIO_REDIRECT", "ISTIO_IN_REDIRECT", "ISTIO_OUTPUT")
	wantRules(t, "ISTIO_INBOUND", rulesOf(t, p, TableNat, ChainInbound, FamilyIPv4),
		"l4proto tcp dport 15008 -> return",
		"l4proto tcp dport @inbound-exclude-ports -> return",
		"l4proto tcp -> jump ISTIO_IN_REDIRECT")
	if got := p.Set("inbound-exclude-ports").Ports; len(got) != 3 || got[0] != 15020 || got[1] != 15021 || got[2] != 15090 {
		t.Errorf("inbound excludes = %v, want 15020 15021 15090", got)
	}
	wantRules(t, "ISTIO_OUTPUT", rulesOf(t, p, TableNat, ChainOutbound, FamilyIPv4),
		"l4proto tcp dport @outbound-exclude-ports -> return",
		"l4proto udp dport @outbound-exclude-ports -> return",
		`oifname "lo" saddr 127.0.0.6/32 -> return`,
		`oifname "lo" daddr != 127.0.0.1/32 l4proto tcp dport != 15008 skuid 1337 -> jump ISTIO_IN_REDIRECT`,
		`oifname "lo" skuid != 1337 -> return`,
		"skuid 1337 -> return",
		`oifname "lo" daddr != 127.0.0.1/32 l4proto tcp dport != 15008 skgid 1337 -> jump ISTIO_IN_REDIRECT`,
		`oifname "lo" skgid != 1337 -> return`,
		"skgid 1337 -> return",
		"daddr 127.0.0.1/32 -> return",
		"-> jump ISTIO_REDIRECT")
	for _, c := range p.Tables[0].Chains {
		for _, r := range c.Rules {
			if r.Family != FamilyIPv4 {
				t.Errorf("IPv6 off but rule %s in %s has family %s", r, c.Name, r.Family)
			}
		}
	}
	if len(p.LoopbackAddrs) != 0 || len(p.Routes) != 0 {
		t.Errorf("IPv4-only REDIRECT pod got addresses %v routes %v", p.LoopbackAddrs, p.Routes)
	}
}

func TestBuildIPv6(t *testing.T) {
	s := DefaultSpec()
	s.IPv6 = true
	p := mustBuild(t, s)
	wantRules(t, "v6 ISTIO_OUTPUT", rulesOf(t, p, TableNat, ChainOutbound, FamilyIPv6),
		"l4proto tcp dport @outbound-exclude-ports -> return",
		"l4proto udp dport @outbound-exclude-ports -> return",
		`oifname "lo" saddr ::6/128 -> return`,
		`oifname "lo" daddr != ::1/128 l4proto tcp dport != 15008 skuid 1337 -> jump ISTIO_IN_REDIRECT`,
		`oifname "lo" skuid != 1337 -> return`,
		"skuid 1337 -> return",
		`oifname "lo" daddr != ::1/128 l4proto tcp dport != 15008 skgid 1337 -> jump ISTIO_IN_REDIRECT`,
		`oifname "lo" skgid != 1337 -> return`,
		"skgid 1337 -> return",
		"daddr ::1/128 -> return",
		"-> jump ISTIO_REDIRECT")
	if len(p.LoopbackAddrs) != 1 || p.LoopbackAddrs[0] != netip.MustParsePrefix("::6/128") {
		t.Errorf("loopback addrs = %v, want ::6/128", p.LoopbackAddrs)
	}
}

// Istio's quirks, each a contract.
func TestBuildIstioQuirks(t *testing.T) {
	t.Run("dns: uid rule gets multiport 53,15008, gid rule keeps 15008 only", func(t *testing.T) {
		s := DefaultSpec()
		s.CaptureDNS = true
		out := rulesOf(t, mustBuild(t, s), TableNat, ChainOutbound, FamilyIPv4)
		joined := strings.Join(out, "\n")
		if !strings.Contains(joined, "dport != { 53, 15008 } skuid 1337 -> jump ISTIO_IN_REDIRECT") {
			t.Errorf("uid rule lacks the DNS multiport:\n%s", joined)
		}
		if !strings.Contains(joined, "dport != 15008 skgid 1337 -> jump ISTIO_IN_REDIRECT") {
			t.Errorf("gid rule should keep ! --dport 15008 only:\n%s", joined)
		}
		if !strings.Contains(joined, `oifname "lo" l4proto tcp dport != 53 skgid != 1337 -> return`) {
			t.Errorf("gid lo-return rule lacks the DNS variant:\n%s", joined)
		}
		if out[len(out)-3] != "-> jump ISTIO_OUTPUT_DNS" {
			t.Errorf("DNS jump should precede the loopback return: %v", out[len(out)-3:])
		}
	})
	t.Run("dns zones: proxy first, then app; resolver replies zone 1", func(t *testing.T) {
		s := DefaultSpec()
		s.CaptureDNS = true
		p := mustBuild(t, s)
		wantRules(t, "raw ISTIO_OUTPUT_DNS", rulesOf(t, p, TableRaw, ChainOutputDNS, FamilyIPv4),
			"l4proto udp dport 53 skuid 1337 -> ct zone set 1",
			"l4proto udp sport 15053 skuid 1337 -> ct zone set 2",
			"l4proto udp dport 53 skgid 1337 -> ct zone set 1",
			"l4proto udp sport 15053 skgid 1337 -> ct zone set 2",
			"l4proto udp dport 53 -> ct zone set 2")
		wantRules(t, "raw ISTIO_INBOUND", rulesOf(t, p, TableRaw, ChainInbound, FamilyIPv4),
			"l4proto udp sport 53 -> ct zone set 1")
	})
	t.Run("excludeOutboundPorts replaces 15020", func(t *testing.T) {
		s, err := ParseAnnotations(DefaultSpec(), map[string]string{AnnotationExcludeOutboundPorts: "5555,6666"})
		if err != nil {
			t.Fatal(err)
		}
		p := mustBuild(t, s)
		if got := p.Set("outbound-exclude-ports").Ports; len(got) != 2 || got[0] != 5555 {
			t.Errorf("outbound excludes = %v, want [5555 6666] without 15020", got)
		}
	})
	t.Run("inbound port list ignores excludes", func(t *testing.T) {
		s, err := ParseAnnotations(DefaultSpec(), map[string]string{
			AnnotationIncludeInboundPorts: "1111,2222", AnnotationExcludeInboundPorts: "3333"})
		if err != nil {
			t.Fatal(err)
		}
		p := mustBuild(t, s)
		wantRules(t, "ISTIO_INBOUND", rulesOf(t, p, TableNat, ChainInbound, FamilyIPv4),
			"l4proto tcp dport 15008 -> return",
			"l4proto tcp dport @inbound-ports -> jump ISTIO_IN_REDIRECT")
		if p.Set("inbound-exclude-ports") != nil {
			t.Error("exclude set built although the include list ignores it")
		}
	})
	t.Run("loopback include drops the app-to-app lo bypass", func(t *testing.T) {
		s, err := ParseAnnotations(DefaultSpec(), map[string]string{
			AnnotationIncludeOutboundIPRanges: "127.0.0.0/8", AnnotationExcludeOutboundIPRanges: "10.0.0.0/8"})
		if err != nil {
			t.Fatal(err)
		}
		out := rulesOf(t, mustBuild(t, s), TableNat, ChainOutbound, FamilyIPv4)
		for _, r := range out {
			if strings.Contains(r, "skuid != ") || strings.Contains(r, "skgid != ") {
				t.Errorf("lo bypass rule present with a loopback include: %s", r)
			}
		}
		wantRules(t, "tail", out[len(out)-3:],
			"daddr 127.0.0.1/32 -> return",
			"daddr @outbound-exclude-v4 -> return",
			"daddr @outbound-include-v4 -> jump ISTIO_REDIRECT")
	})
	t.Run("empty inbound: no PREROUTING jump, tunnel chain kept", func(t *testing.T) {
		s := DefaultSpec()
		s.InboundPorts = PortSelector{}
		p := mustBuild(t, s)
		if c := p.Table(TableNat).Chain(ChainPrerouting); c != nil {
			t.Errorf("nat PREROUTING present without inbound capture: %v", c.Rules)
		}
		wantRules(t, "ISTIO_INBOUND", rulesOf(t, p, TableNat, ChainInbound, FamilyIPv4), "l4proto tcp dport 15008 -> return")
	})
	t.Run("tproxy mangle chain order and no nat PREROUTING", func(t *testing.T) {
		s := DefaultSpec()
		s.InterceptionMode = ModeTProxy
		p := mustBuild(t, s)
		if c := p.Table(TableNat).Chain(ChainPrerouting); c != nil {
			t.Errorf("nat PREROUTING in TPROXY mode: %v", c.Rules)
		}
		wantRules(t, "mangle ISTIO_INBOUND", rulesOf(t, p, TableMangle, ChainInbound, FamilyIPv4),
			"l4proto tcp mark 1337 -> return",
			`l4proto tcp saddr 127.0.0.6/32 iifname "lo" -> return`,
			`l4proto tcp iifname "lo" mark != 1338 -> return`,
			"l4proto tcp dport @inbound-exclude-ports -> return",
			"l4proto tcp ct state established,related -> jump ISTIO_DIVERT",
			"l4proto tcp -> jump ISTIO_TPROXY")
		wantRules(t, "mangle ISTIO_TPROXY", rulesOf(t, p, TableMangle, ChainTProxy, FamilyIPv4),
			"daddr != 127.0.0.1/32 l4proto tcp -> tproxy to :15006 mark 1337/0xffffffff",
			// No transparent listener: drop, never on to the app (nft's
			// tproxy falls through where iptables' TPROXY drops).
			"daddr != 127.0.0.1/32 l4proto tcp -> drop")
		if len(p.Routes) != 1 || p.Routes[0] != (PolicyRoute{Family: FamilyIPv4, Mark: 1337, Table: 133}) {
			t.Errorf("routes = %v", p.Routes)
		}
		s.InboundPorts = PortSelector{}
		if p := mustBuild(t, s); len(p.Routes) != 0 {
			t.Errorf("TPROXY without inbound capture still routes: %v", p.Routes)
		}
	})
	t.Run("reroute interfaces are inserted above everything, in Istio's order", func(t *testing.T) {
		s, err := ParseAnnotations(DefaultSpec(), map[string]string{
			AnnotationRerouteVirtualInterfaces: "k1,k2", AnnotationExcludeInterfaces: "x1"})
		if err != nil {
			t.Fatal(err)
		}
		wantRules(t, "nat PREROUTING", rulesOf(t, mustBuild(t, s), TableNat, ChainPrerouting, FamilyIPv4),
			`iifname "k2" -> jump ISTIO_REDIRECT`,
			`iifname "k1" -> jump ISTIO_REDIRECT`,
			`iifname "k2" -> return`,
			`iifname "k1" -> return`,
			`iifname "x1" -> return`,
			"l4proto tcp -> jump ISTIO_INBOUND")
	})
	t.Run("owner groups", func(t *testing.T) {
		s := DefaultSpec()
		s.OwnerGroupsInclude = []uint32{10, 20}
		out := rulesOf(t, mustBuild(t, s), TableNat, ChainOutbound, FamilyIPv4)
		if !strings.Contains(strings.Join(out, "\n"), "skgid != 10 skgid != 20 -> return") {
			t.Errorf("include filter rule missing:\n%s", strings.Join(out, "\n"))
		}
	})
}

func TestMergePrefixes(t *testing.T) {
	var ps []netip.Prefix
	for _, s := range []string{"10.0.0.0/8", "10.1.0.0/16", "11.0.0.0/8", "192.0.2.0/25", "192.0.2.128/25", "0.0.0.0/32", "255.255.255.255/32"} {
		ps = append(ps, netip.MustParsePrefix(s))
	}
	var got []string
	for _, r := range MergePrefixes(ps) {
		got = append(got, r.String())
	}
	wantRules(t, "merged", got, "0.0.0.0", "10.0.0.0/7", "192.0.2.0/24", "255.255.255.255")
	odd := MergePrefixes([]netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("11.0.0.0/16")})
	if len(odd) != 1 || odd[0].String() != "10.0.0.0-11.0.255.255" {
		t.Errorf("adjacent non-prefix merge = %v", odd)
	}
	if r := MergePrefixes([]netip.Prefix{netip.MustParsePrefix("::/0")}); len(r) != 1 || r[0].String() != "::/0" {
		t.Errorf("::/0 -> %v", r)
	}
}

func TestDiff(t *testing.T) {
	s := DefaultSpec()
	a := mustBuild(t, s)
	b := mustBuild(t, s)
	if d := Diff(a, b); d != nil {
		t.Fatalf("equal plans differ: %v", d)
	}
	// Sets compare by content, not order.
	b.Set("inbound-exclude-ports").Ports = []uint16{15090, 15020, 15021}
	if d := Diff(a, b); d != nil {
		t.Fatalf("reordered set differs: %v", d)
	}
	b.Table(TableNat).Chain(ChainOutbound).Rules = b.Table(TableNat).Chain(ChainOutbound).Rules[1:]
	d := Diff(a, b)
	if len(d) != 1 || !strings.HasPrefix(d[0], "- rule nat-istio-output: ipv4 l4proto tcp dport @outbound-exclude-ports") {
		t.Fatalf("missing rule not reported: %v", d)
	}
}

func BenchmarkBuildDefault(b *testing.B) {
	s := DefaultSpec()
	s.IPv6 = true
	for b.Loop() {
		if _, err := Build(s); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkBuild10kCIDRs(b *testing.B) {
	s := DefaultSpec()
	for i := range 10000 {
		s.OutboundIPRangesExclude = append(s.OutboundIPRangesExclude,
			netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i >> 8), byte(i), 0}), 24))
	}
	for b.Loop() {
		if _, err := Build(s); err != nil {
			b.Fatal(err)
		}
	}
}
