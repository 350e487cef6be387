// Package conflist reads and edits CNI configuration documents the way
// container runtimes load them: discovery of the primary config in a conf
// dir, insertion of the nftmesh-cni entry as the last plugin of a list (a
// single-plugin .conf becomes a .conflist), its removal, and checks that a
// result loads and holds exactly our entry. Edits keep the primary's key
// order and its plugins' bytes.
//
// It works on bytes and paths only: it writes no file (the installer
// writes, with compare-and-swap) and does not log.
package conflist

//lint:file-ignore SA1019 kubelet and containerd still load single-plugin .conf files; libcni reads them only through ConfFromFile, ConfFromBytes and ConfListFromConf

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"

	"github.com/containernetworking/cni/libcni"
)

// PluginName is the plugin's binary name and its entry's "type".
const PluginName = "nftmesh-cni"

// ConfExtensions are the config file extensions container runtimes load.
var ConfExtensions = []string{".conf", ".conflist", ".json"}

// DefaultListName names the list made from a nameless single-plugin conf.
const DefaultListName = "k8s-pod-network"

// SkippedConf is a file discovery passed over, and why.
type SkippedConf struct {
	Path string
	Err  error
}

// IsList reports whether the runtime reads path as a network list.
func IsList(path string) bool { return filepath.Ext(path) == ".conflist" }

// LoadConfFile parses a config file the way the container runtime does: a
// .conflist as a list with at least one plugin, a .conf/.json as one plugin
// that has a type. It returns the list (a single conf wrapped into one).
func LoadConfFile(path string) (*libcni.NetworkConfigList, error) {
	if IsList(path) {
		l, err := libcni.ConfListFromFile(path)
		if err != nil {
			return nil, fmt.Errorf("loading network list %s: %w", path, err)
		}
		if len(l.Plugins) == 0 {
			return nil, fmt.Errorf("loading network list %s: no plugins", path)
		}
		return l, nil
	}
	c, err := libcni.ConfFromFile(path)
	if err != nil {
		return nil, fmt.Errorf("loading network config %s: %w", path, err)
	}
	l, err := libcni.ConfListFromConf(c)
	if err != nil {
		return nil, fmt.Errorf("loading network config %s: %w", path, err)
	}
	return l, nil
}

// FindPrimary returns the config file the runtime would use: the lexically
// first valid .conf/.conflist/.json in dir. Files holding only our plugin
// (a standalone file left behind) are not a primary. It returns "" when there
// is none, and the files it passed over.
func FindPrimary(dir string) (string, []SkippedConf, error) {
	files, err := libcni.ConfFiles(dir, ConfExtensions)
	if err != nil {
		return "", nil, fmt.Errorf("listing CNI configs in %s: %w", dir, err)
	}
	slices.Sort(files)
	var skipped []SkippedConf
	for _, f := range files {
		if fi, err := os.Stat(f); err != nil || !fi.Mode().IsRegular() {
			continue // a dangling link or a socket is not a config
		}
		l, err := LoadConfFile(f)
		if err != nil {
			skipped = append(skipped, SkippedConf{Path: f, Err: err})
			continue
		}
		if !slices.ContainsFunc(l.Plugins, func(p *libcni.PluginConfig) bool { return p.Network.Type != PluginName }) {
			skipped = append(skipped, SkippedConf{Path: f, Err: errors.New("holds only " + PluginName)})
			continue
		}
		return f, skipped, nil
	}
	return "", skipped, nil
}

// ResolveNamed returns the configured file in dir, or its .conf/.conflist
// twin when only that exists (our own .conf→.conflist rename makes one), or
// "" when neither exists.
func ResolveNamed(dir, name string) string {
	p := filepath.Join(dir, name)
	if _, err := os.Stat(p); err == nil {
		return p
	}
	ext := filepath.Ext(name)
	twinExt, ok := map[string]string{".conf": ".conflist", ".conflist": ".conf"}[ext]
	if !ok {
		return ""
	}
	twin := strings.TrimSuffix(p, ext) + twinExt
	if _, err := os.Stat(twin); err != nil {
		return ""
	}
	return twin
}

