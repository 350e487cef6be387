package zklog

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"github.com/rs/zerolog"
	"k8s.io/klog/v2"
)

// captureStderr runs fn with os.Stderr redirected and returns what was
// written there.
func captureStderr(t *testing.T, fn func()) string {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	old := os.Stderr
	os.Stderr = w
	done := make(chan string)
	go func() { b, _ := io.ReadAll(r); done <- string(b) }()
	fn()
	os.Stderr = old
	w.Close()
	return <-done
}

// TestRoute: klog entries of every kind client-go emits come out as JSON
// zerolog lines with their fields, nothing reaches stderr, and klog's
// verbosity still filters.
func TestRoute(t *testing.T) {
	var buf bytes.Buffer
	Route(zerolog.New(&buf).Level(zerolog.InfoLevel).With().Str("component", "test").Logger())
	t.Cleanup(klog.ClearLogger)
	stderr := captureStderr(t, func() {
		klog.ErrorS(errors.New("unexpected EOF"), "Unexpected error when reading response body", "url", "https://api/pods")
		klog.Errorf("plain %s", "errorf")
		klog.Warning("a warning")
		klog.InfoS("structured info", "count", 3)
		klog.V(4).Info("too detailed")
		klog.Background().WithName("reflector").WithValues("type", "Pod").Info("contextual")
		klog.Flush()
	})
	if stderr != "" {
		t.Errorf("klog still wrote to stderr: %q", stderr)
	}
	var lines []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("not a JSON line: %q", l)
		}
		if m["component"] != "test" || !strings.HasPrefix(m["logger"].(string), "client-go") {
			t.Errorf("line without the logger's fields: %q", l)
		}
		lines = append(lines, m)
	}
	want := []map[string]any{
		{"level": "error", "message": "Unexpected error when reading response body", "error": "unexpected EOF", "url": "https://api/pods"},
		{"level": "error", "message": "plain errorf"},
		{"level": "info", "message": "a warning"},
		{"level": "info", "message": "structured info", "count": float64(3)},
		{"level": "info", "message": "contextual", "type": "Pod", "logger": "client-go/reflector"},
	}
	if len(lines) != len(want) {
		t.Fatalf("%d lines, want %d:\n%s", len(lines), len(want), buf.String())
	}
	for i, w := range want {
		for k, v := range w {
			if lines[i][k] != v {
				t.Errorf("line %d: %s = %v, want %v", i, k, lines[i][k], v)
			}
		}
	}
}

// TestRouteLevels: what reaches the zerolog logger follows its level;
// klog's own verbosity (0) still drops V(1) and up before that, and the
// sink itself maps logr V(1) to debug.
func TestRouteLevels(t *testing.T) {
	t.Cleanup(klog.ClearLogger)
	for _, tc := range []struct {
		level zerolog.Level
		want  int
	}{{zerolog.DebugLevel, 2}, {zerolog.InfoLevel, 2}, {zerolog.ErrorLevel, 1}, {zerolog.Disabled, 0}} {
		var buf bytes.Buffer
		Route(zerolog.New(&buf).Level(tc.level))
		klog.Background().Info("v0")
		klog.Background().V(1).Info("v1: klog drops it")
		klog.Error("e")
		if got := strings.Count(buf.String(), "\n"); got != tc.want {
			t.Errorf("level %v: %d lines, want %d: %s", tc.level, got, tc.want, buf.String())
		}
	}
	var buf bytes.Buffer
	l := logr.New(&sink{zl: zerolog.New(&buf).Level(zerolog.DebugLevel), name: "client-go"})
	l.V(1).Info("detail")
	if !strings.Contains(buf.String(), `"level":"debug"`) {
		t.Errorf("V(1) at a debug logger: %q", buf.String())
	}
}
