package yamljson

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"

	sigsyaml "sigs.k8s.io/yaml"
)

// compact normalises JSON for comparison.
func compact(t testing.TB, b []byte) string {
	t.Helper()
	var buf bytes.Buffer
	if err := json.Compact(&buf, b); err != nil {
		t.Fatalf("not JSON: %v: %q", err, b)
	}
	return buf.String()
}

// sameAsSigs fails t unless ToJSON refuses y or gives what
// sigs.k8s.io/yaml.YAMLToJSON gives; when that one fails, ToJSON must
// too. It reports whether ToJSON accepted y.
func sameAsSigs(t testing.TB, y []byte) bool {
	t.Helper()
	got, err := ToJSON(y)
	want, wantErr := sigsyaml.YAMLToJSON(y)
	switch {
	case wantErr != nil && err == nil:
		t.Fatalf("ToJSON(%q) = %s, sigs.k8s.io/yaml fails: %v", y, got, wantErr)
	case err != nil:
		var e *Error
		if errors.As(err, &e) && (e.Line < 1 || e.Line > bytes.Count(y, []byte("\n"))+1) {
			t.Fatalf("ToJSON(%q): error names line %d: %v", y, e.Line, err)
		}
		if len(err.Error()) > 300 {
			t.Fatalf("ToJSON(%q): error of %d bytes: %v", y, len(err.Error()), err)
		}
		return false
	case compact(t, got) != compact(t, want):
		t.Fatalf("ToJSON(%q)\n got %s\nwant %s", y, got, want)
	}
	return true
}

