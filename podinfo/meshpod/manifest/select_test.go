package manifest

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func podDoc(namespace, name string) string {
	return fmt.Sprintf("apiVersion: v1\nkind: Pod\nmetadata:\n  name: %s\n  namespace: %s\n", name, namespace)
}

func TestSelectPod(t *testing.T) {
	a, b := podDoc("shop", "web-a"), podDoc("shop", "web-b")
	twelve := ""
	for i := range 12 {
		twelve += "---\n" + podDoc("shop", fmt.Sprintf("p%d", i))
	}
	list := func(kind string, items ...string) string {
		return fmt.Sprintf(`{"apiVersion":"v1","kind":%q,"items":[%s]}`, kind, strings.Join(items, ","))
	}
	jsonPod := func(ns, name string) string {
		return fmt.Sprintf(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":%q,"namespace":%q}}`, name, ns)
	}
	for _, tc := range []struct {
		name, data, pick string
		want             string // the chosen pod's namespace/name
		err              []string
	}{
		{name: "one pod", data: a, want: "shop/web-a"},
		{name: "leading separator and comments", data: "# a pod\n---\n" + a + "---\n# nothing\n", want: "shop/web-a"},
		{name: "two pods", data: a + "---\n" + b, err: []string{"2 Pods", `"shop/web-a"`, `"shop/web-b"`, "choose one with --name"}},
		{name: "two pods, by name", data: a + "---\n" + b, pick: "web-b", want: "shop/web-b"},
		{name: "two pods, by namespace/name", data: a + "---\n" + b, pick: "shop/web-a", want: "shop/web-a"},
		{name: "two pods, unknown name", data: a + "---\n" + b, pick: "web-c", err: []string{`no Pod named "web-c"`, `"shop/web-a"`, `"shop/web-b"`}},
		{name: "one pod, another name", data: a, pick: "web-b", err: []string{`no Pod named "web-b"`, `"shop/web-a"`}},
		{name: "same name in two namespaces", data: a + "---\n" + podDoc("bank", "web-a"), pick: "web-a",
			err: []string{`2 Pods are named "web-a"`, `"shop/web-a"`, `"bank/web-a"`, "NAMESPACE/NAME"}},
		{name: "a pod among other kinds", data: "apiVersion: v1\nkind: Service\nmetadata: {name: web}\n---\n" + b, want: "shop/web-b"},
		{name: "no pod among other kinds", data: "kind: Service\nmetadata: {name: web}\n---\nkind: Deployment\nmetadata: {name: web, namespace: shop}\n",
			err: []string{"no Pod in the manifest", `Service "web"`, `Deployment "shop/web"`}},
		{name: "twelve pods are listed in part", data: twelve, err: []string{"12 Pods", `"shop/p9"`, "and 2 more"}},
		{name: "separator needs column 0", data: "apiVersion: v1\nkind: Pod\nmetadata:\n  name: x\n  annotations:\n    a: |\n      ---\n      b\n", want: "/x"},
		{name: "separator with trailing space", data: a + "---  \n" + b, pick: "web-b", want: "shop/web-b"},
		{name: "List", data: list("List", jsonPod("shop", "web-a"), jsonPod("shop", "web-b")), err: []string{"2 Pods", `"shop/web-b"`}},
		{name: "List by name", data: list("List", jsonPod("shop", "web-a"), jsonPod("shop", "web-b")), pick: "web-b", want: "shop/web-b"},
		{name: "List of one pod", data: list("List", `{"kind":"Service","metadata":{"name":"s"}}`, jsonPod("shop", "web-a")), want: "shop/web-a"},
		{name: "List without pods", data: list("List", `{"kind":"Service","metadata":{"name":"s"}}`), err: []string{"no Pod", `Service "s"`}},
		{name: "empty List", data: list("List"), err: []string{"no Pod", "an empty List"}},
		{name: "PodList items carry no kind", data: list("PodList", `{"metadata":{"name":"web-a","namespace":"shop"}}`), want: "shop/web-a"},
		{name: "List item not an object", data: list("List", "3"), err: []string{"decoding manifest", "List item 0"}},
		{name: "lone document of another kind goes to the decoder", data: "kind: Deployment\n", err: []string{`kind is "Deployment"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := ParseManifestNamed([]byte(tc.data), tc.pick)
			if len(tc.err) > 0 {
				if err == nil {
					t.Fatalf("chose %s/%s, want an error", p.Namespace, p.Name)
				}
				for _, w := range tc.err {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q does not say %s", err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := p.Namespace + "/" + p.Name; got != tc.want {
				t.Errorf("chose %s, want %s", got, tc.want)
			}
		})
	}
}

// TestReadManifestCapped: a manifest larger than the cap, or a device that
// never ends, is refused quickly with the file and the cap named.
func TestReadManifestCapped(t *testing.T) {
	big := filepath.Join(t.TempDir(), "big.yaml")
	pad := "# " + strings.Repeat("x", 1000) + "\n"
	data := podDoc("shop", "web") + strings.Repeat(pad, MaxManifestSize/len(pad)+1)
	if err := os.WriteFile(big, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{big, "/dev/zero"} {
		start := time.Now()
		_, err := ReadManifest(path)
		if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "4 MiB cap") {
			t.Errorf("ReadManifest(%s) = %v, want the file and the cap named", path, err)
		}
		if took := time.Since(start); took > 5*time.Second {
			t.Errorf("ReadManifest(%s) took %v", path, took)
		}
	}
	// At the cap exactly is still read.
	exact := filepath.Join(t.TempDir(), "exact.yaml")
	data = podDoc("shop", "web")
	data += strings.Repeat("#", MaxManifestSize-len(data)-1) + "\n"
	if err := os.WriteFile(exact, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	if p, err := ReadManifest(exact); err != nil || p.Name != "web" {
		t.Errorf("a manifest of exactly the cap: %v", err)
	}
}

// FuzzSelectPod: any stream and name give a document or an error, never a
// panic; a chosen Pod picked by name has that name.
func FuzzSelectPod(f *testing.F) {
	f.Add([]byte(podDoc("shop", "a")+"---\n"+podDoc("shop", "b")), "b")
	f.Add([]byte(`{"kind":"List","items":[{"kind":"Pod","metadata":{"name":"a"}}]}`), "")
	f.Add([]byte(`{"kind":"PodList","apiVersion":"v1","items":[{"metadata":{"name":"a","namespace":"n"}},3]}`), "n/a")
	f.Add([]byte("---\n---\n# x\n"), "")
	f.Fuzz(func(t *testing.T, data []byte, name string) {
		p, err := ParseManifestNamed(data, name)
		if err != nil || name == "" {
			return
		}
		if ns, n, ok := strings.Cut(name, "/"); ok {
			if p.Namespace != ns || p.Name != n {
				t.Fatalf("asked for %q, got %s/%s", name, p.Namespace, p.Name)
			}
		} else if p.Name != name {
			t.Fatalf("asked for %q, got %s", name, p.Name)
		}
	})
}
