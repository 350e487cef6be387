package redirect

import (
	"net/netip"
	"strings"
	"testing"
)

type fakeMatch struct{}

func (fakeMatch) isMatch() {}

type fakeVerdict struct{}

func (fakeVerdict) isVerdict() {}

func tracePlan(t *testing.T, mutate func(*Spec)) Plan {
	t.Helper()
	s := DefaultSpec()
	if mutate != nil {
		mutate(&s)
	}
	p, err := Build(s)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func out(uid uint32, dst, src, iface string, proto Proto) Packet {
	return Packet{Dir: DirOut, Proto: proto, UID: uid, GID: uid, Dst: netip.MustParseAddrPort(dst), Src: netip.MustParseAddr(src), Iface: iface}
}

func in(dst, iface string) Packet {
	return Packet{Dir: DirIn, Proto: ProtoTCP, Dst: netip.MustParseAddrPort(dst), Src: netip.MustParseAddr("10.0.0.9"), Iface: iface}
}

// TestTracePacketVerdicts pins the verdict and deciding rule of the packets
// users ask about most.
func TestTracePacketVerdicts(t *testing.T) {
	redirectMode := tracePlan(t, nil)
	tproxy := tracePlan(t, func(s *Spec) { s.InterceptionMode = ModeTProxy })
	dns := tracePlan(t, func(s *Spec) { s.CaptureDNS = true })
	excl := tracePlan(t, func(s *Spec) { s.OutboundIPRangesExclude = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")} })
	invalid := tracePlan(t, func(s *Spec) { s.DropInvalid = true })
	// As a backend lists a table someone switched off, or a chain whose
	// policy they set to drop.
	dormant := redirectMode.Clone()
	dormant.TableFlags = TableDormant
	dropping := redirectMode.Clone()
	dropping.Table(TableNat).Chain(ChainOutput).Policy = PolicyDrop
	cases := []struct {
		name    string
		plan    Plan
		pkt     Packet
		verdict string
		decides string // text of the deciding rule, "" if none
	}{
		{"app out", redirectMode, out(1000, "10.0.0.5:443", "10.1.0.2", "eth0", ProtoTCP), "redirect :15001", "redirect to :15001"},
		{"proxy out", redirectMode, out(1337, "10.0.0.5:443", "10.1.0.2", "eth0", ProtoTCP), "accept", "skuid 1337 -> return"},
		{"app udp out", redirectMode, out(1000, "10.0.0.5:53", "10.1.0.2", "eth0", ProtoUDP), "accept", ""},
		{"app to excluded", excl, out(1000, "10.0.0.5:443", "10.1.0.2", "eth0", ProtoTCP), "accept", "@outbound-exclude-v4 -> return"},
		{"app to 15020 (excluded port)", redirectMode, out(1000, "10.0.0.5:15020", "10.1.0.2", "eth0", ProtoTCP), "accept", "@outbound-exclude-ports -> return"},
		{"app dns", dns, out(1000, "10.96.0.10:53", "10.1.0.2", "eth0", ProtoUDP), "redirect :15053", "redirect to :15053"},
		{"proxy dns", dns, out(1337, "10.96.0.10:53", "10.1.0.2", "eth0", ProtoUDP), "accept", "skuid 1337 -> return"},
		{"inbound", redirectMode, in("10.1.0.2:8080", "eth0"), "redirect :15006", "redirect to :15006"},
		{"inbound 15021", redirectMode, in("10.1.0.2:15021", "eth0"), "accept", "@inbound-exclude-ports -> return"},
		{"inbound tproxy", tproxy, in("10.1.0.2:8080", "eth0"), "tproxy :15006 mark 1337", "tproxy to :15006"},
		{"proxy to own pod over lo", redirectMode, out(1337, "10.1.0.2:8080", "10.1.0.2", "lo", ProtoTCP), "redirect :15006", "redirect to :15006"},
		{"app to own pod over lo", redirectMode, out(1000, "10.1.0.2:8080", "10.1.0.2", "lo", ProtoTCP), "accept", "oifname \"lo\" skuid != 1337 -> return"},
		{"passthrough over lo", redirectMode, out(1337, "10.1.0.2:8080", "127.0.0.6", "lo", ProtoTCP), "accept", "saddr 127.0.0.6/32 -> return"},
		{"tproxy: proxy to own pod over lo", tproxy, out(1337, "10.1.0.2:8080", "10.1.0.2", "lo", ProtoTCP), "redirect :15006", "redirect to :15006"},
		{"drop-invalid leaves new connections", invalid, in("10.1.0.2:8080", "eth0"), "redirect :15006", "redirect to :15006"},
		{"dormant table", dormant, out(1000, "10.0.0.5:443", "10.1.0.2", "eth0", ProtoTCP), "accept", ""},
		{"policy drop", dropping, out(1000, "10.0.0.5:15020", "10.1.0.2", "eth0", ProtoTCP), "drop", "@outbound-exclude-ports -> return"},
		{"no rules", Plan{}, out(1000, "10.0.0.5:443", "10.1.0.2", "eth0", ProtoTCP), "accept", ""},
		{"IPv6 without IPv6 rules", redirectMode, Packet{Dir: DirOut, Proto: ProtoTCP, UID: 1000, Dst: netip.MustParseAddrPort("[2001:db8::5]:443"), Iface: "eth0"}, "accept", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tr, err := TracePacket(&c.plan, c.pkt)
			if err != nil {
				t.Fatal(err)
			}
			if got := tr.Verdict.String(); got != c.verdict {
				t.Fatalf("verdict %q, want %q\n%s", got, c.verdict, tr.Format())
			}
			var decided []string
			for _, s := range tr.Steps {
				if s.Decided {
					decided = append(decided, s.Text)
				}
			}
			switch {
			case c.decides == "" && len(decided) != 0:
				t.Errorf("deciding rules %q, want none\n%s", decided, tr.Format())
			case c.decides != "" && (len(decided) != 1 || !strings.Contains(decided[0], c.decides)):
				t.Errorf("deciding rules %q, want one containing %q\n%s", decided, c.decides, tr.Format())
			}
			f := tr.Format()
			if !strings.HasSuffix(f, "verdict: "+c.verdict+"\n") {
				t.Errorf("Format does not end with the verdict line:\n%s", f)
			}
		})
	}
}

// TestTracePacketErrors: what the tracer cannot interpret is an error that
// says what, never a silent pass.
func TestTracePacketErrors(t *testing.T) {
	base := func(h Hook, tab TableName, rules ...Rule) *Plan {
		typ := ChainTypeNat
		if tab != TableNat {
			typ = ChainTypeFilter
		}
		return &Plan{Tables: []Table{{Name: tab, Chains: []Chain{{Name: "BASE", Hook: h, Type: typ, Rules: rules}}}}}
	}
	o := out(1000, "10.0.0.5:443", "10.1.0.2", "eth0", ProtoTCP)
	o.Src = netip.Addr{}
	i := in("10.1.0.2:8080", "eth0")
	loop := &Plan{Tables: []Table{{Name: TableNat, Chains: []Chain{
		{Name: "BASE", Hook: HookOutput, Type: ChainTypeNat, Rules: []Rule{{Verdict: Jump{"A"}}}},
		{Name: "A", Rules: []Rule{{Verdict: Jump{"A"}}}},
	}}}}
	cases := []struct {
		name string
		plan *Plan
		pkt  Packet
		want string
	}{
		{"unknown match", base(HookOutput, TableNat, Rule{Matches: []Match{fakeMatch{}}, Verdict: Accept{}}), o, "fakeMatch is not supported"},
		{"unknown verdict", base(HookOutput, TableNat, Rule{Verdict: fakeVerdict{}}), o, "fakeVerdict is not supported"},
		{"owner at prerouting", base(HookPrerouting, TableNat, Rule{Matches: []Match{MatchOwner{ID: 1}}, Verdict: Accept{}}), i, "socket owner match at hook prerouting"},
		{"oif at prerouting", base(HookPrerouting, TableNat, Rule{Matches: []Match{MatchIface{Out: true, Name: "lo"}}, Verdict: Accept{}}), i, "output interface match"},
		{"iif at output", base(HookOutput, TableNat, Rule{Matches: []Match{MatchIface{Name: "lo"}}, Verdict: Accept{}}), o, "input interface match"},
		{"unknown source", base(HookOutput, TableNat, Rule{Matches: []Match{MatchAddr{Source: true, Prefix: netip.MustParsePrefix("127.0.0.6/32")}}, Verdict: Accept{}}), o, "source address"},
		{"missing set", base(HookOutput, TableNat, Rule{Matches: []Match{MatchSet{Set: "nope", Kind: SetPort}}, Verdict: Accept{}}), o, "set nope does not exist"},
		{"jump to nowhere", base(HookOutput, TableNat, Rule{Verdict: Jump{"NOPE"}}), o, "jump to nat-nope"},
		{"jump loop", loop, o, "nested jumps"},
		{"redirect in mangle", base(HookOutput, TableMangle, Rule{Verdict: Redirect{Port: 1}}), o, "redirect outside the nat table"},
		{"tproxy at output", base(HookOutput, TableMangle, Rule{Verdict: TProxy{Port: 1}}), o, "tproxy outside mangle prerouting"},
		{"family mismatch", base(HookOutput, TableNat, Rule{Matches: []Match{MatchAddr{Prefix: netip.MustParsePrefix("::1/128")}}, Verdict: Accept{}}), o, "address match ::1/128"},
		{"no direction", &Plan{}, Packet{Proto: ProtoTCP, Dst: netip.MustParseAddrPort("10.0.0.1:1"), Iface: "eth0"}, "direction"},
		{"bad proto", &Plan{}, Packet{Dir: DirOut, Proto: Proto(1), Dst: netip.MustParseAddrPort("10.0.0.1:1"), Iface: "eth0"}, "protocol"},
		{"port zero", &Plan{}, Packet{Dir: DirOut, Proto: ProtoTCP, Dst: netip.MustParseAddrPort("10.0.0.1:0"), Iface: "eth0"}, "port"},
		{"mixed families", &Plan{}, Packet{Dir: DirOut, Proto: ProtoTCP, Src: netip.MustParseAddr("::1"), Dst: netip.MustParseAddrPort("10.0.0.1:1"), Iface: "eth0"}, "different families"},
		{"no iface", &Plan{}, Packet{Dir: DirOut, Proto: ProtoTCP, Dst: netip.MustParseAddrPort("10.0.0.1:1")}, "interface"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := TracePacket(c.plan, c.pkt)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want one containing %q", err, c.want)
			}
		})
	}
}

