package pluginlog

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/rs/zerolog"

	"github.com/nftmesh/nftmesh/installer/metrics"
	"github.com/nftmesh/nftmesh/podinfo/agentsock"
	"github.com/nftmesh/nftmesh/testkit/syncbuf"
)

type lockedBuf struct{ syncbuf.Buffer }

// lines decodes every output line; a line that is not a JSON object fails
// the test (the agent's log must stay machine-readable).
func (l *lockedBuf) lines(t *testing.T) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, s := range strings.Split(strings.TrimSpace(l.String()), "\n") {
		if s == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(s), &m); err != nil {
			t.Fatalf("agent log line is not JSON: %v\n%s", err, s)
		}
		out = append(out, m)
	}
	return out
}

func appendFile(t *testing.T, path, s string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o640)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(s); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// counted is f with its decisions counted in m, as the agent wires it.
func counted(f *Follower, m *metrics.Metrics) *Follower {
	f.OnDecision = m.Decided
	return f
}

func pluginLine(level, msg string, extra string) string {
	return `{"level":"` + level + `","plugin":"nftmesh-cni","command":"ADD"` + extra + `,"time":"2026-01-02T03:04:05.678Z","message":"` + msg + `"}` + "\n"
}

func messages(ls []map[string]any) []string {
	var out []string
	for _, l := range ls {
		m, _ := l["message"].(string)
		out = append(out, m)
	}
	return out
}

// Drain by hand: appended lines come out once, in order, as the agent's
// JSON with the plugin's time/level/message and fields, and
// "component":"cni-plugin"; what was in the file before the follower
// started is not repeated; partial lines wait for their newline; debug
// lines are dropped at info; a non-JSON line is kept as a message.
func TestPluginLogDrain(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, FileName)
	appendFile(t, path, pluginLine("info", "old", ""))
	var out lockedBuf
	m := metrics.New()
	f := counted(New(dir, &out, zerolog.InfoLevel), m)
	f.openAt(true)
	defer f.close()

	appendFile(t, path, pluginLine("info", "ADD capture", `,"pod":"web-1","decision":"capture","rules":23`))
	appendFile(t, path, pluginLine("debug", "backend chosen", ""))
	appendFile(t, path, pluginLine("error", "ADD failed", `,"decision":"error","component":"x"`))
	appendFile(t, path, `{"level":"warn","message":"half`)
	f.Drain()
	ls := out.lines(t)
	if got := messages(ls); strings.Join(got, "|") != "ADD capture|ADD failed" {
		t.Fatalf("messages %q", got)
	}
	first := ls[0]
	for k, want := range map[string]any{"level": "info", "time": "2026-01-02T03:04:05.678Z", "component": Component, "pod": "web-1", "plugin": "nftmesh-cni", "rules": float64(23)} {
		if first[k] != want {
			t.Errorf("%s = %v, want %v (line %v)", k, first[k], want, first)
		}
	}
	if ls[1]["level"] != "error" || ls[1]["plugin_component"] != "x" || ls[1]["component"] != Component {
		t.Errorf("error line %v", ls[1])
	}
	if n := strings.Count(out.String(), `"component"`); n != 2 {
		t.Errorf("%d component keys in 2 lines:\n%s", n, out.String())
	}
	// Field order is kept: level, time, component, then the plugin's.
	if raw := strings.SplitN(out.String(), "\n", 2)[0]; !strings.HasPrefix(raw, `{"level":"info","time":"2026-01-02T03:04:05.678Z","component":"cni-plugin","plugin":"nftmesh-cni","command":"ADD","pod":"web-1"`) {
		t.Errorf("first line layout: %s", raw)
	}

	appendFile(t, path, ` line"}`+"\nnot json at all\n")
	f.Drain()
	ls = out.lines(t)
	if len(ls) != 4 || ls[2]["message"] != "half line" || ls[2]["level"] != "warn" || ls[3]["message"] != "not json at all" || ls[3]["unparsed"] != true {
		t.Fatalf("after completing the partial line: %v", ls)
	}
	if got := testutil.ToFloat64(m.PluginEvents.WithLabelValues("ADD", "capture")); got != 1 {
		t.Errorf("plugin ADD capture events %v, want 1", got)
	}
	if got := testutil.ToFloat64(m.PluginEvents.WithLabelValues("ADD", "error")); got != 1 {
		t.Errorf("plugin ADD error events %v, want 1", got)
	}
	f.Drain()
	if n := len(out.lines(t)); n != 4 {
		t.Errorf("a drain without new data emitted %d lines", n-4)
	}
}