// ListPath is where a chained config for primary is written: a list stays
// in place, a single-plugin .conf/.json becomes <base>.conflist.
func ListPath(primary string) string {
	if IsList(primary) {
		return primary
	}
	return strings.TrimSuffix(primary, filepath.Ext(primary)) + ".conflist"
}

// TypeOf reads a plugin entry's type the way libcni does (encoding/json
// into a struct, so the key match is case-insensitive).
func TypeOf(raw json.RawMessage) (string, error) {
	var t struct {
		Type string `json:"type"`
	}
	if err := json.Unmarshal(raw, &t); err != nil {
		return "", err
	}
	return t.Type, nil
}

// InsertPlugin returns primary (the content of a file named like path) with
// ours as its last plugin and every older copy of ours removed. A single
// plugin becomes a list with the primary's cniVersion and name. The result
// is checked with libcni before it is returned: it never returns bytes a
// runtime cannot load.
func InsertPlugin(path string, primary []byte, ours json.RawMessage) ([]byte, error) {
	if t, err := TypeOf(ours); err != nil || t != PluginName {
		return nil, fmt.Errorf("inserting into %s: our entry has type %q, want %s", path, t, PluginName)
	}
	obj, err := parseObject(primary)
	if err != nil {
		return nil, fmt.Errorf("parsing %s: %w", path, err)
	}
	var out *object
	if IsList(path) {
		if _, err := libcni.ConfListFromBytes(primary); err != nil {
			return nil, fmt.Errorf("parsing %s: %w", path, err)
		}
		plugins, err := obj.plugins()
		if err != nil {
			return nil, fmt.Errorf("parsing %s: %w", path, err)
		}
		if plugins == nil {
			return nil, fmt.Errorf("parsing %s: network list has no plugins", path)
		}
		kept := slices.DeleteFunc(plugins, isOurs)
		if len(kept) == 0 {
			return nil, fmt.Errorf("inserting into %s: it holds no plugin but %s", path, PluginName)
		}
		obj.set("plugins", marshalArray(append(kept, ours)))
		out = obj
	} else {
		if _, err := libcni.ConfFromBytes(primary); err != nil {
			return nil, fmt.Errorf("parsing %s: %w", path, err)
		}
		if _, ok := obj.get("plugins"); ok {
			return nil, fmt.Errorf("parsing %s: a network list saved as %s, which runtimes read as a single plugin", path, filepath.Ext(path))
		}
		t, err := TypeOf(primary)
		if err != nil {
			return nil, fmt.Errorf("parsing %s: %w", path, err)
		}
		if t == PluginName {
			return nil, fmt.Errorf("inserting into %s: it is our own standalone config", path)
		}
		out = &object{}
		if v, ok := obj.get("cniVersion"); ok {
			out.set("cniVersion", v)
		}
		nameJSON, _ := json.Marshal(cmp.Or(obj.getString("name"), DefaultListName))
		out.set("name", nameJSON)
		// The list's cniVersion applies to every plugin; a copy in the
		// plugin itself would only risk a mismatch.
		obj.del("cniVersion")
		plugin, err := obj.marshal()
		if err != nil {
			return nil, fmt.Errorf("encoding the plugin of %s: %w", path, err)
		}
		out.set("plugins", marshalArray([]json.RawMessage{bytes.TrimSpace(plugin), ours}))
	}
	b, err := out.marshal()
	if err != nil {
		return nil, fmt.Errorf("encoding %s: %w", path, err)
	}
	if err := verifyOurList(b, ours); err != nil {
		return nil, fmt.Errorf("checking the new %s: %w", ListPath(path), err)
	}
	return b, nil
}

// verifyOurList checks that b loads as a list whose entries of our type are
// exactly one, equal to ours, and last: the plugin works on the result of
// the plugins before it (prevResult), so nothing may come after it.
func verifyOurList(b []byte, ours json.RawMessage) error {
	l, err := libcni.ConfListFromBytes(b)
	if err != nil {
		return err
	}
	if len(l.Plugins) == 0 {
		return errors.New("no plugins")
	}
	n := 0
	for _, p := range l.Plugins {
		if p.Network.Type != PluginName {
			continue
		}
		n++
		if !SameEntry(p.Bytes, ours) {
			return fmt.Errorf("the %s entry differs from the configured one", PluginName)
		}
	}
	if n != 1 {
		return fmt.Errorf("%d %s entries, want 1", n, PluginName)
	}
	if last := l.Plugins[len(l.Plugins)-1].Network.Type; last != PluginName {
		return fmt.Errorf("the %s entry is not last (%s comes after it)", PluginName, last)
	}
	return nil
}

