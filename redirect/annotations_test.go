package redirect

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
)

func TestParseAnnotationsBadInput(t *testing.T) {
	cases := []struct {
		name  string
		ann   map[string]string
		field string
		value string
	}{
		{"cidr without prefix", map[string]string{AnnotationExcludeOutboundIPRanges: "10.0.0.1"}, AnnotationExcludeOutboundIPRanges, "10.0.0.1"},
		{"cidr prefix too long", map[string]string{AnnotationExcludeOutboundIPRanges: "10.0.0.0/33"}, AnnotationExcludeOutboundIPRanges, "10.0.0.0/33"},
		{"v6 cidr garbage", map[string]string{AnnotationIncludeOutboundIPRanges: "2001:db8::/200"}, AnnotationIncludeOutboundIPRanges, "2001:db8::/200"},
		{"cidr with zone", map[string]string{AnnotationIncludeOutboundIPRanges: "fe80::1%eth0/64"}, AnnotationIncludeOutboundIPRanges, "fe80::1%eth0/64"},
		{"wildcard in exclude ranges", map[string]string{AnnotationExcludeOutboundIPRanges: "*"}, AnnotationExcludeOutboundIPRanges, "*"},
		{"wildcard mixed", map[string]string{AnnotationIncludeOutboundIPRanges: "*,10.0.0.0/8"}, AnnotationIncludeOutboundIPRanges, "*,10.0.0.0/8"},
		{"port zero", map[string]string{AnnotationIncludeInboundPorts: "0"}, AnnotationIncludeInboundPorts, "0"},
		{"port too big", map[string]string{AnnotationExcludeInboundPorts: "65536"}, AnnotationExcludeInboundPorts, "65536"},
		{"port negative", map[string]string{AnnotationExcludeOutboundPorts: "-1"}, AnnotationExcludeOutboundPorts, "-1"},
		{"port name", map[string]string{AnnotationIncludeOutboundPorts: "http"}, AnnotationIncludeOutboundPorts, "http"},
		{"port range syntax", map[string]string{AnnotationIncludeInboundPorts: "80-90"}, AnnotationIncludeInboundPorts, "80-90"},
		{"wildcard in exclude inbound", map[string]string{AnnotationExcludeInboundPorts: "*"}, AnnotationExcludeInboundPorts, "*"},
		{"wildcard in include outbound ports", map[string]string{AnnotationIncludeOutboundPorts: "*"}, AnnotationIncludeOutboundPorts, "*"},
		{"wildcard mixed ports", map[string]string{AnnotationIncludeInboundPorts: "*,80"}, AnnotationIncludeInboundPorts, "*,80"},
		{"unknown mode", map[string]string{AnnotationInterceptionMode: "BOGUS"}, AnnotationInterceptionMode, "BOGUS"},
		{"NONE is no capture, not a mode", map[string]string{AnnotationInterceptionMode: "NONE"}, AnnotationInterceptionMode, "NONE"},
		{"lower-case mode", map[string]string{AnnotationInterceptionMode: "redirect"}, AnnotationInterceptionMode, "redirect"},
		{"interface too long", map[string]string{AnnotationExcludeInterfaces: "averyveryverylongname0"}, AnnotationExcludeInterfaces, "averyveryverylongname0"},
		{"every interface excluded", map[string]string{AnnotationExcludeInterfaces: "eth0,+"}, AnnotationExcludeInterfaces, "+"},
		{"every interface rerouted", map[string]string{AnnotationRerouteVirtualInterfaces: "+"}, AnnotationRerouteVirtualInterfaces, "+"},
		{"interface with slash", map[string]string{AnnotationRerouteVirtualInterfaces: "a/b"}, AnnotationRerouteVirtualInterfaces, "a/b"},
		{"deprecated kubevirt name", map[string]string{AnnotationKubevirtInterfaces: "bad name"}, AnnotationKubevirtInterfaces, "bad name"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseAnnotations(DefaultSpec(), tc.ann)
			if err == nil {
				t.Fatalf("ParseAnnotations(%v) succeeded, want error", tc.ann)
			}
			var ve *ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("error %v is not a *ValidationError", err)
			}
			found := false
			for _, p := range ve.Problems {
				if p.Field == tc.field && p.Value == tc.value {
					found = true
				}
			}
			if !found {
				t.Errorf("error %q does not name field %s with value %q", err, tc.field, tc.value)
			}
			if !strings.Contains(err.Error(), tc.field) || !strings.Contains(err.Error(), tc.value) {
				t.Errorf("message %q lacks field or value", err)
			}
		})
	}
}

