package bench

import (
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// Every benchmark here runs nftmesh-cni and Istio's istio-cni in the same
// loop, alternating which goes first each round, and reports each one's
// figures and our ratio to Istio's (below 1 is faster or smaller). A round's
// network namespaces are made before its clock starts; ns/op mixes both
// contenders and means nothing (reported as 0).
//
//	go test -run '^$' -bench . -benchtime 30x ./e2e/bench/

// BenchmarkVersion times a bare CNI VERSION call, the floor of every
// invocation: process start, runtime and package initialisation, one JSON
// answer. Peak RSS is measured in separate runs through a small spawner
// (see spawnSource), alternating too.
func BenchmarkVersion(b *testing.B) {
	needEnv(b)
	ps := []plugin{{name: "nftmesh", bin: env.ours}, {name: "istio", bin: env.istioCNI}}
	stdin := []byte(`{"cniVersion":"1.0.0"}`)
	walls := map[string][]time.Duration{}
	rss := map[string][]time.Duration{} // KiB, kept as durations to share pct
	for i := 0; b.Loop(); i++ {
		for j := range ps {
			p := ps[(i+j)%len(ps)]
			r := execCNI(p.bin, "VERSION", "", "", "", stdin)
			if r.err != nil {
				b.Fatalf("%s VERSION: %v %s %s", p.name, r.err, r.stdout, r.stderr)
			}
			walls[p.name] = append(walls[p.name], r.wall)
			b.StopTimer()
			rss[p.name] = append(rss[p.name], time.Duration(peakRSS(b, p.bin, stdin))*time.Microsecond)
			b.StartTimer()
		}
	}
	b.StopTimer()
	ow, iw := pct(walls["nftmesh"], .5), pct(walls["istio"], .5)
	// pct gives KiB/1000 here; back to MiB.
	orss, irss := pct(rss["nftmesh"], .5)*1000/1024, pct(rss["istio"], .5)*1000/1024
	b.ReportMetric(ow, "nftmesh-p50-ms")
	b.ReportMetric(iw, "istio-p50-ms")
	b.ReportMetric(ow/iw, "wall-ratio")
	b.ReportMetric(orss, "nftmesh-rss-MiB")
	b.ReportMetric(irss, "istio-rss-MiB")
	b.ReportMetric(orss/irss, "rss-ratio")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkPluginAlone is one ADD of the injected dual-stack pod, the
// plugin on its own: no agent to ask, so each plugin GETs the pod from the
// same fake API server (plain HTTP on 127.0.0.1, answering from memory) and
// installs its capture (ours over netlink; Istio's through the iptables-nft
// binaries it execs, both ending in nf_tables). Every ADD goes into a fresh
// netns and is checked afterwards with nft. The API server counts requests.
func BenchmarkPluginAlone(b *testing.B) {
	needEnv(b)
	api := newFakeAPI(b)
	ps := []plugin{oursPlugin(b, api.url), istioPlugin(b, api.url)}
	walls := map[string][]time.Duration{}
	reqs := map[string]int64{}
	for i := 0; b.Loop(); i++ {
		for j := range ps {
			p := ps[(i+j)%len(ps)]
			b.StopTimer()
			name, path := newPodNetns(b)
			pod := benchPod(b)
			api.add(b, pod)
			before := api.requests.Load()
			b.StartTimer()
			r := addPod(b, p, pod, path)
			b.StopTimer()
			if b.Failed() {
				b.FailNow()
			}
			reqs[p.name] += api.requests.Load() - before
			walls[p.name] = append(walls[p.name], r.wall)
			checkCaptured(b, p, name)
			b.StartTimer()
		}
	}
	b.StopTimer()
	reportAdds(b, walls, reqs)
}

func reportAdds(b *testing.B, walls map[string][]time.Duration, reqs map[string]int64) {
	o50, i50 := pct(walls["nftmesh"], .5), pct(walls["istio"], .5)
	b.ReportMetric(o50, "nftmesh-p50-ms")
	b.ReportMetric(pct(walls["nftmesh"], .99), "nftmesh-p99-ms")
	b.ReportMetric(i50, "istio-p50-ms")
	b.ReportMetric(pct(walls["istio"], .99), "istio-p99-ms")
	b.ReportMetric(o50/i50, "p50-ratio")
	if n := len(walls["nftmesh"]); n > 0 && reqs != nil {
		b.ReportMetric(float64(reqs["nftmesh"])/float64(n), "nftmesh-api-req/add")
		b.ReportMetric(float64(reqs["istio"])/float64(len(walls["istio"])), "istio-api-req/add")
	}
	b.ReportMetric(0, "ns/op")
}

// burstSize is how many pods a node starts at once in the burst
// benchmarks: a node coming back with its full pod list, or a deployment
// scaled up onto it.
const burstSize = 100

// burstFigures collects each plugin's bursts: the whole burst (first start
// to last exit), and each ADD's wall time and CPU (user + system, wait4's
// rusage of the process the runtime started, which counts the children it
// waited for: ours is the front and, without the agent, the standalone
// plugin it became; Istio's its plugin and the iptables processes it runs).
type burstFigures struct {
	bursts, adds, cpus map[string][]time.Duration
	ids                map[string]string // container ID → plugin
}

func newBurstFigures() *burstFigures {
	return &burstFigures{bursts: map[string][]time.Duration{}, adds: map[string][]time.Duration{}, cpus: map[string][]time.Duration{}, ids: map[string]string{}}
}

// run starts one ADD per pod at once, each into its own fresh netns, with
// the clock running only from the first start to the last exit. Every pod
// must end up captured.
func (f *burstFigures) run(b *testing.B, p plugin, pods []*corev1.Pod) {
	b.StopTimer()
	names, paths := make([]string, len(pods)), make([]string, len(pods))
	for k := range pods {
		names[k], paths[k] = newPodNetns(b)
	}
	// The kernel tears down the previous burst's namespaces in the
	// background; let it finish before the clock starts.
	time.Sleep(3 * time.Second)
	res := make([]runResult, len(pods))
	var wg sync.WaitGroup
	gate := make(chan struct{})
	for k := range pods {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-gate
			res[k] = addPod(b, p, pods[k], paths[k])
		}()
	}
	b.StartTimer()
	start := time.Now()
	close(gate)
	wg.Wait()
	whole := time.Since(start)
	b.StopTimer()
	if b.Failed() {
		b.FailNow()
	}
	f.bursts[p.name] = append(f.bursts[p.name], whole)
	for _, r := range res {
		f.adds[p.name] = append(f.adds[p.name], r.wall)
		f.cpus[p.name] = append(f.cpus[p.name], r.cpu)
		f.ids[r.id] = p.name
	}
	for _, name := range names {
		checkCaptured(b, p, name)
	}
	for _, name := range names {
		_ = exec.Command("ip", "netns", "del", name).Run()
	}
	b.StartTimer()
}

// report gives the median burst (the lower one of two) of ours and Istio's,
// their ratio, and the per-ADD figures.
func (f *burstFigures) report(b *testing.B) {
	ows, iws := pct(f.bursts["nftmesh"], .5), pct(f.bursts["istio"], .5)
	b.ReportMetric(ows, "nftmesh-burst-ms")
	b.ReportMetric(iws, "istio-burst-ms")
	b.ReportMetric(ows/iws, "burst-ratio")
	b.ReportMetric(pct(f.adds["nftmesh"], .5), "nftmesh-add-p50-ms")
	b.ReportMetric(pct(f.adds["nftmesh"], .99), "nftmesh-add-p99-ms")
	b.ReportMetric(pct(f.adds["istio"], .5), "istio-add-p50-ms")
	b.ReportMetric(pct(f.adds["istio"], .99), "istio-add-p99-ms")
	b.ReportMetric(meanMS(f.cpus["nftmesh"]), "nftmesh-add-cpu-mean-ms")
	b.ReportMetric(meanMS(f.cpus["istio"]), "istio-add-cpu-mean-ms")
	b.ReportMetric(0, "ns/op")
}

// kubeFloorBurst starts kubefloor (the runtime and package start of
// client-go's rest and clientcmd, the kubeconfig read, one GET of the pod)
// once per pod, all at once, and returns the whole burst's time. The clock
// is stopped on return.
func kubeFloorBurst(b *testing.B, kubeconfig string, pods []*corev1.Pod) time.Duration {
	b.StopTimer()
	time.Sleep(3 * time.Second)
	bin := filepath.Join(env.dir, "bin", "kubefloor")
	var wg sync.WaitGroup
	gate := make(chan struct{})
	for _, pod := range pods {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-gate
			if out, err := exec.Command(bin, kubeconfig, pod.Namespace, pod.Name).CombinedOutput(); err != nil {
				b.Errorf("kubefloor %s/%s: %v %s", pod.Namespace, pod.Name, err, out)
			}
		}()
	}
	start := time.Now()
	close(gate)
	wg.Wait()
	return time.Since(start)
}

