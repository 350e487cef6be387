package manifest

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/nftmesh/nftmesh/podinfo/meshpod"
)

// parseTwice is ParseManifestNamed without its one-parse path: SelectPod
// reads every document's head, then the chosen one is decoded.
func parseTwice(data []byte, name string) (*meshpod.Pod, error) {
	data, err := SelectPod(data, name)
	if err != nil {
		return nil, err
	}
	return meshpod.DecodeManifest(data, unmarshalYAML)
}

// sameAsTwice fails t unless ParseManifestNamed gives what parseTwice
// gives: the same Pod, or the same error.
func sameAsTwice(t *testing.T, data []byte, name string) {
	t.Helper()
	pod, err := ParseManifestNamed(data, name)
	want, wantErr := parseTwice(data, name)
	if (err == nil) != (wantErr == nil) || (err != nil && err.Error() != wantErr.Error()) || !reflect.DeepEqual(pod, want) {
		t.Errorf("ParseManifestNamed(%q, %q) = %+v, %v; parsed twice: %+v, %v", data, name, pod, err, want, wantErr)
	}
}

// TestParseManifestOnceAsTwice: a lone Pod document is parsed once, and
// what comes out is what the two parses gave, for every sample pod and for
// documents built to tell the two apart: an items key (a List's, which
// only SelectPod reads), spelled in any case, through an escape, or with a
// letter JSON folds to an ASCII one; other kinds, bad YAML, several
// documents, Lists.
func TestParseManifestOnceAsTwice(t *testing.T) {
	eachSamplePod(t, func(_ string, data []byte) { sameAsTwice(t, data, "") })
	injected, err := os.ReadFile(filepath.Join("..", "..", "..", "testdata", "pods", "injected.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := parseLonePod(injected); !ok {
		t.Errorf("the injected sample pod does not take the one-parse path")
	}
	pod := "apiVersion: v1\nkind: Pod\nmetadata: {name: web, namespace: shop}\n"
	for _, doc := range []string{
		pod,
		pod + "items: 5\n",
		pod + "Items: 5\n",
		pod + "ITEMS: [1]\n",
		pod + "\"\\u0069tems\": 5\n",
		pod + "\"\\x69tems\": 5\n",
		pod + "item\u017f: 5\n", // ſ folds to s
		pod + "items: [{kind: Pod}]\n",
		`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"web"},"items":5}`,
		`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"web"},"\u0069tems":5}`,
		"kind: List\nitems: [{apiVersion: v1, kind: Pod, metadata: {name: a}}]\n",
		"kind: PodList\napiVersion: v1\nitems: [{metadata: {name: a}}]\n",
		"kind: List\n",
		pod + "---\n" + pod,
		"kind: Pod\nmetadata: 5\n",
		"kind: Pod\nmetadata: {name: [x]}\n",
		"kind: Pod\nmetadata: {name: 5, annotations: {a: true}}\n",
		"apiVersion: v2\nkind: Pod\n",
		"kind: Deployment\n",
		"::: [",
		"",
		"# nothing\n",
		"anchor: &k items\nkind: Pod\n*k : 5\n",
		"Kind: 5\nkind: Pod\n",
		"kind: Pod\nKIND: true\n",
		"kind: Pod\napiVersion: 1\n",
		"kind: Pod\nmetadata: {name: yes, namespace: 1e3}\n",
		"kind: Pod\nmetadata: {Name: 5, name: web}\n",
		"kind: Pod\nmetadata: {name: '5'}\n",
		"kind: Pod\nmetadata: {annotations: {a: 1, b: true, c: 0x1F, d: .inf}, labels: {x: null}}\n",
		"kind: Pod\nspec: {containers: [{name: istio-proxy, securityContext: {runAsUser: 1e3}, args: [1, true]}]}\n",
		"kind: Pod\nspec: {containers: [{name: 7, env: [{name: X, value: 5}]}]}\n",
		"kind: Pod\nstatus: {podIP: 10.0.0.1, podIPs: [{ip: 1}]}\n",
		"kind: Pod\n1: 2\ntrue: false\n",
		"kind: Pod\n? [a]\n: b\n",
	} {
		sameAsTwice(t, []byte(doc), "")
		sameAsTwice(t, []byte(doc), "web")
	}
}

// FuzzParseManifestOnceAsTwice: for any bytes, the one-parse path gives
// what the two parses give.
func FuzzParseManifestOnceAsTwice(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join("..", "..", "..", "testdata", "pods", "*"))
	for _, name := range files {
		if data, err := os.ReadFile(name); err == nil {
			f.Add(data)
		}
	}
	f.Add([]byte("apiVersion: v1\nkind: Pod\nmetadata: {name: web}\nitems: 5\n"))
	f.Add([]byte(`{"kind":"Pod","\u0069tems":[]}`))
	f.Add([]byte("kind: List\nitems: [{kind: Pod}]\n"))
	f.Add([]byte("kind: Pod\nmetadata:\n  annotations: {sidecar.istio.io/status: x}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		sameAsTwice(t, data, "")
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
