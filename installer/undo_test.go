package installer

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/nftmesh/nftmesh/installer/conflist"
)

func (h *host) undoPath() string { return filepath.Join(h.conf, UndoDirName, UndoFileName) }

// asLegacyAgentLeftIt makes a node where the agent chained into
// 10-bridge.conf look as an agent before the undo record (d169feb) leaves
// it: its state in the run dir only, in the format of
// testdata/legacy-agent-state.json (written by that agent over the same
// .conf, 0600, root's), and nothing in the conf dir but the list.
func (h *host) asLegacyAgentLeftIt(t *testing.T) {
	t.Helper()
	written, err := os.ReadFile(filepath.Join(h.conf, "10-bridge.conflist"))
	if err != nil {
		t.Fatal(err)
	}
	tmpl, err := os.ReadFile(filepath.Join("testdata", "legacy-agent-state.json"))
	if err != nil {
		t.Fatal(err)
	}
	s := strings.ReplaceAll(string(tmpl), "@CONFDIR@", h.conf)
	s = strings.ReplaceAll(s, "@WRITTEN_SHA256@", sum(written))
	if err := os.RemoveAll(filepath.Join(h.conf, UndoDirName)); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(h.run, legacyStateName), []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
}

// legacyUserConf is the .conf the legacy state records.
func legacyUserConf(t *testing.T, h *host) userConf {
	t.Helper()
	p, b := h.put(t, "10-bridge.conf", 0o600)
	u := userConf{name: filepath.Base(p), data: b, mode: 0o600, uid: -1, gid: -1}
	if os.Geteuid() == 0 {
		u.uid, u.gid = 0, 0
	}
	return u
}

// An agent is upgraded on a node that an agent of the version before the
// undo record had chained into a .conf: its state is only in the run dir.
// The new agent moves it into the undo record (and removes it), so a
// reboot afterwards still lets uninstall give back the .conf exactly.
func TestUpgradeMovesRunDirStateThenReboot(t *testing.T) {
	h := newHost(t)
	u := legacyUserConf(t, h)
	cfg := h.config(t)
	a := startAgent(t, cfg)
	a.waitReady(t)
	a.stop()
	h.asLegacyAgentLeftIt(t)

	b := startAgent(t, cfg)
	b.waitReady(t)
	b.stop()
	assertGone(t, filepath.Join(h.run, legacyStateName))
	raw, err := os.ReadFile(h.undoPath())
	if err != nil {
		t.Fatalf("no undo record after the upgrade: %v", err)
	}
	st, err := decodeUndo(h.conf, raw)
	if err != nil || len(st.Confs) != 1 || !bytes.Equal(st.Confs[0].OriginalBytes, u.data) {
		t.Fatalf("the undo record does not hold the .conf: %v\n%s", err, raw)
	}
	h.reboot(t)
	uninstallAfterReboot(t, cfg, true)
	h.assertGivenBack(t, u)
}

// With only an earlier agent's run dir state (no undo record), cleanup
// restores from it as that agent's own cleanup did, and removes it.
func TestLegacyStateAloneStillRestores(t *testing.T) {
	for _, runFirst := range []bool{true, false} {
		h := newHost(t)
		u := legacyUserConf(t, h)
		cfg := h.config(t)
		a := startAgent(t, cfg)
		a.waitReady(t)
		a.stop()
		h.asLegacyAgentLeftIt(t)
		uninstallAfterReboot(t, cfg, runFirst) // no reboot: the run dir state is there
		h.assertGivenBack(t, u)
		assertGone(t, filepath.Join(h.run, legacyStateName))
	}
}

