package manifest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// goLeaks are pieces of Go's own error texts that name Go types: a
// manifest's errors speak of its fields and their shapes instead.
var goLeaks = []string{"Go value", "Go struct", "typeHead", "manifest.", "meshpod.", "map[string]", "json.RawMessage", "unmarshaling", "converting YAML"}

// TestManifestInputShapes: input that holds no object, or an object where
// a field has the wrong shape, is refused in the manifest's terms: which
// input is empty, which document or field holds what instead of what.
func TestManifestInputShapes(t *testing.T) {
	pod := "apiVersion: v1\nkind: Pod\nmetadata: {name: web, namespace: shop}\n"
	for _, tc := range []struct{ name, data, want string }{
		{"empty", "", "the manifest is empty"},
		{"whitespace", "\n  \n \n", "the manifest holds only whitespace"},
		{"comments and separators", "# a pod, some day\n---\n---\n", "the manifest holds no object (only comments, --- separators or null)"},
		{"null", "null\n", "holds no object"},
		{"JSON array", `[{"kind":"Pod"}]`, "decoding manifest: the manifest is a list, not an object (several objects go in a kind: List's items"},
		{"empty JSON array", `[]`, "the manifest is a list, not an object"},
		{"YAML sequence", "- kind: Pod\n", "the manifest is a list, not an object"},
		{"string", `"pod"`, "the manifest is a string, not an object"},
		{"number", "42\n", "the manifest is a number, not an object"},
		{"boolean", "true\n", "the manifest is true or false, not an object"},
		{"list in the second document", pod + "---\n- a\n", "decoding manifest document 2: document 2 is a list, not an object"},
		{"List item not an object", `{"kind":"List","items":[3]}`, "List item 0: the item is a number, not an object"},
		{"items not a list", "kind: List\nitems: 5\n", "items is a number, want a list"},
		{"kind not a string", "kind: [1]\n", "kind is a list, want a string"},
		{"metadata not a map", "kind: Pod\nmetadata: 5\n", "metadata is a number, want a map"},
		{"name not a string", "kind: Pod\nmetadata: {name: [1]}\n", "metadata.name is a list, want a string"},
		{"annotations not a map", "kind: Pod\nmetadata: {annotations: [a]}\n", "metadata.annotations is a list, want a map of strings"},
		{"spec a list", "kind: Pod\nspec: []\n", "spec is a list, want a map"},
		{"uid not a number", "kind: Pod\nspec: {containers: [{name: istio-proxy, securityContext: {runAsUser: abc}}]}\n",
			"spec.containers.securityContext.runAsUser is a string, want a whole number"},
		{"template a list", "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: w}\nspec: {template: [1]}\n", `Deployment "w": decoding pod template: spec.template is a list, want a map`},
		{"not YAML", "kind: [\n", "decoding manifest: yaml: line"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseWorkload([]byte(tc.data), "")
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("ParseWorkload = %v, want an error containing %q", err, tc.want)
			}
			for _, leak := range goLeaks {
				if strings.Contains(err.Error(), leak) {
					t.Errorf("error %q names Go's types (%q)", err, leak)
				}
			}
		})
	}
}

// TestReadWorkloadNamesTheEmptyFile: an empty file is called so, by name,
// not "an object without kind".
func TestReadWorkloadNamesTheEmptyFile(t *testing.T) {
	dir := t.TempDir()
	for name, data := range map[string]string{"empty.yaml": "", "blank.yaml": "\n\n", "comments.yaml": "# nothing yet\n---\n"} {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := ReadWorkload(path, "")
		if err == nil || !strings.Contains(err.Error(), "reading pod manifest "+path+": the file ") || strings.Contains(err.Error(), "without kind") {
			t.Errorf("%s: %v, want the file named and called empty", name, err)
		}
	}
}

// TestSubject: objects are named as kubectl names them: NAMESPACE/NAME, or
// NAME alone when the manifest gives no namespace.
func TestSubject(t *testing.T) {
	for _, tc := range []struct {
		o    Object
		want string
	}{
		{Object{Kind: "Pod", Namespace: "shop", Name: "web"}, "pod shop/web"},
		{Object{Kind: "Deployment", Name: "httpbin"}, "Deployment httpbin"},
		{Object{Kind: "Pod"}, "pod (no metadata.name)"},
		{Object{Kind: "Job", Namespace: "shop"}, `Job in namespace "shop" (no metadata.name)`},
	} {
		if got := tc.o.Subject(); got != tc.want {
			t.Errorf("Subject of %+v = %q, want %q", tc.o, got, tc.want)
		}
	}
}
