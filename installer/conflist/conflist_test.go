package conflist

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"

	"github.com/nftmesh/nftmesh/podinfo/cniconf"
	"github.com/nftmesh/nftmesh/testkit/cnitest"
)

var testConfDir = cnitest.ConfDir()

// testEntry is an entry as the agent writes it.
func testEntry() json.RawMessage {
	str := func(s string) *string { return &s }
	return cniconf.PluginConf{Name: PluginName, Type: PluginName, PluginSettings: cniconf.PluginSettings{
		LogLevel: str("info"), ExcludeNamespaces: []string{"kube-system"}, AgentRunDir: str("/var/run/nftmesh"),
		Kubeconfig: str("/var/run/nftmesh/kubeconfig"), Backend: str("auto"), APITimeout: str("30s"),
	}}.JSON()
}

// asList loads any config file the way the runtime does.
func mustLoad(t *testing.T, path string) *libcni.NetworkConfigList {
	t.Helper()
	l, err := LoadConfFile(path)
	if err != nil {
		t.Fatalf("runtime cannot load %s: %v", path, err)
	}
	return l
}

func pluginValues(t *testing.T, l *libcni.NetworkConfigList) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, p := range l.Plugins {
		var m map[string]any
		if err := json.Unmarshal(p.Bytes, &m); err != nil {
			t.Fatal(err)
		}
		delete(m, "cniVersion") // the list's version applies
		out = append(out, m)
	}
	return out
}

func TestInsertPluginRealWorld(t *testing.T) {
	ours := testEntry()
	for _, src := range cnitest.RealWorld(t) {
		t.Run(filepath.Base(src), func(t *testing.T) {
			dir := t.TempDir()
			p := filepath.Join(dir, filepath.Base(src))
			orig, err := os.ReadFile(src)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, orig, 0o644); err != nil {
				t.Fatal(err)
			}
			before := mustLoad(t, p)

			out, err := InsertPlugin(p, orig, ours)
			if err != nil {
				t.Fatalf("InsertPlugin: %v", err)
			}
			lp := ListPath(p)
			if err := os.WriteFile(lp, out, 0o644); err != nil {
				t.Fatal(err)
			}
			after, err := libcni.ConfListFromFile(lp)
			if err != nil {
				t.Fatalf("result does not parse with libcni.ConfListFromFile: %v\n%s", err, out)
			}
			if after.Name != before.Name || after.CNIVersion != before.CNIVersion {
				t.Errorf("list name/version %q/%q, want the primary's %q/%q", after.Name, after.CNIVersion, before.Name, before.CNIVersion)
			}
			if after.DisableCheck != before.DisableCheck {
				t.Errorf("disableCheck changed")
			}
			n := len(after.Plugins)
			if n != len(before.Plugins)+1 || after.Plugins[n-1].Network.Type != PluginName {
				t.Fatalf("want the primary's %d plugins then ours, got %d plugins:\n%s", len(before.Plugins), n, out)
			}
			if got, want := pluginValues(t, &libcni.NetworkConfigList{Plugins: after.Plugins[:n-1]}), pluginValues(t, before); !reflect.DeepEqual(got, want) {
				t.Errorf("primary plugins changed:\n got %v\nwant %v", got, want)
			}
			if !SameEntry(after.Plugins[n-1].Bytes, ours) {
				t.Errorf("our entry %s, want %s", after.Plugins[n-1].Bytes, ours)
			}
			// Inserting again changes nothing (no stale duplicate).
			again, err := InsertPlugin(lp, out, ours)
			if err != nil {
				t.Fatal(err)
			}
			if string(again) != string(out) {
				t.Errorf("second insert changed the file:\n%s\nthen\n%s", out, again)
			}
			// Removing gives back the primary's plugins.
			stripped, changed, err := RemovePlugin(lp, out)
			if err != nil || !changed {
				t.Fatalf("RemovePlugin: changed=%v err=%v", changed, err)
			}
			l, err := libcni.ConfListFromBytes(stripped)
			if err != nil {
				t.Fatal(err)
			}
			if got, want := pluginValues(t, l), pluginValues(t, before); !reflect.DeepEqual(got, want) {
				t.Errorf("after removal:\n got %v\nwant %v", got, want)
			}
		})
	}
}

func TestInsertPluginKeepsKeyOrder(t *testing.T) {
	orig, err := os.ReadFile(filepath.Join(testConfDir, "10-calico.conflist"))
	if err != nil {
		t.Fatal(err)
	}
	out, err := InsertPlugin("10-calico.conflist", orig, testEntry())
	if err != nil {
		t.Fatal(err)
	}
	s := string(out)
	// The primary's order is name, cniVersion, plugins; in the calico plugin log_level precedes ipam.
	if !(strings.Index(s, `"name"`) < strings.Index(s, `"cniVersion"`) && strings.Index(s, `"log_level"`) < strings.Index(s, `"ipam"`)) {
		t.Errorf("key order not kept:\n%s", s)
	}
}

