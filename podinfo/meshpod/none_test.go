package meshpod

import (
	"testing"

	"github.com/nftmesh/nftmesh/redirect"
)

// TestDecideInterceptionNone: an injected pod whose interceptionMode is NONE
// is outside capture (no error, no spec), while other modes and spellings
// keep their meaning: REDIRECT/TPROXY capture, anything else fails closed.
func TestDecideInterceptionNone(t *testing.T) {
	injected := func(mode string) *Pod {
		return &Pod{
			Namespace: "shop", Name: "batch-1",
			Annotations: map[string]string{
				redirect.AnnotationSidecarStatus:           "{}",
				redirect.AnnotationInterceptionMode:        mode,
				redirect.AnnotationIncludeInboundPorts:     "*",
				redirect.AnnotationExcludeOutboundIPRanges: "bogus", // NONE skips before validation
			},
			Containers: []Container{{Name: ProxyContainer, Args: []string{"proxy", "sidecar"}}},
		}
	}
	cases := []struct {
		mode    string
		inMesh  bool
		reason  string
		wantErr bool
	}{
		{"NONE", false, ReasonInterceptionNone, false},
		{"\tNONE ", false, ReasonInterceptionNone, false},
		{"none", true, ReasonInvalid, true}, // the injector compares NONE exactly
		{"NONEX", true, ReasonInvalid, true},
		{"", true, ReasonInvalid, true},
	}
	for _, c := range cases {
		t.Run(c.mode, func(t *testing.T) {
			in, reason, spec, err := Decide(injected(c.mode))
			if in != c.inMesh || reason != c.reason || (err != nil) != c.wantErr {
				t.Fatalf("Decide = (%t, %q, %v), want (%t, %q, error %t)", in, reason, err, c.inMesh, c.reason, c.wantErr)
			}
			if !in && spec.InterceptionMode != "" {
				t.Errorf("skipped pod carries a spec: %+v", spec)
			}
		})
	}
	// Without the bad annotation, REDIRECT and TPROXY still capture.
	for _, mode := range []string{"REDIRECT", "TPROXY"} {
		p := injected(mode)
		delete(p.Annotations, redirect.AnnotationExcludeOutboundIPRanges)
		in, reason, spec, err := Decide(p)
		if err != nil || !in || reason != ReasonInMesh || string(spec.InterceptionMode) != mode {
			t.Errorf("%s: Decide = (%t, %q, %+v, %v)", mode, in, reason, spec.InterceptionMode, err)
		}
	}
}
