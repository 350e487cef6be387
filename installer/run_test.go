package installer

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/nftmesh/nftmesh/installer/metrics"
)

// TestReportBackoff: a failing install is retried after 1 s, doubling to a
// 30 s cap; a success starts the next failure at 1 s again, and a config
// still being written (errChanged) does not stretch the wait. The waits are
// read from the retry_in field of the agent's log lines.
func TestReportBackoff(t *testing.T) {
	h := newHost(t)
	var logs bytes.Buffer
	in, err := New(h.config(t), zerolog.New(&logs), nil)
	if err != nil {
		t.Fatal(err)
	}
	turn := loopState{dirty: partAll, backoff: installBackoff}
	failed := errors.New("disk full")
	var got []string
	fail := func(n int) {
		for range n {
			logs.Reset()
			if in.report(failed, metrics.ResultCopyBinaries, false, &turn) == nil {
				t.Fatal("a failed install set no retry")
			}
			var line struct {
				RetryIn float64 `json:"retry_in"` // zerolog writes durations in ms
			}
			if err := json.Unmarshal(logs.Bytes(), &line); err != nil {
				t.Fatalf("log line %q: %v", logs.String(), err)
			}
			got = append(got, (time.Duration(line.RetryIn) * time.Millisecond).String())
		}
	}
	fail(7)
	in.report(fmt.Errorf("%w: burst", errChanged), metrics.ResultCNIConfig, false, &turn)
	fail(1)
	in.report(nil, metrics.ResultSuccess, true, &turn)
	fail(2)
	want := "1s 2s 4s 8s 16s 30s 30s 30s 1s 2s"
	if s := strings.Join(got, " "); s != want {
		t.Errorf("retry waits %s, want %s", s, want)
	}
}

func TestHealthReadinessMetricsOverHTTP(t *testing.T) {
	h := newHost(t)
	cfg := h.config(t)
	in, err := New(cfg, zerolog.New(io.Discard), nil)
	if err != nil {
		t.Fatal(err)
	}
	hs, err := metrics.Serve("127.0.0.1:0", metrics.HealthHandler(in.Ready))
	if err != nil {
		t.Fatal(err)
	}
	ms, err := metrics.Serve("127.0.0.1:0", in.m.Handler())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = hs.Shutdown(context.Background()); _ = ms.Shutdown(context.Background()) })
	get := func(s *metrics.Server, path string) (int, string) {
		t.Helper()
		resp, err := http.Get("http://" + s.Addr.String() + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if c, _ := get(hs, "/healthz"); c != 200 {
		t.Errorf("/healthz %d", c)
	}
	if c, body := get(hs, "/readyz"); c != 503 {
		t.Errorf("/readyz before install: %d %s", c, body)
	}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- in.Run(ctx) }()
	a := &agent{in: in, cancel: cancel, done: done}
	t.Cleanup(a.stop)
	a.waitFor(t, "first reconcile", func() bool { return errors.Is(in.Ready(), errNoPrimary) })
	if c, body := get(hs, "/readyz"); c != 503 || !strings.Contains(body, "no primary") {
		t.Errorf("/readyz without a primary: %d %s", c, body)
	}
	p, orig := h.put(t, "10-calico.conflist", 0o644)
	a.waitReady(t)
	if c, body := get(hs, "/readyz"); c != 200 {
		t.Errorf("/readyz when installed: %d %s", c, body)
	}
	_, body := get(ms, "/metrics")
	for _, want := range []string{"nftmesh_install_ready 1", `nftmesh_installs_total{result="success"} 1`, "nftmesh_reinserts_total 0", "nftmesh_fights_total 0", "go_goroutines"} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	// The primary drops our entry: readiness follows the live file at once.
	a.stop()
	_ = os.WriteFile(p, orig, 0o644)
	if c, _ := get(hs, "/readyz"); c != 503 {
		t.Errorf("/readyz with our entry gone: %d", c)
	}
}
