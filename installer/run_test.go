package installer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
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
	turn := loopState{dirty: partAll, backoff: installBackoff()}
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
