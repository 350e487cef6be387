package redirect

import (
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestSuggestAnnotation(t *testing.T) {
	for _, tc := range []struct{ key, want string }{
		{"traffic.sidecar.istio.io/excludeOutboundIPRange", AnnotationExcludeOutboundIPRanges},
		{"traffic.sidecar.istio.io/excludeoutboundipranges", AnnotationExcludeOutboundIPRanges},
		{"traffic.sidecar.istio.io/includeInboundPort", AnnotationIncludeInboundPorts},
		{"sidecar.istio.io/interceptionMod", AnnotationInterceptionMode},
		{"sidecar.istio.io/interseptionMode", AnnotationInterceptionMode},
		{"sidecar.istio.io/injekt", AnnotationInject},
		{"traffic.sidecar.istio.io/excludeOutboundPort", AnnotationExcludeOutboundPorts},
		{AnnotationExcludeOutboundPorts, ""},
		{"sidecar.istio.io/proxyCPU", ""},
		{"proxy.istio.io/config", ""},
		{"", ""},
		{"/", ""},
		{strings.Repeat("x", 1<<20), ""},
		{"\xff\xfe", ""},
	} {
		if got := SuggestAnnotation(tc.key); got != tc.want {
			t.Errorf("SuggestAnnotation(%.60q) = %q, want %q", tc.key, got, tc.want)
		}
	}
}

func TestUnknownAnnotationWarnings(t *testing.T) {
	got := UnknownAnnotationWarnings(map[string]string{
		"traffic.sidecar.istio.io/excludeOutboundIPRange": "10.0.0.0/8", // typo
		"traffic.sidecar.istio.io/somethingElse":          "1",          // unknown, no near key
		"sidecar.istio.io/interceptionMod":                "TPROXY",     // typo of another prefix
		"sidecar.istio.io/proxyCPU":                       "100m",       // another Istio feature
		"prometheus.istio.io/merge-metrics":               "false",
		AnnotationIncludeInboundPorts:                     "80",
		AnnotationSidecarStatus:                           "{}",
		"example.com/traffic":                             "x",
		"notistio.io/x":                                   "x",
		"istio.io/rev":                                    "canary",
	})
	want := []string{
		`annotation "sidecar.istio.io/interceptionMod" is not read (ignored, as Istio does): did you mean "sidecar.istio.io/interceptionMode"?`,
		`annotation "traffic.sidecar.istio.io/excludeOutboundIPRange" is not read (ignored, as Istio does): did you mean "traffic.sidecar.istio.io/excludeOutboundIPRanges"?`,
		`annotation "traffic.sidecar.istio.io/somethingElse" is not read (ignored, as Istio does); the traffic.sidecar.istio.io ones are: includeInboundPorts, excludeInboundPorts, includeOutboundIPRanges, excludeOutboundIPRanges, includeOutboundPorts, excludeOutboundPorts, excludeInterfaces, kubevirtInterfaces`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	huge := "traffic.sidecar.istio.io/" + strings.Repeat("y", 1<<20)
	w := UnknownAnnotationWarnings(map[string]string{huge: ""})
	if len(w) != 1 || len(w[0]) > 1024 || !strings.Contains(w[0], "bytes cut") {
		t.Errorf("huge key: %d warnings, first %.300q", len(w), w)
	}
}

func TestBoundedDistance(t *testing.T) {
	for _, tc := range []struct {
		a, b  string
		limit int
		want  int
	}{
		{"", "", 4, 0},
		{"abc", "abc", 4, 0},
		{"abc", "abd", 4, 1},
		{"abc", "", 4, 3},
		{"kitten", "sitting", 4, 3},
		{"kitten", "sitting", 3, 3},
		{"abcdefgh", "", 4, 4},
		{"abcdefgh", "hgfedcba", 4, 4},
	} {
		if got := boundedDistance(tc.a, tc.b, tc.limit); got != tc.want {
			t.Errorf("boundedDistance(%q, %q, %d) = %d, want %d", tc.a, tc.b, tc.limit, got, tc.want)
		}
	}
}

// FuzzSuggestAnnotation: any key gives a known key or "", never the key
// itself, only a key within the distance, and never panics.
func FuzzSuggestAnnotation(f *testing.F) {
	f.Add("traffic.sidecar.istio.io/excludeOutboundIPRange")
	f.Add("sidecar.istio.io/interceptionMode")
	f.Add("\xff")
	f.Fuzz(func(t *testing.T, key string) {
		s := SuggestAnnotation(key)
		if s == "" {
			return
		}
		if !slices.Contains(readAnnotations, s) || s == key {
			t.Fatalf("SuggestAnnotation(%q) = %q", key, s)
		}
		if d := boundedDistance(strings.ToLower(key), strings.ToLower(s), 100); d > maxSuggestDistance {
			t.Fatalf("SuggestAnnotation(%q) = %q at distance %d", key, s, d)
		}
		for _, w := range UnknownAnnotationWarnings(map[string]string{key: ""}) {
			if !utf8.ValidString(w) {
				t.Fatalf("warning is not UTF-8: %q", w)
			}
		}
	})
}