// SameEntry compares two plugin entries as JSON values.
func SameEntry(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	return reflect.DeepEqual(x, y)
}

// HasPlugin reports whether a config's content holds our entry.
func HasPlugin(path string, b []byte) bool {
	return slices.Contains(pluginTypes(path, b), PluginName)
}

func isOurs(entry json.RawMessage) bool {
	t, err := TypeOf(entry)
	return err == nil && t == PluginName
}

// ForeignCapturePlugins are plugin types that program the same pod
// traffic capture as ours: chained together, each would install its own
// redirect rules in every pod and they would fight over the pod's traffic.
var ForeignCapturePlugins = []string{"istio-cni", "linkerd-cni"}

// ForeignCapture returns the first capture plugin other than ours that
// the config at path chains, or "".
func ForeignCapture(path string, b []byte) string {
	for _, t := range pluginTypes(path, b) {
		if slices.Contains(ForeignCapturePlugins, t) {
			return t
		}
	}
	return ""
}

// pluginTypes lists the plugin types of a config file as a runtime loads
// it; nil when it does not load.
func pluginTypes(path string, b []byte) []string {
	var l *libcni.NetworkConfigList
	var err error
	if IsList(path) {
		l, err = libcni.ConfListFromBytes(b)
	} else {
		var c *libcni.NetworkConfig
		if c, err = libcni.ConfFromBytes(b); err == nil {
			l, err = libcni.ConfListFromConf(c)
		}
	}
	if err != nil {
		return nil
	}
	out := make([]string, 0, len(l.Plugins))
	for _, p := range l.Plugins {
		out = append(out, p.Network.Type)
	}
	return out
}

// VerifyInstalled checks that the chained config at path loads as the
// runtime loads it and holds exactly our configured entry.
func VerifyInstalled(path string, ours json.RawMessage) error {
	if !IsList(path) {
		return fmt.Errorf("%s is not a network list", path)
	}
	if _, err := LoadConfFile(path); err != nil {
		return err
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("reading %s: %w", path, err)
	}
	if err := verifyOurList(b, ours); err != nil {
		return fmt.Errorf("checking %s: %w", path, err)
	}
	return nil
}

// RemovePlugin returns a list's content without our entries; changed is
// false when there were none. A list that would be left empty is an error.
func RemovePlugin(path string, b []byte) (out []byte, changed bool, err error) {
	plugins, err := Plugins(b)
	if err != nil {
		return nil, false, fmt.Errorf("parsing %s: %w", path, err)
	}
	kept := slices.DeleteFunc(slices.Clone(plugins), isOurs)
	if len(kept) == len(plugins) {
		return b, false, nil
	}
	if len(kept) == 0 {
		return nil, false, fmt.Errorf("removing %s from %s: no other plugin would be left", PluginName, path)
	}
	out, err = WithPlugins(b, kept)
	if err != nil {
		return nil, false, fmt.Errorf("encoding %s: %w", path, err)
	}
	if _, err := libcni.ConfListFromBytes(out); err != nil {
		return nil, false, fmt.Errorf("checking %s without %s: %w", path, PluginName, err)
	}
	return out, true, nil
}

// Plugins returns the entries of a list's "plugins" member, each as its
// bytes; nil when the document has none.
func Plugins(b []byte) ([]json.RawMessage, error) {
	obj, err := parseObject(b)
	if err != nil {
		return nil, err
	}
	return obj.plugins()
}

// WithPlugins returns the document b with its "plugins" member replaced by
// plugins, every other member and the order of all kept.
func WithPlugins(b []byte, plugins []json.RawMessage) ([]byte, error) {
	obj, err := parseObject(b)
	if err != nil {
		return nil, err
	}
	obj.set("plugins", marshalArray(plugins))
	return obj.marshal()
}