func TestParseAnnotationsReportsEveryProblem(t *testing.T) {
	_, err := ParseAnnotations(DefaultSpec(), map[string]string{
		AnnotationInterceptionMode:        "BOGUS",
		AnnotationExcludeOutboundIPRanges: "10.0.0.1,192.0.2.0/24,300.1.1.1/8",
		AnnotationIncludeInboundPorts:     "80,0,70000",
	})
	var ve *ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("want *ValidationError, got %v", err)
	}
	var got []string
	for _, p := range ve.Problems {
		got = append(got, p.Field+"="+p.Value)
	}
	want := []string{
		AnnotationIncludeInboundPorts + "=0",
		AnnotationIncludeInboundPorts + "=70000",
		AnnotationExcludeOutboundIPRanges + "=10.0.0.1",
		AnnotationExcludeOutboundIPRanges + "=300.1.1.1/8",
		AnnotationInterceptionMode + "=BOGUS",
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("problems = %v\nwant %v", got, want)
	}
	if !strings.HasPrefix(err.Error(), "5 problems: ") {
		t.Errorf("message %q should count the problems", err)
	}
}

func TestParseAnnotationsValues(t *testing.T) {
	s, err := ParseAnnotations(DefaultSpec(), map[string]string{
		AnnotationIncludeInboundPorts:      " 80, 443,80 ,",
		AnnotationExcludeInboundPorts:      "15020,9000",
		AnnotationIncludeOutboundIPRanges:  "10.1.2.3/8, 2001:db8::1/32",
		AnnotationExcludeOutboundIPRanges:  "",
		AnnotationExcludeOutboundPorts:     "3306",
		AnnotationKubevirtInterfaces:       "old0",
		AnnotationRerouteVirtualInterfaces: "new0,new1",
		AnnotationInterceptionMode:         "TPROXY",
	})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(s.InboundPorts.Ports, []uint16{80, 443}) || s.InboundPorts.All {
		t.Errorf("inbound ports = %+v, want [80 443] (deduplicated, trimmed)", s.InboundPorts)
	}
	if !slices.Equal(s.InboundPortsExclude, []uint16{15020, 9000}) {
		t.Errorf("inbound excludes = %v", s.InboundPortsExclude)
	}
	want := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8::/32")}
	if !slices.Equal(s.OutboundIPRanges.Prefixes, want) {
		t.Errorf("include ranges = %v, want masked %v", s.OutboundIPRanges.Prefixes, want)
	}
	if !slices.Equal(s.OutboundPortsExclude, []uint16{3306}) {
		t.Errorf("exclude outbound ports = %v: the annotation replaces the default 15020", s.OutboundPortsExclude)
	}
	if !slices.Equal(s.RerouteVirtualInterfaces, []string{"new0", "new1"}) {
		t.Errorf("reroute = %v: the new annotation wins over kubevirtInterfaces", s.RerouteVirtualInterfaces)
	}
	if s.InterceptionMode != ModeTProxy {
		t.Errorf("mode = %s", s.InterceptionMode)
	}

	s, err = ParseAnnotations(DefaultSpec(), map[string]string{AnnotationKubevirtInterfaces: "old0", AnnotationIncludeInboundPorts: ""})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(s.RerouteVirtualInterfaces, []string{"old0"}) {
		t.Errorf("deprecated kubevirtInterfaces not read: %v", s.RerouteVirtualInterfaces)
	}
	if !s.InboundPorts.None() {
		t.Errorf("empty includeInboundPorts must mean no inbound capture, got %+v", s.InboundPorts)
	}
}

