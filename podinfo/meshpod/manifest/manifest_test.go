package manifest

import (
	"strings"
	"testing"

	"github.com/nftmesh/nftmesh/podinfo/meshpod"
	"github.com/nftmesh/nftmesh/redirect"
)

func TestParseManifestBadInput(t *testing.T) {
	cases := []struct{ name, doc, want string }{
		{"not yaml", "::: [", "decoding manifest"},
		{"no kind", "apiVersion: v1\nmetadata: {name: x}\n", "no kind"},
		{"wrong kind", "apiVersion: apps/v1\nkind: Deployment\n", `"Deployment"`},
		{"wrong version", "apiVersion: v2\nkind: Pod\n", `"v2"`},
		{"uid not a number", "apiVersion: v1\nkind: Pod\nspec:\n  containers:\n  - name: istio-proxy\n    securityContext: {runAsUser: abc}\n", "decoding Pod"},
		{"annotations not a map", "apiVersion: v1\nkind: Pod\nmetadata:\n  annotations: [a, b]\n", "decoding Pod"},
		{"annotation value not a string", "apiVersion: v1\nkind: Pod\nmetadata:\n  annotations: {a: {b: c}}\n", "decoding Pod"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseManifest([]byte(tc.doc))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("ParseManifest = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// FuzzParseManifest: any bytes give a Pod or an error, never a panic, and a
// Pod that Decide puts in the mesh without error builds a Plan.
func FuzzParseManifest(f *testing.F) {
	f.Add([]byte("apiVersion: v1\nkind: Pod\nmetadata:\n  annotations: {sidecar.istio.io/status: x}\nspec:\n  containers:\n  - name: istio-proxy\n    args: [proxy, sidecar]\n"))
	f.Add([]byte(`{"kind":"Pod","metadata":{"annotations":{"sidecar.istio.io/status":"{}","traffic.sidecar.istio.io/excludeOutboundIPRanges":"10.0.0.1"}},"spec":{"containers":[{"name":"istio-proxy","securityContext":{"runAsUser":-1}}]}}`))
	f.Add([]byte("kind: Pod\nstatus: {podIPs: [{ip: '2001:db8::1'}]}\n"))
	f.Add([]byte("kind: Pod\nmetadata: {name: a}\n---\nkind: Pod\nmetadata: {name: b}\n"))
	f.Add([]byte(`{"kind":"List","items":[{"kind":"Pod","metadata":{"name":"a","annotations":{"sidecar.istio.io/status":"{}"}}}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := ParseManifest(data)
		if err != nil {
			return
		}
		in, reason, spec, err := meshpod.Decide(p)
		if err != nil {
			if !in || reason != meshpod.ReasonInvalid {
				t.Fatalf("error %v with inMesh=%t reason=%q: errors must fail closed", err, in, reason)
			}
			return
		}
		if in {
			if _, err := redirect.Build(spec); err != nil {
				t.Fatalf("in-mesh spec does not build: %v", err)
			}
		}
	})
}
