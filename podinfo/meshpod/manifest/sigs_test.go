package manifest

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	sigsyaml "sigs.k8s.io/yaml"

	"github.com/nftmesh/nftmesh/internal/yamljson"
	"github.com/nftmesh/nftmesh/podinfo/meshpod"
)

// parseWithSigs is ParseManifestNamed as it was with sigs.k8s.io/yaml
// (the one-parse path gives what this gives: TestParseManifestOnceAsTwice).
func parseWithSigs(data []byte, name string) (*meshpod.Pod, error) {
	doc, err := selectPod(data, name, func(b []byte, v any) error { return sigsyaml.Unmarshal(b, v) })
	if err != nil {
		return nil, err
	}
	return meshpod.DecodeManifest(doc, func(b []byte, v any) error { return sigsyaml.Unmarshal(b, v) })
}

// sameAsSigs fails t unless ParseManifestNamed gives the Pod the
// sigs.k8s.io/yaml version gave, or refuses YAML it does not read
// (yamljson.Error), or both fail; failures that are not about decoding
// (no Pod, several Pods) read the same. It reports whether a Pod came out.
func sameAsSigs(t testing.TB, data []byte, name string) bool {
	t.Helper()
	pod, err := ParseManifestNamed(data, name)
	want, wantErr := parseWithSigs(data, name)
	var refused *yamljson.Error
	switch {
	case err == nil && wantErr != nil:
		t.Fatalf("ParseManifestNamed(%q, %q) = %+v; with sigs.k8s.io/yaml: %v", data, name, pod, wantErr)
	case err == nil && !reflect.DeepEqual(pod, want):
		t.Fatalf("ParseManifestNamed(%q, %q) =\n %+v\nwith sigs.k8s.io/yaml:\n %+v", data, name, pod, want)
	case err != nil && wantErr == nil && !errors.As(err, &refused):
		t.Fatalf("ParseManifestNamed(%q, %q): %v; with sigs.k8s.io/yaml: %+v", data, name, err, want)
	case err != nil && wantErr != nil && !errors.As(err, &refused) && !strings.Contains(wantErr.Error(), "decoding") && err.Error() != wantErr.Error():
		t.Fatalf("ParseManifestNamed(%q, %q): %v; with sigs.k8s.io/yaml: %v", data, name, err, wantErr)
	}
	return err == nil
}

// TestParseManifestSameAsSigs: the manifest reader without a YAML library
// reads every sample pod, and the documents built to tell readers apart,
// as it read them with sigs.k8s.io/yaml, including numbers and booleans
// bound for string fields (an unquoted `sidecar.istio.io/inject: true`).
func TestParseManifestSameAsSigs(t *testing.T) {
	eachSamplePod(t, func(f string, data []byte) {
		if !sameAsSigs(t, data, "") {
			if _, err := parseWithSigs(data, ""); err == nil {
				t.Errorf("%s: refused, where sigs.k8s.io/yaml reads it", f)
			}
		}
	})
	for _, doc := range []string{
		"kind: Pod\nmetadata:\n  annotations:\n    sidecar.istio.io/inject: true\n    a: 1\n    b: 0x1F\n    c: 1.5\n    d: .inf\n    e: yes\n    f: 1e3\n    g: 12345678901\n    h: 18446744073709551615\n    i: ~\n  labels: {v: 1.0, w: no}\n",
		"kind: Pod\nmetadata: {Name: 5, name: web, NAMESPACE: 7, uid: 12}\n",
		"kind: Pod\nspec:\n  containers:\n  - name: 7\n    args: [1, true, 0.1]\n    env:\n    - {name: X, value: 5}\n    - {Name: Y, VALUE: off}\n    securityContext: {runAsUser: 1337, runAsGroup: 0o7}\n",
		"kind: Pod\nstatus: {podIP: 10, podIPs: [{ip: 1}, {IP: 2.5}]}\n",
		"kind: Pod\nspec: {containers: [{name: x, securityContext: {runAsUser: true}}]}\n",
		"kind: Pod\nspec: {containers: [{name: x, securityContext: {runAsUser: 1.5}}]}\n",
		"kind: Pod\nmetadata: {annotations: {a: [1]}}\n",
		"kind: Pod\nmetadata: {annotations: {a: .nan}, labels: {b: -.inf}}\n",
		"kind: Pod\nmetadata: {name: .nan}\n",
		"kind: Pod\nmetadata: {name: x, nam\u017fe: y}\n",
		"Kind: Pod\napiVersion: 1\n",
		"kind: Pod\nx: .inf\n",
		"apiVersion: v1\nkind: List\nitems:\n- kind: Pod\n  metadata: {name: a, annotations: {inject: true}}\n- kind: Pod\n  metadata: {name: b}\n",
		"kind: PodList\napiVersion: v1\nitems: [{metadata: {name: a, labels: {n: 1}}}]\n",
	} {
		sameAsSigs(t, []byte(doc), "")
		sameAsSigs(t, []byte(doc), "a")
	}
	// The unquoted boolean annotation reads as text.
	p, err := ParseManifest([]byte("kind: Pod\nmetadata:\n  annotations:\n    sidecar.istio.io/inject: true\n"))
	if err != nil || p.Annotations["sidecar.istio.io/inject"] != "true" {
		t.Errorf("unquoted inject annotation: %+v, %v", p, err)
	}
}

// FuzzParseManifestSameAsSigs: for any stream and name, the manifest
// reader gives what it gave with sigs.k8s.io/yaml, or refuses YAML it does
// not read.
func FuzzParseManifestSameAsSigs(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join("..", "..", "..", "testdata", "pods", "*"))
	for _, name := range files {
		if data, err := os.ReadFile(name); err == nil {
			f.Add(data, "")
		}
	}
	f.Add([]byte("kind: Pod\nmetadata:\n  name: a\n  annotations: {x: true, y: 1.5}\nspec: {containers: [{name: 1, args: [2]}]}\n"), "a")
	f.Add([]byte("kind: List\nitems: [{kind: Pod, metadata: {name: a}}]\n---\nkind: Pod\nmetadata: {name: b, namespace: 1}\n"), "1/b")
	f.Fuzz(func(t *testing.T, data []byte, name string) {
		sameAsSigs(t, data, name)
	})
}