// BenchmarkBurst starts burstSize ADDs at once with no agent on the node
// (a node whose pods come back before its agent does): ours is the front
// and the standalone plugin, each looking its pod up in a fake API over
// plain HTTP, as Istio's plugin does. One b.N is one burst per plugin,
// alternating which goes first.
func BenchmarkBurst(b *testing.B) {
	needEnv(b)
	api := newFakeAPI(b)
	ps := []plugin{oursPlugin(b, api.url), istioPlugin(b, api.url)}
	f := newBurstFigures()
	reqs := map[string]int64{}
	var floor []time.Duration
	for i := 0; b.Loop(); i++ {
		for j := range ps {
			p := ps[(i+j)%len(ps)]
			b.StopTimer()
			pods := make([]*corev1.Pod, burstSize)
			for k := range pods {
				pods[k] = benchPod(b)
				api.add(b, pods[k])
			}
			before := api.requests.Load()
			f.run(b, p, pods)
			reqs[p.name] += api.requests.Load() - before
			if j == 0 {
				floor = append(floor, kubeFloorBurst(b, filepath.Join(ps[0].runDir, "kubeconfig"), pods))
			}
		}
	}
	b.StopTimer()
	f.report(b)
	// What any process that looks a pod up with client-go costs here,
	// started as often at once: the floor under our standalone plugin.
	b.ReportMetric(pct(floor, .5), "kubefloor-burst-ms")
	b.ReportMetric(pct(floor, .5)/pct(f.bursts["istio"], .5), "kubefloor-ratio")
	b.ReportMetric(float64(reqs["nftmesh"])/float64(len(f.adds["nftmesh"])), "nftmesh-api-req/add")
	b.ReportMetric(float64(reqs["istio"])/float64(len(f.adds["istio"])), "istio-api-req/add")
}

// meanMS is the mean of ds in milliseconds.
func meanMS(ds []time.Duration) float64 {
	if len(ds) == 0 {
		return 0
	}
	var sum time.Duration
	for _, d := range ds {
		sum += d
	}
	return float64(sum.Microseconds()) / 1000 / float64(len(ds))
}
