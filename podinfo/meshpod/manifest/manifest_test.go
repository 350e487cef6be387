package manifest

import (
	"os"
	"path/filepath"
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

// TestParseManifestSamples: every sample pod reads (its Pod, or the only
// document that is one), and YAML scalars bound for strings read as their
// text, as kubectl reads them: an unquoted `sidecar.istio.io/inject: true`
// is the annotation "true".
func TestParseManifestSamples(t *testing.T) {
	eachSamplePod(t, func(name string, data []byte) {
		if _, err := ParseManifest(data); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	})
	p, err := ParseManifest([]byte("kind: Pod\nmetadata:\n  annotations:\n    sidecar.istio.io/inject: true\n    a: 1\n    b: 1.5\n  labels: {v: yes}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if p.Annotations["sidecar.istio.io/inject"] != "true" || p.Annotations["a"] != "1" || p.Annotations["b"] != "1.5" || p.Labels["v"] != "true" {
		t.Errorf("scalars bound for strings: annotations %v, labels %v", p.Annotations, p.Labels)
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

// eachSamplePod calls f with the name and content of every sample pod
// manifest in testdata/pods.
func eachSamplePod(t *testing.T, f func(name string, data []byte)) {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("..", "..", "..", "testdata", "pods", "*"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no sample pods: %v", err)
	}
	for _, name := range files {
		data, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		f(name, data)
	}
}
