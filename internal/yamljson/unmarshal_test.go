package yamljson

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	sigsyaml "sigs.k8s.io/yaml"
)

// sample is shaped like the manifests read with Unmarshal: strings, maps
// of strings, slices, pointers, numbers, a self-decoding field and an
// untyped one.
type sample struct {
	Kind     string `json:"kind"`
	Metadata struct {
		Name        string            `json:"name"`
		Annotations map[string]string `json:"annotations"`
	} `json:"metadata"`
	Spec struct {
		Containers []struct {
			Name string   `json:"name"`
			Args []string `json:"args"`
			SC   *struct {
				RunAsUser *int64 `json:"runAsUser"`
			} `json:"securityContext"`
		} `json:"containers"`
	} `json:"spec"`
	Count   int             `json:"count"`
	Ratio   float64         `json:"ratio"`
	Flag    bool            `json:"flag"`
	Raw     json.RawMessage `json:"raw"`
	Any     any             `json:"any"`
	Skipped string          `json:"-"`
	Untag   string
	Nested  map[string][]string `json:"nested"`
}

// sameUnmarshal fails t unless Unmarshal into a fresh sample value gives what
// sigs.k8s.io/yaml's Unmarshal gives, or refuses (yamljson.Error) input
// it does not read, or both fail.
func sameUnmarshal(t testing.TB, y []byte) bool {
	t.Helper()
	var got, want sample
	err := Unmarshal(y, &got)
	wantErr := sigsyaml.Unmarshal(y, &want)
	var refused *Error
	switch {
	case err == nil && wantErr != nil:
		t.Fatalf("Unmarshal(%q) = %+v; sigs.k8s.io/yaml: %v", y, got, wantErr)
	case err == nil && !reflect.DeepEqual(got, want):
		t.Fatalf("Unmarshal(%q) =\n %+v\nsigs.k8s.io/yaml:\n %+v", y, got, want)
	case err != nil && wantErr == nil && !errors.As(err, &refused):
		t.Fatalf("Unmarshal(%q): %v; sigs.k8s.io/yaml: %+v", y, err, want)
	}
	return err == nil
}

func TestUnmarshal(t *testing.T) {
	for _, y := range []string{
		"kind: 5\nmetadata:\n  name: true\n  annotations:\n    sidecar.istio.io/inject: true\n    a: 1.5\n    b: 0x10\n    c: .inf\n    d: .nan\n    e: ~\n    f: 18446744073709551615\n    g: 0.1\n    h: 1e40\n",
		"KIND: Pod\nMetaData: {NAME: x}\nmetadata: {name: y}\n",
		"spec:\n  containers:\n  - name: 1\n    args: [1, yes, 2.5, x]\n    securityContext: {runAsUser: 1337}\n  - securityContext: {runAsUser: true}\n",
		"count: 7\nratio: 1\nflag: on\nraw: {a: 1}\nany: 5\nSkipped: 3\nuntag: 4\nnested: {a: [1, true]}\n",
		"count: '7'\n",
		"count: 1.5\n",
		"ratio: .inf\n",
		"any: .nan\n",
		"raw: 5\nRAW: [x]\n",
		"kind: [x]\n",
		"metadata: {annotations: {a: {b: c}}}\n",
		"- 1\n",
		"5\n",
		"",
		"kind: x\nkinſ: 3\n",
	} {
		sameUnmarshal(t, []byte(y))
	}
	var p sample
	if err := Unmarshal([]byte("metadata: {annotations: {inject: true, num: 1e3}}\n"), &p); err != nil ||
		p.Metadata.Annotations["inject"] != "true" || p.Metadata.Annotations["num"] != "1000" {
		t.Errorf("numbers and booleans bound for strings: %+v, %v", p.Metadata.Annotations, err)
	}
	if err := Unmarshal([]byte("a: [\n"), &p); err == nil || !strings.Contains(err.Error(), "line 1") {
		t.Errorf("bad YAML: %v, want an error naming line 1", err)
	}
	var embedded struct {
		sample
		X string
	}
	if err := Unmarshal([]byte("x: 1\n"), &embedded); err == nil || !strings.Contains(err.Error(), "embedded") {
		t.Errorf("embedded struct: %v, want a refusal", err)
	}
}

// FuzzUnmarshal: for any input, Unmarshal gives what sigs.k8s.io/yaml's
// Unmarshal gives, or refuses.
func FuzzUnmarshal(f *testing.F) {
	for _, s := range []string{
		"kind: Pod\nmetadata:\n  name: web\n  annotations: {a: true, b: 1}\nspec:\n  containers:\n  - name: x\n    args: [1, a]\n    securityContext: {runAsUser: 5}\n",
		"count: 1\nratio: 2.5\nflag: yes\nraw: [1]\nany: {a: b}\nnested: {x: [y, 1]}\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, y []byte) {
		sameUnmarshal(t, y)
	})
}
