package cluster

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// ginkgoResult is what ginkgo's closing report says of one e2e.test run.
type ginkgoResult struct {
	ran, of                          int // "Ran N of M Specs"
	passed, failed, pending, skipped int
	failedSpecs                      []string // the specs of "Summarizing N Failures"
	took                             time.Duration
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

// TestReadConformanceConfig: make conformance's inputs, each bad one an
// error naming the variable and the value.
func TestReadConformanceConfig(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "e2e.test")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	images := filepath.Join(dir, "images")
	if err := os.MkdirAll(images, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(images, "a.tar"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	good := map[string]string{"NFTMESH_E2E_TEST_BIN": bin, "NFTMESH_CONFORMANCE_IMAGES": images,
		"NFTMESH_CONFORMANCE_FOCUS": "", "NFTMESH_CONFORMANCE_RUNS": "", "NFTMESH_CONFORMANCE_SIDECAR": "", "NFTMESH_CONFORMANCE_SKIP": ""}
	for _, tc := range []struct {
		name, key, value, wantErr string
	}{
		{"defaults", "", "", ""},
		{"no e2e.test", "NFTMESH_E2E_TEST_BIN", "", `NFTMESH_E2E_TEST_BIN="" is not an executable`},
		{"e2e.test not executable", "NFTMESH_E2E_TEST_BIN", filepath.Join(images, "a.tar"), "is not an executable e2e.test"},
		{"no images", "NFTMESH_CONFORMANCE_IMAGES", dir, "holds no image archive"},
		{"bad focus", "NFTMESH_CONFORMANCE_FOCUS", "[sig-network", `NFTMESH_CONFORMANCE_FOCUS="[sig-network" is not a regular expression`},
		{"huge focus", "NFTMESH_CONFORMANCE_FOCUS", strings.Repeat("a", 600), "600 bytes, more than 512"},
		{"bad skip", "NFTMESH_CONFORMANCE_SKIP", "(DNS", `NFTMESH_CONFORMANCE_SKIP="(DNS" is not a regular expression`},
		{"skip", "NFTMESH_CONFORMANCE_SKIP", `\[sig-network\] DNS`, ""},
		{"bad run", "NFTMESH_CONFORMANCE_RUNS", "noharm,everything", `"everything" is not noharm or meshed`},
		{"no run", "NFTMESH_CONFORMANCE_RUNS", " , ", "names no run"},
		{"one run", "NFTMESH_CONFORMANCE_RUNS", "meshed", ""},
		{"classic sidecar", "NFTMESH_CONFORMANCE_SIDECAR", "container", ""},
		{"bad sidecar", "NFTMESH_CONFORMANCE_SIDECAR", "ambient", `NFTMESH_CONFORMANCE_SIDECAR="ambient" is not native or container`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range good {
				t.Setenv(k, v)
			}
			if tc.key != "" {
				t.Setenv(tc.key, tc.value)
			}
			cfg, err := readConformanceConfig()
			if tc.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				if cfg.focus == "" || len(cfg.runs) == 0 || len(cfg.images) != 1 {
					t.Errorf("config %+v", cfg)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("error %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}