// Rotation as the plugin does it (rename to .1, new file), with a plugin
// run still appending to the old file after the rename, and truncation in
// place: nothing is lost or repeated.
func TestPluginLogRotationAndTruncation(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, FileName)
	var out lockedBuf
	f := New(dir, &out, zerolog.DebugLevel)
	f.openAt(true) // no file yet
	defer f.close()

	appendFile(t, path, pluginLine("info", "one", ""))
	f.Drain()
	old, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path, path+".1"); err != nil {
		t.Fatal(err)
	}
	if _, err := old.WriteString(pluginLine("info", "two (old file, after the rename)", "")); err != nil {
		t.Fatal(err)
	}
	old.Close()
	f.Drain() // the name is gone: the old file is still read
	appendFile(t, path, pluginLine("info", "three (new file)", ""))
	f.Drain()
	appendFile(t, path, pluginLine("info", "four", ""))
	if err := os.Truncate(path, 0); err != nil {
		t.Fatal(err)
	}
	appendFile(t, path, pluginLine("info", "five", ""))
	f.Drain()
	want := "one|two (old file, after the rename)|three (new file)|five"
	if got := strings.Join(messages(out.lines(t)), "|"); got != want {
		t.Fatalf("messages\n got %s\nwant %s", got, want)
	}
}

// Run with real fsnotify events: lines appear in the agent's output without
// any explicit drain, across a rotation.
func TestPluginLogFollowerRun(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run") // created by Run
	path := filepath.Join(dir, FileName)
	var out lockedBuf
	f := New(dir, &out, zerolog.InfoLevel)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	waitFor := func(what string, n int) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for len(out.lines(t)) < n {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s; output:\n%s", what, out.String())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := os.Stat(dir); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("run dir never created")
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond) // the watch is set right after the mkdir
	for i := 0; i < 20; i++ {
		appendFile(t, path, pluginLine("info", "line", ""))
	}
	waitFor("20 lines", 20)
	if err := os.Rename(path, path+".1"); err != nil {
		t.Fatal(err)
	}
	appendFile(t, path, pluginLine("warn", "after rotation", ""))
	waitFor("the line after rotation", 21)
	ls := out.lines(t)
	if len(ls) != 21 || ls[20]["message"] != "after rotation" || ls[20]["component"] != Component {
		t.Fatalf("got %d lines, last %v", len(ls), ls[len(ls)-1])
	}
}

func FuzzPluginLogLine(f *testing.F) {
	f.Add([]byte(pluginLine("info", "ADD capture", `,"decision":"capture"`)))
	f.Add([]byte(`{"level":7,"time":{},"message":["x"]}`))
	f.Add([]byte(`{"a":1}{"b":2}`))
	f.Add([]byte("\x00\xff{"))
	f.Add([]byte(`{"level":"info","command":"ADD","decision":"skip","duration_ms":-1,"lookup_ms":"x","record_only":true,"message":"m"}`))
	f.Add([]byte(`{"command":"add","decision":"zzz","duration_ms":1e308,"lookup_ms":1e-9,"record_only":"yes"}`))
	// Found by make fuzz: a number beyond float64, passed through as written.
	f.Add([]byte(`{"command":"add","decision":"zzz","duration_ms":9e308,"lookup_ms":1e-9,"record_only":"yes"}`))
	m := metrics.New()
	f.Fuzz(func(t *testing.T, b []byte) {
		var out bytes.Buffer
		p := counted(New("unused", &out, zerolog.TraceLevel), m)
		p.consume(append(b, '\n'))
		for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
			if l == "" {
				continue
			}
			// JSON as RFC 8259 has it: a number beyond float64 (a
			// plugin field such as 9e308, passed through as written) is
			// still a JSON number.
			var m map[string]any
			d := json.NewDecoder(strings.NewReader(l))
			d.UseNumber()
			if err := d.Decode(&m); err != nil || d.More() {
				t.Fatalf("output is not one JSON object: %v\n%q from %q", err, l, b)
			}
			if m["component"] != Component {
				t.Fatalf("component %v in %q", m["component"], l)
			}
		}
	})
}

