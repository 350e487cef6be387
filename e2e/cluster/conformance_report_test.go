package cluster

import (
	"fmt"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// ginkgoResult is what ginkgo's closing report says of one e2e.test run.
type ginkgoResult struct {
	ran, of                         int // "Ran N of M Specs"
	passed, failed, pending, skipped int
	failedSpecs                         []string // the specs of "Summarizing N Failures"
	took                            time.Duration
}

var (
	ginkgoRan    = regexp.MustCompile(`(?m)^Ran (\d+) of (\d+) Specs? in `)
	ginkgoCounts = regexp.MustCompile(`(?m)^(?:SUCCESS|FAIL)! .*?-- (\d+) Passed \| (\d+) Failed \| (\d+) Pending \| (\d+) Skipped`)
	ginkgoFailed = regexp.MustCompile(`(?m)^\s*\[(FAIL|TIMEDOUT|PANICKED|INTERRUPTED)\] (.+)$`)
)

// parseGinkgo reads ginkgo's closing report from a run's output; fields it
// does not find stay zero.
func parseGinkgo(out string) ginkgoResult {
	var r ginkgoResult
	if m := ginkgoRan.FindAllStringSubmatch(out, -1); len(m) > 0 {
		last := m[len(m)-1]
		r.ran, _ = strconv.Atoi(last[1])
		r.of, _ = strconv.Atoi(last[2])
	}
	if m := ginkgoCounts.FindAllStringSubmatch(out, -1); len(m) > 0 {
		last := m[len(m)-1]
		r.passed, _ = strconv.Atoi(last[1])
		r.failed, _ = strconv.Atoi(last[2])
		r.pending, _ = strconv.Atoi(last[3])
		r.skipped, _ = strconv.Atoi(last[4])
	}
	if i := strings.LastIndex(out, "Summarizing "); i >= 0 {
		for _, m := range ginkgoFailed.FindAllStringSubmatch(out[i:], -1) {
			r.failedSpecs = append(r.failedSpecs, "["+m[1]+"] "+strings.TrimSpace(m[2]))
		}
	}
	return r
}

// String is the run's line in the report: of the total specs the focus
// selects, how many ran, passed and failed, and how many the specs
// skipped themselves.
func (r ginkgoResult) String(total int) string {
	return fmt.Sprintf("%d specs selected: ran %d, passed %d, failed %d, skipped %d, in %s",
		total, r.ran, r.passed, r.failed, total-r.ran, r.took.Round(time.Second))
}

func TestParseGinkgo(t *testing.T) {
	for _, tc := range []struct {
		name, out string
		want      ginkgoResult
	}{
		{"empty", "", ginkgoResult{}},
		{"garbage", "Ran x of y Specs\nSUCCESS! -- a Passed", ginkgoResult{}},
		{"success", "...\nRan 1 of 7355 Specs in 40.128 seconds\nSUCCESS! -- 1 Passed | 0 Failed | 0 Pending | 7354 Skipped\nPASS\n",
			ginkgoResult{ran: 1, of: 7355, passed: 1, skipped: 7354}},
		{"dry run", "Ran 47 of 7355 Specs in 0.041 seconds\nSUCCESS! -- 0 Passed | 0 Failed | 0 Pending | 7308 Skipped\n",
			ginkgoResult{ran: 47, of: 7355, skipped: 7308}},
		{"failures", `  [FAIL] [sig-network] Services [It] early, not in the summary
Summarizing 2 Failures:
  [FAIL] [sig-network] Services [It] should serve a basic endpoint from pods  [Conformance]
  k8s.io/kubernetes/test/e2e/network/service.go:786
  [TIMEDOUT] [sig-network] DNS [It] should provide DNS for services  [Conformance]
  k8s.io/kubernetes/test/e2e/network/dns.go:180

Ran 45 of 7355 Specs in 1800.5 seconds
FAIL! -- 43 Passed | 2 Failed | 0 Pending | 7310 Skipped
`, ginkgoResult{ran: 45, of: 7355, passed: 43, failed: 2, skipped: 7310, failedSpecs: []string{
			"[FAIL] [sig-network] Services [It] should serve a basic endpoint from pods  [Conformance]",
			"[TIMEDOUT] [sig-network] DNS [It] should provide DNS for services  [Conformance]"}}},
		{"interrupted", "Ran 3 of 7355 Specs in 10 seconds\nFAIL! - Interrupted by Other Ginkgo Process -- 2 Passed | 1 Failed | 0 Pending | 7352 Skipped\n",
			ginkgoResult{ran: 3, of: 7355, passed: 2, failed: 1, skipped: 7352}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := parseGinkgo(tc.out); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("parseGinkgo = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func FuzzParseGinkgo(f *testing.F) {
	f.Add("Ran 1 of 2 Specs in 1 seconds\nSUCCESS! -- 1 Passed | 0 Failed | 0 Pending | 1 Skipped\n")
	f.Add("Summarizing 1 Failure:\n  [FAIL] x\n")
	f.Fuzz(func(t *testing.T, out string) {
		r := parseGinkgo(out)
		if r.ran < 0 || r.failed < 0 || len(r.failedSpecs) > strings.Count(out, "[") {
			t.Errorf("parseGinkgo(%q) = %+v", out, r)
		}
	})
}