func TestInsertPluginRemovesStaleCopies(t *testing.T) {
	stale := `{"cniVersion":"0.3.1","name":"n","plugins":[{"type":"nftmesh-cni","log_level":"debug"},{"type":"ptp"},{"type":"nftmesh-cni","old":true}]}`
	out, err := InsertPlugin("x.conflist", []byte(stale), testEntry())
	if err != nil {
		t.Fatal(err)
	}
	l, err := libcni.ConfListFromBytes(out)
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Plugins) != 2 || l.Plugins[0].Network.Type != "ptp" || l.Plugins[1].Network.Type != PluginName {
		t.Fatalf("want [ptp nftmesh-cni], got %s", out)
	}
}

func TestConfToConflist(t *testing.T) {
	orig, err := os.ReadFile(filepath.Join(testConfDir, "10-bridge.conf"))
	if err != nil {
		t.Fatal(err)
	}
	out, err := InsertPlugin("/x/10-bridge.conf", orig, testEntry())
	if err != nil {
		t.Fatal(err)
	}
	if got := ListPath("/x/10-bridge.conf"); got != "/x/10-bridge.conflist" {
		t.Errorf("ListPath = %s", got)
	}
	l, err := libcni.ConfListFromBytes(out)
	if err != nil {
		t.Fatal(err)
	}
	if l.CNIVersion != "0.4.0" || l.Name != "bridge" {
		t.Errorf("list %q %q, want the bridge conf's cniVersion 0.4.0 and name", l.CNIVersion, l.Name)
	}
	if len(l.Plugins) != 2 || l.Plugins[0].Network.Type != "bridge" || l.Plugins[1].Network.Type != PluginName {
		t.Fatalf("plugins: %s", out)
	}
	var br map[string]any
	_ = json.Unmarshal(l.Plugins[0].Bytes, &br)
	if br["bridge"] != "cnio0" || br["ipam"] == nil {
		t.Errorf("bridge plugin lost its settings: %v", br)
	}
}

func TestInsertPluginBadInput(t *testing.T) {
	ours := testEntry()
	cases := []struct {
		name, path, in, want string
	}{
		{"not json", "a.conflist", "nope", "parsing a.conflist"},
		{"array", "a.conflist", "[1]", "not an object"},
		{"trailing data", "a.conflist", `{"name":"x","plugins":[{"type":"a"}]} {}`, "parsing a.conflist"},
		{"list without plugins", "a.conflist", `{"name":"x","cniVersion":"0.3.1"}`, "no plugins"},
		{"empty plugins", "a.conflist", `{"name":"x","plugins":[]}`, "no plugins"},
		{"plugins not array", "a.conflist", `{"name":"x","plugins":{}}`, "plugins"},
		{"plugin without type", "a.conflist", `{"name":"x","plugins":[{"name":"y"}]}`, "type"},
		{"only ours", "a.conflist", `{"name":"x","plugins":[{"type":"nftmesh-cni"}]}`, "no plugin but"},
		{"conf without type", "a.conf", `{"name":"x"}`, "type"},
		{"list saved as conf", "a.conf", `{"name":"x","type":"bridge","plugins":[{"type":"a"}]}`, "network list saved as"},
		{"our standalone", "a.conf", `{"name":"x","type":"nftmesh-cni"}`, "our own"},
		{"bad cniVersion type", "a.conf", `{"name":"x","type":"bridge","cniVersion":1}`, "parsing a.conf"},
		{"list name not string", "a.conflist", `{"name":1,"plugins":[{"type":"a"}]}`, "name"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out, err := InsertPlugin(c.path, []byte(c.in), ours)
			if err == nil {
				t.Fatalf("want error, got %s", out)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %q does not mention %q", err, c.want)
			}
		})
	}
}