// A record_only line (written below the plugin's log level) is counted and
// timed but not printed; durations feed the histograms in seconds; label
// values outside the plugin's vocabulary are folded into "other".
func TestPluginRecordLines(t *testing.T) {
	var out lockedBuf
	m := metrics.New()
	f := counted(New(t.TempDir(), &out, zerolog.InfoLevel), m)
	f.consume([]byte(`{"level":"info","command":"ADD","decision":"skip","duration_ms":2.5,"lookup_ms":1.5,"record_only":true,"message":"ADD skip"}` + "\n" +
		`{"level":"info","command":"ADD","decision":"skip","duration_ms":4,"message":"ADD skip"}` + "\n" +
		`{"level":"info","command":"bogus","decision":"made-up","message":"x"}` + "\n"))
	if got := messages(out.lines(t)); strings.Join(got, "|") != "ADD skip|x" {
		t.Errorf("printed %q, want the plain line and the bogus one only", got)
	}
	if got := testutil.ToFloat64(m.PluginEvents.WithLabelValues("ADD", "skip")); got != 2 {
		t.Errorf("ADD skip events %v, want 2", got)
	}
	if got := testutil.ToFloat64(m.PluginEvents.WithLabelValues("OTHER", "other")); got != 1 {
		t.Errorf("unknown labels not folded: %v", got)
	}
	if n := testutil.CollectAndCount(m.LookupDuration); n != 1 {
		t.Errorf("lookup histogram series %d, want 1 (only the line with lookup_ms)", n)
	}
	var sum float64
	mfs, _ := m.Registry.Gather()
	for _, mf := range mfs {
		if mf.GetName() == "nftmesh_cni_add_duration_seconds" {
			for _, mm := range mf.GetMetric() {
				sum += mm.GetHistogram().GetSampleSum()
			}
		}
	}
	if sum < 0.0064 || sum > 0.0066 {
		t.Errorf("ADD duration sum %v s, want 0.0065 (2.5 ms + 4 ms)", sum)
	}
}

// TestPluginLookupPaths: each decision line's lookup path (the agent's
// socket or the plugin's own API read) is counted per command; a value
// outside the vocabulary is folded into "other"; a line without one (a
// skip before any lookup) counts nothing.
func TestPluginLookupPaths(t *testing.T) {
	var out lockedBuf
	m := metrics.New()
	f := counted(New(t.TempDir(), &out, zerolog.InfoLevel), m)
	f.consume([]byte(`{"level":"info","command":"ADD","decision":"capture","lookup":"agent","lookup_ms":0.3,"message":"ADD capture"}` + "\n" +
		`{"level":"info","command":"ADD","decision":"capture","lookup":"agent","lookup_ms":0.2,"record_only":true,"message":"ADD capture"}` + "\n" +
		`{"level":"info","command":"ADD","decision":"skip","lookup":"api","lookup_ms":3,"agent_miss":"no agent on the socket","message":"ADD skip"}` + "\n" +
		`{"level":"info","command":"CHECK","decision":"capture","lookup":"carrier-pigeon","message":"CHECK ok"}` + "\n" +
		`{"level":"info","command":"ADD","decision":"skip","reason":"namespace excluded","message":"ADD skip"}` + "\n"))
	for _, tc := range []struct {
		command, path string
		want          float64
	}{{"ADD", "agent", 2}, {"ADD", "api", 1}, {"CHECK", "other", 1}} {
		if got := testutil.ToFloat64(m.Lookups.WithLabelValues(tc.command, tc.path)); got != tc.want {
			t.Errorf("lookups{%s,%s} = %v, want %v", tc.command, tc.path, got, tc.want)
		}
	}
	if n := testutil.CollectAndCount(m.Lookups); n != 3 {
		t.Errorf("%d lookup series, want 3", n)
	}
}

