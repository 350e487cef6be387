package main

import (
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// BenchmarkPluginAdd times what kubelet waits for when our plugin runs in a
// chain: process start, config and CNI_ARGS parsing, the pod GET from the
// real local API server, the decision and the nftables apply into a fresh
// netns. The primary plugin is not part of it (its result is given as
// prevResult). Run with -benchtime=200x for the 200-pod figure; it reports
// p50 and p99 per ADD besides the mean.
//
//	go test -run '^$' -bench BenchmarkPluginAdd -benchtime=200x ./cmd/nftmesh-cni
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
		_, path := newNetns(b, "bench")
		targets[i] = target{pod: createPod(b, env.api, loadPod(b, file)), netns: path}
	}
	conf := directConf(b, "1.0.0", runDir, prevResultV4("1.0.0", "198.51.100.30/24"), map[string]any{"backend": backend})
	times := make([]time.Duration, 0, b.N)
	// Let the API server index the new pods and the kernel finish tearing
	// down the previous run's namespaces, which it does asynchronously.
	time.Sleep(time.Second)
	b.ResetTimer()
	for i := range b.N {
		id := "ctr-" + randHex(6)
		start := time.Now()
		out, stderr, err := execPlugin("ADD", targets[i].netns, id, cniArgsFor(targets[i].pod, id), conf)
		times = append(times, time.Since(start))
		if err != nil {
			b.Fatalf("ADD: %v\n%s\n%s", err, out, stderr)
		}
	}
	b.StopTimer()
	reportPercentiles(b, times)
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