func TestValidateTypedSpec(t *testing.T) {
	s := DefaultSpec()
	s.InterceptionMode = "X"
	s.OutboundPorts = []uint16{0}
	s.ProxyUIDs = nil
	s.HostIPv4LoopbackCIDR = netip.MustParsePrefix("10.0.0.0/8")
	s.ExcludeInterfaces = []string{""}
	err := s.Validate()
	var ve *ValidationError
	if !errors.As(err, &ve) || len(ve.Problems) != 5 {
		t.Fatalf("want 5 problems, got %v", err)
	}
	if _, err := Build(s); err == nil {
		t.Fatal("Build accepted an invalid spec")
	}
}

// TestHugeAnnotationBounded: a huge invalid annotation gives an error of a
// few KiB that still names the field and shows the start of the value, and
// says how much was cut or how many more problems there were.
func TestHugeAnnotationBounded(t *testing.T) {
	const mib = 1 << 20
	oneItem := strings.Repeat("9", mib)             // one bad port of 1 MiB
	manyItems := strings.Repeat("x,", mib/2)        // 524288 bad ports
	wildcard := "*," + strings.Repeat("80,", mib/3) // '*' mixed: the whole value is the problem
	for _, tc := range []struct {
		name, field, value string
		want               []string
	}{
		{"one huge item", AnnotationIncludeInboundPorts, oneItem,
			[]string{AnnotationIncludeInboundPorts, `"999`, "bytes cut)", "is not a port"}},
		{"many bad items", AnnotationExcludeOutboundPorts, manyItems,
			[]string{"524288 problems", AnnotationExcludeOutboundPorts, `"x" is not a port`, fmt.Sprintf("and %d more", mib/2-MaxProblems)}},
		{"huge value with a wildcard", AnnotationIncludeOutboundIPRanges, "*," + strings.Repeat("10.0.0.0/8,", mib/11),
			[]string{AnnotationIncludeOutboundIPRanges, `"*,10.0.0.0/8,`, "bytes cut)", "mixes '*'"}},
		{"huge wildcard port list", AnnotationIncludeInboundPorts, wildcard,
			[]string{AnnotationIncludeInboundPorts, "bytes cut)", "mixes '*'"}},
		{"huge mode", AnnotationInterceptionMode, strings.Repeat("R", mib),
			[]string{AnnotationInterceptionMode, fmt.Sprintf("(%d of %d bytes cut)", mib-quoteMax, mib)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseAnnotations(DefaultSpec(), map[string]string{tc.field: tc.value})
			if err == nil {
				t.Fatal("a huge invalid annotation was accepted")
			}
			msg := err.Error()
			if len(msg) > 8<<10 {
				t.Errorf("error is %d bytes for a %d-byte annotation: %.300s...", len(msg), len(tc.value), msg)
			}
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error %.600q does not contain %q", msg, w)
				}
			}
			var ve *ValidationError
			if !errors.As(err, &ve) || len(ve.Problems) > MaxProblems {
				t.Errorf("error keeps %d problems, want at most %d", len(ve.Problems), MaxProblems)
			}
		})
	}
}

// quoteMax is how many bytes of a value an error shows.
const quoteMax = 256