// ADD runs are timed by path (ran_by: agent or standalone; anything else,
// or a line without it, is not counted there), and every decision line,
// record_only ones included, reaches OnDecision with its pod and error.
func TestPluginAddByPathAndDecisions(t *testing.T) {
	var out lockedBuf
	m := metrics.New()
	f := New(t.TempDir(), &out, zerolog.InfoLevel)
	var got []agentsock.Decision
	f.OnDecision = func(d agentsock.Decision) { m.Decided(d); got = append(got, d) }
	f.consume([]byte(`{"level":"info","command":"ADD","decision":"capture","ran_by":"agent","duration_ms":3,"pod":"web-1","namespace":"shop","message":"ADD capture"}` + "\n" +
		`{"level":"info","command":"ADD","decision":"capture","ran_by":"agent","duration_ms":5,"record_only":true,"pod":"web-2","namespace":"shop","message":"ADD capture"}` + "\n" +
		`{"level":"error","command":"ADD","decision":"error","ran_by":"standalone","duration_ms":40,"pod":"web-3","namespace":"shop","error":"applying capture: EPERM","message":"ADD failed"}` + "\n" +
		`{"level":"info","command":"ADD","decision":"skip","ran_by":"somebody","duration_ms":1,"message":"ADD skip"}` + "\n" +
		`{"level":"info","command":"DEL","decision":"remove","ran_by":"agent","duration_ms":1,"message":"DEL remove"}` + "\n" +
		`{"level":"info","message":"no decision here"}` + "\n"))
	for path, want := range map[string]struct {
		n   uint64
		sum float64
	}{"agent": {2, 0.008}, "standalone": {1, 0.04}} {
		var pm dto.Metric
		if err := m.AddByPath.WithLabelValues(path).(prometheus.Histogram).Write(&pm); err != nil {
			t.Fatal(err)
		}
		h := pm.GetHistogram()
		if h.GetSampleCount() != want.n || math.Abs(h.GetSampleSum()-want.sum) > 1e-9 {
			t.Errorf("path %s: %d samples, sum %v; want %d, %v", path, h.GetSampleCount(), h.GetSampleSum(), want.n, want.sum)
		}
	}
	if n := testutil.CollectAndCount(m.AddByPath); n != 2 {
		t.Errorf("%d path series, want 2 (agent, standalone)", n)
	}
	ms := time.Millisecond
	want := []agentsock.Decision{
		{Command: "ADD", Decision: "capture", Namespace: "shop", Pod: "web-1", RanBy: "agent", Took: 3 * ms, LookupTook: -1},
		{Command: "ADD", Decision: "capture", Namespace: "shop", Pod: "web-2", RanBy: "agent", Took: 5 * ms, LookupTook: -1},
		{Command: "ADD", Decision: "error", Namespace: "shop", Pod: "web-3", RanBy: "standalone", Error: "applying capture: EPERM", Took: 40 * ms, LookupTook: -1},
		{Command: "ADD", Decision: "skip", RanBy: "somebody", Took: ms, LookupTook: -1},
		{Command: "DEL", Decision: "remove", RanBy: "agent", Took: ms, LookupTook: -1},
	}
	if !slices.Equal(got, want) {
		t.Errorf("decisions\n got %+v\nwant %+v", got, want)
	}
}

// TestPluginLogLinkRefused: a symlink or a hard link at the plugin's log
// name, to a file the test owns elsewhere holding plugin-like lines, or a
// FIFO there, is not followed: none of its lines reach the agent's log or
// its metrics, the refusal is reported once, the target is untouched, and
// once a real log file takes the name its lines are followed again.
// Before, the follower opened the link's target and re-emitted it as the
// plugin's lines (any root-readable file would do), and blocked on the
// FIFO.
func TestPluginLogLinkRefused(t *testing.T) {
	for _, tc := range []struct {
		name  string
		plant func(t *testing.T, path, target string) error
	}{
		{"symlink", func(_ *testing.T, path, target string) error { return os.Symlink(target, path) }},
		{"hard link", func(_ *testing.T, path, target string) error { return os.Link(target, path) }},
		{"FIFO", func(_ *testing.T, path, _ string) error { return syscall.Mkfifo(path, 0o600) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, FileName)
			target := filepath.Join(t.TempDir(), "elsewhere")
			secret := pluginLine("info", "ADD capture", `,"pod":"secret-from-elsewhere","decision":"capture"`)
			if err := os.WriteFile(target, []byte(secret), 0o600); err != nil {
				t.Fatal(err)
			}
			var out lockedBuf
			m := metrics.New()
			f := counted(New(dir, &out, zerolog.InfoLevel), m)
			f.openAt(true) // no file yet
			if err := tc.plant(t, path, target); err != nil {
				t.Fatal(err)
			}
			done := make(chan struct{})
			go func() {
				defer close(done)
				f.Drain()
				appendFile(t, target, pluginLine("error", "ADD failed", `,"pod":"secret-2","decision":"error"`))
				f.Drain()
			}()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatalf("the follower blocked on a %s", tc.name) // holding its mutex: no close
			}
			defer f.close()
			if s := out.String(); strings.Contains(s, "secret") || strings.Count(s, "not following the plugin log") != 1 || !strings.Contains(s, "it is a "+strings.Fields(tc.name)[0]) {
				t.Fatalf("agent log with a %s at the plugin log:\n%s", tc.name, s)
			}
			if got := testutil.ToFloat64(m.PluginEvents.WithLabelValues("ADD", "capture")); got != 0 {
				t.Errorf("plugin ADD capture events %v, want 0", got)
			}
			if data, err := os.ReadFile(target); err != nil || !strings.HasPrefix(string(data), secret) {
				t.Errorf("target: %q, %v", data, err)
			}
			// The plugin's own file in its place is followed from its start.
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
			appendFile(t, path, pluginLine("info", "ADD skip", `,"pod":"web-1","decision":"skip"`))
			f.Drain()
			if got := messages(out.lines(t)); got[len(got)-1] != "ADD skip" {
				t.Errorf("after a real log file came: %q", got)
			}
		})
	}
}