func TestFindPrimarySkipsInvalid(t *testing.T) {
	dir := t.TempDir()
	inv, _ := filepath.Glob(filepath.Join(testConfDir, "invalid", "*"))
	if len(inv) < 7 {
		t.Fatalf("invalid samples missing: %v", inv)
	}
	for _, f := range append(inv, filepath.Join(testConfDir, "10-calico.conflist"), filepath.Join(testConfDir, "10-flannel.conflist")) {
		b, _ := os.ReadFile(f)
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(f)), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// Not a config extension: ignored without a warning.
	_ = os.WriteFile(filepath.Join(dir, "00-readme.txt"), []byte("x"), 0o644)
	_ = os.Mkdir(filepath.Join(dir, "00-dir.conf"), 0o755)
	// Our own standalone file is not a primary.
	_ = os.WriteFile(filepath.Join(dir, "00-nftmesh.conf"), []byte(`{"cniVersion":"0.3.1","name":"nftmesh-cni","type":"nftmesh-cni"}`), 0o644)

	p, skipped, err := FindPrimary(dir)
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Base(p) != "10-calico.conflist" {
		t.Errorf("primary %s, want 10-calico.conflist (lexically first valid)", p)
	}
	if len(skipped) != len(inv)+1 {
		t.Errorf("skipped %d files, want %d: %v", len(skipped), len(inv)+1, skipped)
	}
	for _, s := range skipped {
		if s.Err == nil {
			t.Errorf("%s skipped without a reason", s.Path)
		}
	}

	empty := t.TempDir()
	if p, _, err := FindPrimary(empty); p != "" || err != nil {
		t.Errorf("empty dir: %q %v", p, err)
	}
	if p, _, err := FindPrimary(filepath.Join(empty, "missing")); p != "" || err != nil {
		t.Errorf("missing dir: %q %v", p, err)
	}
}

func TestResolveNamed(t *testing.T) {
	dir := t.TempDir()
	_ = os.WriteFile(filepath.Join(dir, "10-x.conflist"), []byte("{}"), 0o644)
	if got := ResolveNamed(dir, "10-x.conf"); got != filepath.Join(dir, "10-x.conflist") {
		t.Errorf("twin not found: %q", got)
	}
	if got := ResolveNamed(dir, "10-x.conflist"); got != filepath.Join(dir, "10-x.conflist") {
		t.Errorf("%q", got)
	}
	if got := ResolveNamed(dir, "20-y.conf"); got != "" {
		t.Errorf("%q", got)
	}
}

// FuzzInsertPlugin feeds arbitrary bytes as the primary config: never a
// panic, and any output loads with libcni, holds our entry exactly once
// and strips back to a loadable list.
func FuzzInsertPlugin(f *testing.F) {
	for _, p := range cnitest.RealWorld(f) {
		b, _ := os.ReadFile(p)
		f.Add(b, strings.HasSuffix(p, ".conflist"))
	}
	inv, _ := filepath.Glob(filepath.Join(testConfDir, "invalid", "*"))
	for _, p := range inv {
		b, _ := os.ReadFile(p)
		f.Add(b, true)
		f.Add(b, false)
	}
	f.Add([]byte(`{"name":"a","plugins":[{"type":"x"}],"name":"b"}`), true)
	f.Add([]byte(`{"name":"a","plugins":[{"TYPE":"nftmesh-cni"},{"type":"x"}]}`), true)
	ours := testEntry()
	f.Fuzz(func(t *testing.T, data []byte, list bool) {
		path := "/n/10-x.conf"
		if list {
			path = "/n/10-x.conflist"
		}
		out, err := InsertPlugin(path, data, ours)
		if err != nil {
			return
		}
		l, err := libcni.ConfListFromBytes(out)
		if err != nil {
			t.Fatalf("wrote an unparsable file: %v\n%s", err, out)
		}
		if len(l.Plugins) < 2 {
			t.Fatalf("want the primary's plugin(s) and ours, got %d", len(l.Plugins))
		}
		if err := verifyOurList(out, ours); err != nil {
			t.Fatal(err)
		}
		if _, _, err := RemovePlugin(ListPath(path), out); err != nil {
			t.Fatalf("cannot remove our entry again: %v", err)
		}
	})
}

// A single-plugin conf without a (string) name becomes a list named
// DefaultListName; a named one keeps its name.
func TestConfToConflistName(t *testing.T) {
	for conf, want := range map[string]string{
		`{"cniVersion":"0.4.0","type":"bridge"}`:               DefaultListName,
		`{"cniVersion":"0.4.0","name":null,"type":"bridge"}`:   DefaultListName,
		`{"cniVersion":"0.4.0","name":"","type":"bridge"}`:     DefaultListName,
		`{"cniVersion":"0.4.0","name":"net1","type":"bridge"}`: "net1",
	} {
		out, err := InsertPlugin("/x/10-bridge.conf", []byte(conf), testEntry())
		if err != nil {
			t.Fatalf("%s: %v", conf, err)
		}
		l, err := libcni.ConfListFromBytes(out)
		if err != nil {
			t.Fatal(err)
		}
		if l.Name != want {
			t.Errorf("%s: list name %q, want %q", conf, l.Name, want)
		}
	}
}