func TestToJSON(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"empty", "", `null`},
		{"comments only", "# a\n  # b\n", `null`},
		{"document start only", "---\n", `null`},
		{"document markers", "# head\n--- # c\na: 1\n...\n# tail\n", `{"a":1}`},
		{"kubectl pod", "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\n  labels:\n    app: web\nspec:\n  containers:\n  - name: c\n    args:\n    - a\n    - --b=c\n    ports:\n    - containerPort: 80\n      protocol: TCP\n",
			`{"apiVersion":"v1","kind":"Pod","metadata":{"labels":{"app":"web"},"name":"web"},"spec":{"containers":[{"args":["a","--b=c"],"name":"c","ports":[{"containerPort":80,"protocol":"TCP"}]}]}}`},
		{"indented sequence", "a:\n  - 1\n  - 2\nb: x\n", `{"a":[1,2],"b":"x"}`},
		{"windows line ends", "a: |\r\n  x\r\n  y\r\nb: \"p\r\n  q\"\r\nc:\r\n- d\r\n", `{"a":"x\ny\n","b":"p q","c":["d"]}`},
		{"nested sequences", "- - a\n  - b\n- -\n  - c\n", `[["a","b"],[null,"c"]]`},
		{"empty values", "a:\nb: ~\nc: null\nd:\n- \n- x\n", `{"a":null,"b":null,"c":null,"d":[null,"x"]}`},
		{"flow", "a: {b: c, d: [1, 2.5, 'x', \"y\"], e: {}, f: []}\n", `{"a":{"b":"c","d":[1,2.5,"x","y"],"e":{},"f":[]}}`},
		{"flow across lines", "a: [1,\n  2,\n  3]\nb: {c: d,\n  e: f,}\n", `{"a":[1,2,3],"b":{"c":"d","e":"f"}}`},
		{"flow oddities", "a: {b:c, d, \"e\":f, g: }\nh: [a:b, 'c']\n", ``},
		{"json", `{"kind":"Pod","n":-1.5e3,"t":true,"z":null,"s":"a\"b\\c\u00e9"}`, ``},
		{"json pretty", "{\n  \"a\": [\n    1,\n    {\"b\": \"c\"}\n  ]\n}\n", `{"a":[1,{"b":"c"}]}`},
		{"booleans", "a: [yes, No, ON, off, y, N, True, FALSE, yEs]\n", `{"a":[true,false,true,false,true,false,true,false,"yEs"]}`},
		{"numbers", "a: [0x1F, 0o17, 017, 0b101, -0b11, 1_000, +5, 1e3, 1.5, .5, -.5, 1., 9223372036854775808, 99999999999999999999, 1e400, 0x_1]\n", ``},
		{"not numbers", "a: [1.2.3, 0x, 12:30, 2024-01-02, 1e, --1, .e1, 0b2]\n", ``},
		{"quoted", "a: 'it''s'\nb: \"tab\\there \\x41\\u00e9\\U0001F600 \\\\ \\\"\"\n", ``},
		{"quoted escapes", "a: \"\\0\\a\\b\\v\\f\\r\\e\\ \\N\\_\\L\\P\"\n", ``},
		{"quoted folding", "a: \"one\n  two\n\n  three \\\n  four\"\nb: 'x\n\n\n  y'\n", `{"a":"one two\nthree four","b":"x\n\ny"}`},
		{"plain folding", "a: one\n  two\n\n  three\nb: x # c\n", `{"a":"one two\nthree","b":"x"}`},
		{"plain specials", "a: http://x:80/#frag\nb: a#b\nc: -x\nd: ?x\ne: :x\nf: x:y\ng: 'x' # c\n", ``},
		{"literal", "a: |\n  one\n   two\n\n  three\n\nb: |-\n  x\nc: |+\n  y\n\n\nd: 1\n", `{"a":"one\n two\n\nthree\n","b":"x","c":"y\n\n\n","d":1}`},
		{"folded", "a: >\n  one\n  two\n\n  three\n    more\n  four\nb: >-\n  x\n  y\n", `{"a":"one two\nthree\n  more\nfour\n","b":"x y"}`},
		{"block scalar indicators", "a: |2\n    x\n  y\nb: >1-\n  z\nc: |+2\n   w\n", ``},
		{"block scalar in sequence", "- |\n  a\n- >\n  b\n  c\n- x\n", `["a\n","b c\n","x"]`},
		{"block scalar at the end", "a: |\n  x", `{"a":"x"}`},
		{"block scalar empty", "a: |\nb: >+\n\nc: 1\n", ``},
		{"separator inside block scalar", "a: |\n  ---\n  ...\n", `{"a":"---\n...\n"}`},
		{"non-string keys", "1: a\ntrue: b\n0x10: c\nno: d\n", `{"1":"a","16":"c","false":"d","true":"b"}`},
		{"duplicate keys: the last wins", "a: 1\nb: 2\na: 3\n1: x\n01: z\n", `{"1":"z","a":3,"b":2}`},
		{"quoted keys", "'a b': 1\n\"c\\td\": 2\n'1': 3\n", `{"1":3,"a b":1,"c\td":2}`},
		{"key with spaces before colon", "a  : 1\n", `{"a":1}`},
		{"top-level scalars", "hello world\n", `"hello world"`},
		{"top-level indented mapping", "  a: 1\n  b: 2\n", `{"a":1,"b":2}`},
		{"html characters", "a: <b> & c\n", `{"a":"\u003cb\u003e \u0026 c"}`},
		{"unicode", "ключ: значение 🙂\n", `{"ключ":"значение 🙂"}`},
		{"timestamp stays text", "a: 2001-12-14\nb: 2001-12-14t21:59:43.10-05:00\n", `{"a":"2001-12-14","b":"2001-12-14t21:59:43.10-05:00"}`},
		{"compact mapping in sequence", "- a: 1\n  b:\n  - x\n  c: 2\n- d: 3\n", `[{"a":1,"b":["x"],"c":2},{"d":3}]`},
		{"explicit keys, as kubectl writes long ones", "? " + strings.Repeat("k", 130) + "\n: v\n? 'q'\n:\n  a: 1\n? nokey\nz: 1\n", ``},
		{"comment after a key", "a: # c\n  b\nc:  # d\n- x\n", `{"a":"b","c":["x"]}`},
		{"block scalar with blank leading lines", "a: |\n\n  \n  x\n   y\n", `{"a":"\n\nx\n y\n"}`},
		{"folded with spaces", "a: >\n  x\n\n   y\n  z\n\n\n", `{"a":"x\n\n y\nz\n"}`},
		{"keep at the end", "a: |+\n  x\n\n", `{"a":"x\n\n"}`},
		{"flow plain across lines", "a: [b\n  c, d]\n", `{"a":["b c","d"]}`},
		{"quoted in a sequence across lines", "- 'a\n  b'\n- \"c\n\n  d\"\n", `["a b","c\nd"]`},
		{"nested flow", "{a: [{b: [c, {d: e}]}], f: {}}", `{"a":[{"b":["c",{"d":"e"}]}],"f":{}}`},
		{"value on the next line", "a:\n  b\nc:\n  [1]\nd:\n  'x'\n", `{"a":"b","c":[1],"d":"x"}`},
		{"tab inside a plain scalar", "a: b\tc\n", `{"a":"b\tc"}`},
		{"string merge key in a sequence", "a: [<<]\n'<<': b\n", `{"\u003c\u003c":"b","a":["\u003c\u003c"]}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ToJSON([]byte(tc.in))
			if err != nil {
				t.Fatalf("ToJSON: %v", err)
			}
			if tc.want != "" && compact(t, got) != compact(t, []byte(tc.want)) {
				t.Errorf("ToJSON =\n %s\nwant %s", got, tc.want)
			}
			sameAsSigs(t, []byte(tc.in))
		})
	}
}

// TestToJSONRefuses: what ToJSON does not read, it refuses naming the line
// and the construct; sigs.k8s.io/yaml fails on some of these too.
func TestToJSONRefuses(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"anchor", "a: &x 1\nb: *x\n", "line 1: anchor"},
		{"alias", "a: 1\nb: *x\n", "line 2: alias"},
		{"tag", "a: !!str 1\n", "line 1: tag"},
		{"complex explicit key", "? [a]\n: b\n", "line 1: explicit key \"[a]\": only a scalar"},
		{"explicit key without a key", "a: 1\n?\n: b\n", "line 2: explicit key (\"? \") without a key"},
		{"complex key", "[a]: b\n", "line 1: flow collection as a mapping key"},
		{"merge key", "a: {x: 1}\nb:\n  <<: {y: 2}\n", "line 3: merge key"},
		{"null key", "~: a\n", "line 1: null mapping key"},
		{"float key", "1.5: a\n", "line 1: mapping key \"1.5: a\" is a number"},
		{"colliding keys", "1: a\n'1': b\n", "keys of different types"},
		{"second document", "a: 1\n---\nb: 2\n", "line 2: a second document"},
		{"directive", "%YAML 1.1\n---\na: 1\n", "line 1: directive"},
		{"content after ---", "--- a\n", "line 1: content after \"---\""},
		{"tab indentation", "a:\n\tb: 1\n", "line 2: tab character in indentation"},
		{"tab after colon", "a:\tb\n", "line 1: tab character after \":\""},
		{"carriage return", "a: 1\rb: 2\n", "line 1: carriage return"},
		{"carriage return before the end", "a: 1\r\nb: 2\r", "line 2: carriage return"},
		{"control character", "a: \x01\n", "line 1: control character"},
		{"invalid UTF-8", "a: \xff\n", "line 1: invalid UTF-8"},
		{"byte order mark", "\ufeffa: 1\n", "byte order mark"},
		{"bad indentation", "a:\n  b:\n    c: 1\n   d: 2\n", "line 4: unexpected indentation"},
		{"mapping in a value", "a: b: c\n", "line 1: mapping value"},
		{"sequence in a value", "a: - b\n", "line 1: block sequence entry"},
		{"entry where a key is expected", "a: 1\n- b\n", "line 2: sequence entry"},
		{"key without value", "a: 1\nb\n", "line 2: \"b\": expected a mapping key"},
		{"unclosed quote", "a: 'x\n", "line 1: quoted scalar"},
		{"unclosed flow", "a: [1, 2\n", `line 1: flow collection "[1, 2" is not closed`},
		{"bad flow separator", "a: [1 2 : 3]\n", "line 1: a key: value pair inside a flow sequence"},
		{"bad escape", "a: \"\\q\"\n", "line 1: unknown escape"},
		{"surrogate escape", "a: \"\\ud800\"\n", "line 1: escape of invalid Unicode"},
		{"infinity", "a: .inf\n", "unsupported value"},
		{"not a NaN", "a: [.nan]\n", "unsupported value"},
		{"block scalar indicator 0", "a: |0\n  x\n", "line 1: block scalar indentation indicator 0"},
		{"junk after block scalar header", "a: | x\n", "line 1: unexpected \"x\" after a block scalar's header"},
		{"plain continuation looks like an entry", "a: b\n  - c\n", "line 2: plain scalar continues"},
		{"multi-line key", "a\nb: c\n", "line 1: mapping value (\": \") after a plain scalar that spans lines"},
		{"multi-line value then colon", "a: b\n  c: d\n", "line 1: mapping value"},
		{"deep nesting", strings.Repeat("[", 1500), "nesting deeper than 1000"},
		{"long key", strings.Repeat("k", 1200) + ": v\n", "longer than 1000 bytes"},
		{"reserved indicator", "a: @x\n", "line 1: \"@x\" cannot start a plain scalar"},
		{"comment glued to a quote", "a: 'x'#c\n", "line 1: comment not preceded by a space"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ToJSON([]byte(tc.in))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("ToJSON = %s, %v; want an error containing %q", got, err, tc.want)
			}
			sameAsSigs(t, []byte(tc.in))
		})
	}
}

// splitDocuments splits a stream at "---" lines, as kubectl reads files.
func splitDocuments(data []byte) [][]byte {
	var docs [][]byte
	start := 0
	lines := bytes.SplitAfter(data, []byte("\n"))
	off := 0
	for _, l := range lines {
		if rest, ok := bytes.CutPrefix(l, []byte("---")); ok && len(bytes.TrimSpace(rest)) == 0 {
			docs = append(docs, data[start:off])
			start = off + len(l)
		}
		off += len(l)
	}
	return append(docs, data[start:])
}

// repoManifests are the YAML files in this repository: sample pods, Istio
// manifests, the chart's values, templates and rendered output.
func repoManifests(t testing.TB) map[string][]byte {
	root := filepath.Join("..", "..")
	files := map[string][]byte{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".cache" || d.Name() == ".git" || d.Name() == "bin") {
			return filepath.SkipDir
		}
		if ext := filepath.Ext(path); !d.IsDir() && (ext == ".yaml" || ext == ".yml" || ext == ".json") {
			data, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			files[path] = data
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// TestToJSONRepoManifests: every document of every YAML and JSON file in
// the repository converts as sigs.k8s.io/yaml converts it, and those that
// are manifests are all read (not refused).
func TestToJSONRepoManifests(t *testing.T) {
	files := repoManifests(t)
	if len(files) < 40 {
		t.Fatalf("only %d manifests found", len(files))
	}
	docs, refused := 0, 0
	for path, data := range files {
		mustRead := strings.Contains(path, "testdata") || strings.HasSuffix(path, "values.yaml")
		for _, doc := range splitDocuments(data) {
			docs++
			if sameAsSigs(t, doc) {
				continue
			}
			refused++
			if _, sigsErr := sigsyaml.YAMLToJSON(doc); sigsErr == nil && mustRead {
				_, err := ToJSON(doc)
				t.Errorf("%s: refused a document sigs.k8s.io/yaml reads: %v", path, err)
			}
		}
	}
	t.Logf("%d files, %d documents, %d refused (templates and the like)", len(files), docs, refused)
}

// FuzzYAMLToJSON: for any input, ToJSON refuses it or gives exactly what
// sigs.k8s.io/yaml gives; where that fails, ToJSON fails too. Errors
// name a line of the input and are bounded; nothing panics.
func FuzzYAMLToJSON(f *testing.F) {
	for _, data := range repoManifests(f) {
		for _, doc := range splitDocuments(data) {
			f.Add(doc)
		}
	}
	for _, s := range []string{
		"a: |\n  x\n\n b\n", "a: >2-\n   x\n  y\n", "a: 'x\n  y'\n", "a: \"x\\\n  y\"\n",
		"{a: [b, {c: d}], 'e': \"f\"}", "- a\n  b\n- c: d\n  e:\n  - f\n", "1: 2\n0x1: 3\n",
		"a: [yes, 0o7, 1e3, .5, -.inf]\n", "--- # x\na: b\n...\n",
		"a: |\r\n  x\r\n  y\r\nb: \"p\r\n  q\"\r\nc: 'r\r\n\r\n  s'\r\n", "{a: [b,\r\n c]}\r\n", "a:\r\n- b\r\n- c \\\r\n  d\r\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		sameAsSigs(t, data)
	})
}

// kubectlYAML is what `kubectl get -o yaml` prints for obj, if it can
// print it (not a string with DEL, say, which its own reader refuses).
func kubectlYAML(obj any) ([]byte, bool) {
	y, err := sigsyaml.Marshal(obj)
	return y, err == nil
}

// readsKubectl fails t unless ToJSON reads (does not refuse) what kubectl
// prints for a Pod with these annotations and args, as sigs.k8s.io/yaml
// reads it (which is not always what was printed: a NEL in a string comes
// back as a space).
func readsKubectl(t testing.TB, annotations map[string]string, args []string) {
	t.Helper()
	obj := map[string]any{
		"apiVersion": "v1", "kind": "Pod",
		"metadata": map[string]any{"name": "web", "annotations": annotations},
		"spec":     map[string]any{"containers": []any{map[string]any{"name": "c", "args": args}}},
	}
	y, ok := kubectlYAML(obj)
	if !ok {
		return
	}
	if _, err := ToJSON(y); err != nil {
		t.Fatalf("refused kubectl's YAML %q: %v", y, err)
	}
	sameAsSigs(t, y)
}

// TestReadsKubectl: YAML as kubectl prints it is always read, whatever the
// strings hold: keys longer than 128 characters (written as "? key"),
// strings that look like numbers, booleans or null, line breaks, tabs,
// leading and trailing spaces, long lines (folded), quotes, indicators,
// non-ASCII and control characters.
func TestReadsKubectl(t *testing.T) {
	long := strings.Repeat("word ", 40)
	strs := []string{
		"", " ", "true", "yes", "No", "null", "~", "1", "0x1F", "1e3", ".inf", "-", "- a", "a: b", "a #b", "#a",
		"'q'", "\"d\"", "{}", "[a]", "&a", "*a", "!t", "|", ">", "%", "@", "`", "?", ":", ",", "a\nb", "a\n\nb\n",
		"a\n", "\n", "\na", "  lead", "trail  ", " both ", "tab\there", "\ttab", "x\r\ny", "\x00\x01\x1f", "é ü ß 🙂",
		"\u2028\u0085\ufeff", long, long + "\n" + long, strings.Repeat("x", 300), "---", "...", "--- a", "a\n---\nb",
		"\\", "a\\nb", "<>&", "  a\n  b\n", "a\n  b", "a  \nb", "a\t\nb", " \n ",
	}
	ann := map[string]string{}
	for i, s := range strs {
		ann[fmt.Sprintf("k%d", i)] = s
	}
	ann[strings.Repeat("a", 200)+".example.com/"+strings.Repeat("b", 60)] = "long key"
	ann["sidecar.istio.io/inject"] = "true"
	readsKubectl(t, ann, strs)
	for _, s := range strs {
		readsKubectl(t, map[string]string{s: s}, []string{s})
	}
}

// FuzzReadsKubectl: whatever strings a Pod holds, ToJSON reads what
// kubectl prints for it.
func FuzzReadsKubectl(f *testing.F) {
	f.Add("sidecar.istio.io/inject", "true", "a\n b\tc")
	f.Add(strings.Repeat("k", 130), strings.Repeat("v ", 70), "")
	f.Fuzz(func(t *testing.T, key, value, arg string) {
		if !utf8.ValidString(key) || !utf8.ValidString(value) || !utf8.ValidString(arg) {
			return // JSON would not carry them as they are
		}
		readsKubectl(t, map[string]string{key: value}, []string{arg, value})
	})
}