// FuzzTracePacket: any packet through the plans of the main capture
// variants gives a trace ending in a known verdict, or an error (a bad
// packet, or a source-address rule without a source), never a panic.
func FuzzTracePacket(f *testing.F) {
	specs := []func(*Spec){
		nil,
		func(s *Spec) { s.InterceptionMode = ModeTProxy; s.IPv6 = true },
		func(s *Spec) { s.CaptureDNS = true; s.DropInvalid = true },
		func(s *Spec) {
			s.OutboundIPRanges = CIDRSelector{Prefixes: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}
			s.ExcludeInterfaces = []string{"net1"}
			s.RerouteVirtualInterfaces = []string{"tap+"}
		},
	}
	f.Add(uint8(0), true, true, []byte{10, 0, 0, 5}, uint16(443), []byte{10, 1, 0, 2}, uint32(1000), uint32(1000), "eth0")
	f.Add(uint8(1), false, true, []byte{32, 1, 13, 184, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}, uint16(8080), []byte{}, uint32(0), uint32(0), "tap0")
	f.Add(uint8(2), true, false, []byte{127, 0, 0, 6}, uint16(15002), []byte{127, 0, 0, 1}, uint32(1337), uint32(1337), "lo")
	f.Fuzz(func(t *testing.T, which uint8, outbound, tcp bool, dst []byte, port uint16, src []byte, uid, gid uint32, iface string) {
		plan := tracePlan(t, specs[int(which)%len(specs)])
		d, ok := netip.AddrFromSlice(dst)
		if !ok {
			return
		}
		pkt := Packet{Dir: DirIn, Proto: ProtoUDP, Dst: netip.AddrPortFrom(d, port), UID: uid, GID: gid, Iface: iface}
		if outbound {
			pkt.Dir = DirOut
		}
		if tcp {
			pkt.Proto = ProtoTCP
		}
		if s, ok := netip.AddrFromSlice(src); ok {
			pkt.Src = s
		}
		tr, err := TracePacket(&plan, pkt)
		if err != nil {
			if pkt.validate() == nil && !strings.Contains(err.Error(), ErrUnknownSource.Error()) {
				t.Fatalf("valid packet %s refused: %v", pkt, err)
			}
			return
		}
		switch tr.Verdict.Outcome {
		case OutcomeAccept, OutcomeDrop, OutcomeRedirect, OutcomeTProxy:
		default:
			t.Fatalf("unknown verdict %q", tr.Verdict.Outcome)
		}
		if !strings.HasSuffix(tr.Format(), "verdict: "+tr.Verdict.String()+"\n") {
			t.Fatalf("trace does not end with its verdict")
		}
	})
}