// FuzzParseAnnotations: any annotation values give either a ValidationError
// naming a known annotation, or a Spec that Build turns into a Plan that
// passes Verify. Never a panic.
func FuzzParseAnnotations(f *testing.F) {
	f.Add("REDIRECT", "*", "", "*", "", "", "15020", "", "", false, false)
	f.Add("TPROXY", "80,443", "9000", "10.0.0.0/8,2001:db8::/32", "192.0.2.0/24", "5432", "3306", "eth1", "tap0", true, true)
	f.Add("NONE", "0", "*", "10.0.0.1", "*", "x", "-1", "a/b", "", false, true)
	f.Add("REDIRECT", "", "", "127.0.0.0/8", "::/0,0.0.0.0/0", "65535", "", "+", "eth+", true, false)
	f.Fuzz(func(t *testing.T, mode, inInc, inExc, outInc, outExc, outPorts, outExcPorts, exIf, rerouteIf string, dns, v6 bool) {
		ann := map[string]string{
			AnnotationInterceptionMode:         mode,
			AnnotationIncludeInboundPorts:      inInc,
			AnnotationExcludeInboundPorts:      inExc,
			AnnotationIncludeOutboundIPRanges:  outInc,
			AnnotationExcludeOutboundIPRanges:  outExc,
			AnnotationIncludeOutboundPorts:     outPorts,
			AnnotationExcludeOutboundPorts:     outExcPorts,
			AnnotationExcludeInterfaces:        exIf,
			AnnotationRerouteVirtualInterfaces: rerouteIf,
		}
		base := DefaultSpec()
		base.CaptureDNS, base.IPv6 = dns, v6
		s, err := ParseAnnotations(base, ann)
		if err != nil {
			var ve *ValidationError
			if !errors.As(err, &ve) || len(ve.Problems) == 0 {
				t.Fatalf("error %v is not a non-empty *ValidationError", err)
			}
			for _, p := range ve.Problems {
				if _, known := ann[p.Field]; !known {
					t.Fatalf("problem names unknown field %q: %v", p.Field, p)
				}
			}
			// Each problem shows at most quoteMax bytes of its value, which
			// %q may spell as up to 10 characters per rune.
			if max := MaxProblems*(200+10*quoteMax) + 100; len(err.Error()) > max {
				t.Fatalf("error of %d bytes (bound %d)", len(err.Error()), max)
			}
			return
		}
		p, err := Build(s)
		if err != nil {
			t.Fatalf("Build failed on a parsed spec: %v", err)
		}
		if err := p.Verify(); err != nil {
			t.Fatalf("plan fails Verify: %v\n%s", err, strings.Join(Describe(p), "\n"))
		}
	})
}

// TestInterfaceListLimit: an interface list takes MaxInterfaces names; one
// more is an error naming the annotation used (the deprecated kubevirt one
// too), the count and the limit, bounded however long the value; a Spec
// built in code is held to the same limit.
func TestInterfaceListLimit(t *testing.T) {
	names := func(n int) string {
		s := make([]string, n)
		for i := range s {
			s[i] = fmt.Sprintf("e%x", i)
		}
		return strings.Join(s, ",")
	}
	if _, err := ParseAnnotations(DefaultSpec(), map[string]string{
		AnnotationExcludeInterfaces:        names(MaxInterfaces),
		AnnotationRerouteVirtualInterfaces: names(MaxInterfaces),
	}); err != nil {
		t.Fatalf("%d names each: %v", MaxInterfaces, err)
	}
	for _, tc := range []struct {
		field string
		n     int
	}{
		{AnnotationExcludeInterfaces, MaxInterfaces + 1},
		{AnnotationRerouteVirtualInterfaces, MaxInterfaces + 1},
		{AnnotationKubevirtInterfaces, MaxInterfaces + 1},
		// As many as 255 KiB of annotations hold.
		{AnnotationExcludeInterfaces, 44248},
	} {
		t.Run(fmt.Sprintf("%s %d", tc.field, tc.n), func(t *testing.T) {
			v := names(tc.n) + ",e0" // a repeat counts once
			_, err := ParseAnnotations(DefaultSpec(), map[string]string{tc.field: v})
			var ve *ValidationError
			if !errors.As(err, &ve) || len(ve.Problems) != 1 || ve.Problems[0].Field != tc.field || ve.Problems[0].Value != v {
				t.Fatalf("ParseAnnotations = %v, want one problem with %s and its value", err, tc.field)
			}
			msg := err.Error()
			for _, w := range []string{"annotation " + tc.field, fmt.Sprintf("names %d interfaces, more than the %d", tc.n, MaxInterfaces)} {
				if !strings.Contains(msg, w) {
					t.Errorf("error %.300q lacks %q", msg, w)
				}
			}
			if len(msg) > 1<<10 {
				t.Errorf("error is %d bytes for a %d-byte annotation", len(msg), len(v))
			}
		})
	}
	s := DefaultSpec()
	s.RerouteVirtualInterfaces = strings.Split(names(MaxInterfaces+1), ",")
	if err := s.Validate(); err == nil || !strings.Contains(err.Error(), AnnotationRerouteVirtualInterfaces) || !strings.Contains(err.Error(), "more than the 1024") {
		t.Errorf("Validate of %d rerouted interfaces = %v", MaxInterfaces+1, err)
	}
}
