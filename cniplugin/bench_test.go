package cniplugin

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/nftmesh/nftmesh/testkit/nstest"
)

// BenchmarkPluginAdd times what kubelet waits for when our plugin runs in a
// chain: process start, config and CNI_ARGS parsing, the pod GET from the
// real local API server, the decision and the nftables apply into a fresh
// netns. The primary plugin is not part of it (its result is given as
// prevResult). Run with -benchtime=200x for the 200-pod figure; it reports
// p50 and p99 per ADD besides the mean.
//
//	go test -run '^$' -bench BenchmarkPluginAdd -benchtime=200x ./cniplugin
func BenchmarkPluginAdd(b *testing.B) {
	b.Run("mesh", func(b *testing.B) { benchAdd(b, "injected.yaml", "nftables") })
	b.Run("mesh-auto", func(b *testing.B) { benchAdd(b, "injected.yaml", "auto") })
	b.Run("skip", func(b *testing.B) { benchAdd(b, "no-sidecar.yaml", "nftables") })
	// The floor: starting the binary and answering VERSION.
	b.Run("process-start", func(b *testing.B) {
		needEnv(b)
		times := make([]time.Duration, 0, b.N)
		b.ResetTimer()
		for range b.N {
			start := time.Now()
			if out, _, err := execPlugin("VERSION", "", "", "", nil); err != nil {
				b.Fatalf("VERSION: %v %s", err, out)
			}
			times = append(times, time.Since(start))
		}
		reportPercentiles(b, times)
	})
}

func benchAdd(b *testing.B, file, backend string) {
	needEnv(b)
	runDir := agentRunDir(b, env.token)
	type target struct {
		pod   *corev1.Pod
		netns string
	}
	targets := make([]target, b.N)
	for i := range targets {
		_, path := nstest.New(b, "cni-bench-")
		targets[i] = target{pod: createPod(b, env.api, loadPod(b, file)), netns: path}
	}
	conf := directConf(b, "1.0.0", runDir, prevResultV4("1.0.0", "198.51.100.30/24"), map[string]any{"backend": backend})
	times := make([]time.Duration, 0, b.N)
	// Let the API server index the new pods and the kernel finish tearing
	// down the previous run's namespaces, which it does asynchronously.
	time.Sleep(time.Second)
	b.ResetTimer()
	for i := range b.N {
		id := "ctr-" + nstest.RandHex(6)
		start := time.Now()
		out, stderr, err := execPlugin("ADD", targets[i].netns, id, cniArgsFor(targets[i].pod, id), conf)
		times = append(times, time.Since(start))
		if err != nil {
			b.Fatalf("ADD: %v\n%s\n%s", err, out, stderr)
		}
	}
	b.StopTimer()
	reportPercentiles(b, times)
	reportLookup(b, filepath.Join(runDir, LogFileName))
}

// reportLookup adds the median in-process time of the pod lookup
// (kubeconfig, client, TLS handshake, GET) and of the whole verb, from the plugin's
// own decision lines: what remains of an ADD is process start and exit.
func reportLookup(b *testing.B, logFile string) {
	data, err := os.ReadFile(logFile)
	if err != nil {
		b.Fatalf("plugin log: %v", err)
	}
	var lookup, total []float64
	for _, line := range strings.Split(string(data), "\n") {
		var e struct {
			Decision string  `json:"decision"`
			Lookup   float64 `json:"lookup_ms"`
			Duration float64 `json:"duration_ms"`
		}
		if json.Unmarshal([]byte(line), &e) == nil && e.Decision != "" {
			lookup = append(lookup, e.Lookup)
			total = append(total, e.Duration)
		}
	}
	if len(lookup) == 0 {
		b.Fatalf("no decision lines in %s", logFile)
	}
	med := func(v []float64) float64 { slices.Sort(v); return v[len(v)/2] }
	b.ReportMetric(med(lookup), "lookup-p50-ms")
	b.ReportMetric(med(total), "inproc-p50-ms")
}

func reportPercentiles(b *testing.B, times []time.Duration) {
	if len(times) == 0 {
		return
	}
	s := slices.Clone(times)
	slices.Sort(s)
	pct := func(p float64) float64 {
		i := int(p * float64(len(s)-1))
		return float64(s[i].Microseconds()) / 1000
	}
	b.ReportMetric(pct(0.50), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
	b.ReportMetric(float64(s[len(s)-1].Microseconds())/1000, "max-ms")
}