// evilRecord is the undo record at path with the original's bytes replaced:
// what a link planted in the record's place points to.
func evilRecord(t *testing.T, h *host, path string) []byte {
	t.Helper()
	st, err := decodeUndo(h.conf, mustRead(t, path))
	if err != nil {
		t.Fatal(err)
	}
	st.Confs[0].OriginalBytes = []byte(`{"cniVersion":"0.4.0","name":"evil","type":"evil"}`)
	b, err := encodeUndo(h.conf, st)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// assertNotEvil checks that the planted record was not used: no config
// holds its bytes, our entry is gone, and the link's target is untouched.
func assertNotEvil(t *testing.T, h *host, target string, evil []byte) {
	t.Helper()
	lp := filepath.Join(h.conf, "10-bridge.conflist")
	got := mustRead(t, lp)
	if bytes.Contains(got, []byte("evil")) || conflist.HasPlugin(lp, got) {
		t.Errorf("cleanup used the planted record or left our entry:\n%s", got)
	}
	assertGone(t, filepath.Join(h.conf, "10-bridge.conf"))
	if b := mustRead(t, target); !bytes.Equal(b, evil) {
		t.Errorf("the link's target %s was changed", target)
	}
}

// A link planted as the undo record, or as the earlier agent's state in
// the run dir, is refused and never followed (issue 29 item 8's rule for
// every file the agent keeps): cleanup then strips our entry instead of
// writing what the link's target says, and the target is left as it was.
func TestPlantedLinkAsRecordRefused(t *testing.T) {
	for _, where := range []string{"undo record", "run dir state"} {
		t.Run(where, func(t *testing.T) {
			h := newHost(t)
			h.put(t, "10-bridge.conf", 0o600)
			cfg := h.config(t)
			a := startAgent(t, cfg)
			a.waitReady(t)
			a.stop()
			evil := evilRecord(t, h, h.undoPath())
			link := h.undoPath()
			if where == "run dir state" {
				var st agentState
				st, _ = decodeUndo(h.conf, evil)
				evil, _ = json.Marshal(st) // the earlier agent's format: absolute paths
				link = filepath.Join(h.run, legacyStateName)
				if err := os.RemoveAll(filepath.Join(h.conf, UndoDirName)); err != nil {
					t.Fatal(err)
				}
			}
			target := filepath.Join(h.root, "planted.json")
			if err := os.WriteFile(target, evil, 0o600); err != nil {
				t.Fatal(err)
			}
			_ = os.Remove(link)
			if err := os.Symlink(target, link); err != nil {
				t.Fatal(err)
			}
			var log lockedBuf
			in, err := New(cfg, zerolog.New(&log), nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, _, err := in.loadUndo(); err == nil || !strings.Contains(err.Error(), "refusing "+link+": a symbolic link") {
				t.Errorf("loading through the planted link: %v", err)
			}
			if err := in.Cleanup(); err != nil {
				t.Fatal(err)
			}
			assertNotEvil(t, h, target, evil)
			assertGone(t, link)
		})
	}
}

// A link planted as the undo record's directory: the agent refuses to
// write the record through it, and so does not rewrite the primary at all
// (no rewrite without its record on disk); the error names the directory.
func TestPlantedLinkAsUndoDirRefused(t *testing.T) {
	h := newHost(t)
	u := h.putUserConf(t, "conf")
	elsewhere := filepath.Join(h.root, "elsewhere")
	if err := os.Mkdir(elsewhere, 0o700); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(h.conf, UndoDirName)
	if err := os.Symlink(elsewhere, link); err != nil {
		t.Fatal(err)
	}
	a := startAgent(t, h.config(t))
	want := "refusing the undo record's directory " + link + ": not a directory"
	a.waitFor(t, "the install refused", func() bool {
		err := a.in.Ready()
		return err != nil && strings.Contains(err.Error(), want)
	})
	a.stop()
	if ents, _ := os.ReadDir(elsewhere); len(ents) != 0 {
		t.Errorf("written through the link: %v", ents)
	}
	if err := os.Remove(link); err != nil {
		t.Fatal(err)
	}
	h.assertGivenBack(t, u) // never rewritten
}

// undoFixture is a valid stored record of a converted .conf, as JSON
// fields, for bad-input cases to change one field of.
func undoFixture() map[string]any {
	return map[string]any{
		"version": 1,
		"confs": []any{map[string]any{
			"written": "10-bridge.conflist", "written_sha256": strings.Repeat("ab", 32),
			"original": "10-bridge.conf", "original_bytes": base64.StdEncoding.EncodeToString([]byte(`{"type":"bridge"}`)),
			"original_mode": 0o600, "original_uid": 0, "original_gid": 0, "original_link": "../shared/bridge.conf",
		}},
	}
}

func TestDecodeUndoBadInput(t *testing.T) {
	set := func(k string, v any) func(map[string]any) {
		return func(f map[string]any) { f["confs"].([]any)[0].(map[string]any)[k] = v }
	}
	for _, tc := range []struct {
		name, want string
		mut        func(map[string]any)
	}{
		{"version 2", `version 2 is not 1`, func(f map[string]any) { f["version"] = 2 }},
		{"no version", `version 0 is not 1`, func(f map[string]any) { delete(f, "version") }},
		{"written in a subdir", `confs[0].written: "a/10-bridge.conflist" is not the name`, set("written", "a/10-bridge.conflist")},
		{"written upwards", `confs[0].written: "../10-bridge.conflist" is not the name`, set("written", "../10-bridge.conflist")},
		{"written a .conf", `confs[0].written: "10-bridge.conf" is not the name of a .conflist`, set("written", "10-bridge.conf")},
		{"written a temp file", `confs[0].written: ".nftmesh-x.conflist-1.tmp"`, set("written", ".nftmesh-x.conflist-1.tmp")},
		{"original absolute", `confs[0].original: "/etc/passwd" is not the name`, set("original", "/etc/passwd")},
		{"original no config", `confs[0].original: "10-bridge.txt" is not the name of a CNI config`, set("original", "10-bridge.txt")},
		{"original of another list", `confs[0].original: "20-other.conf" is not what "10-bridge.conflist" was written from`, set("original", "20-other.conf")},
		{"sum short", `confs[0].written_sha256: "abc" is not a SHA-256`, set("written_sha256", "abc")},
		{"sum upper case", `confs[0].written_sha256: "ABAB`, set("written_sha256", strings.Repeat("AB", 32))},
		{"bytes not JSON", `confs[0].original_bytes: 3 bytes that are not a JSON document`, set("original_bytes", base64.StdEncoding.EncodeToString([]byte("{x:")))},
		{"bytes empty", `confs[0].original_bytes: 0 bytes`, set("original_bytes", "")},
		{"mode setuid", `confs[0].original_mode: 04755 is not`, set("original_mode", 0o4755)},
		{"uid negative", `confs[0].original_uid: -1 is not a user id`, set("original_uid", -1)},
		{"gid too large", `confs[0].original_gid: 4294967295 is not a group id`, set("original_gid", int64(4294967295))},
		{"link on a list", `confs[0].original_link: "../shared/bridge.conf" is not`, func(f map[string]any) {
			set("original", "10-bridge.conflist")(f)
		}},
		{"link long", `confs[0].original_link: "xxxxxxxx`, set("original_link", strings.Repeat("x", 5000))},
		{"twice", `confs[1].written: "10-bridge.conflist" appears twice`, func(f map[string]any) {
			f["confs"] = append(f["confs"].([]any), f["confs"].([]any)[0])
		}},
		{"not JSON", `parsing the undo record`, func(f map[string]any) { f["confs"] = "x" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := undoFixture()
			tc.mut(f)
			b, err := json.Marshal(f)
			if err != nil {
				t.Fatal(err)
			}
			_, err = decodeUndo("/etc/cni/net.d", b)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error with %q", err, tc.want)
			}
			if len(err.Error()) > 400 {
				t.Errorf("error of %d bytes: the value is not bounded", len(err.Error()))
			}
		})
	}
	b, _ := json.Marshal(undoFixture())
	st, err := decodeUndo("/etc/cni/net.d", b)
	if err != nil || st.Confs[0].Written != "/etc/cni/net.d/10-bridge.conflist" || st.Confs[0].Original != "/etc/cni/net.d/10-bridge.conf" {
		t.Fatalf("the fixture: %v %+v", err, st)
	}
}

// An earlier agent's state naming a file outside the conf dir (another
// conf dir, or a tampered file) cannot go into the undo record: it is left
// out and reported.
func TestLegacyStateOutsideConfDir(t *testing.T) {
	rec := confRecord{Written: "/etc/other/10-x.conflist", WrittenSum: strings.Repeat("ab", 32), Original: "/etc/other/10-x.conflist", OriginalBytes: []byte(`{}`), OriginalMode: 0o644}
	ok := rec
	ok.Written, ok.Original = "/etc/cni/net.d/10-y.conflist", "/etc/cni/net.d/10-y.conflist"
	got, err := inConfDir("/etc/cni/net.d", agentState{Confs: []confRecord{rec, ok}})
	if err == nil || !strings.Contains(err.Error(), `confs[0].written: "/etc/other/10-x.conflist" is not in the CNI conf dir`) {
		t.Errorf("got %v", err)
	}
	if len(got.Confs) != 1 || got.Confs[0].Written != ok.Written {
		t.Errorf("kept %+v", got.Confs)
	}
}

func FuzzDecodeUndo(f *testing.F) {
	b, _ := json.Marshal(undoFixture())
	f.Add(b)
	f.Add([]byte(`{"version":1,"confs":[]}`))
	f.Add([]byte(`{"version":1,"confs":[{"written":"../x.conflist"}]}`))
	f.Add([]byte(`{"version":1,"confs":null}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		st, err := decodeUndo("/etc/cni/net.d", data)
		if err != nil {
			return
		}
		// What is accepted names only files in the conf dir and survives
		// a round trip unchanged.
		for _, r := range st.Confs {
			if filepath.Dir(r.Written) != "/etc/cni/net.d" || filepath.Dir(r.Original) != "/etc/cni/net.d" {
				t.Fatalf("accepted a record outside the conf dir: %+v", r)
			}
		}
		out, err := encodeUndo("/etc/cni/net.d", st)
		if err != nil {
			t.Fatal(err)
		}
		again, err := decodeUndo("/etc/cni/net.d", out)
		if err != nil || !reflect.DeepEqual(again, st) {
			t.Fatalf("round trip: %v\n%+v\n%+v", err, st, again)
		}
	})
}
