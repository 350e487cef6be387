package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftmesh/nftmesh/testkit/kubetest"
)

// BenchmarkAgentUp is one ADD of the injected dual-stack pod on a node whose
// agent is up: the real nftmesh-agent, its node-scoped informer over a real
// kube-apiserver, runs the call our nftmesh-cni front hands it over its unix
// socket (nftmesh-cpu-p50-ms is the front's CPU, nftmesh-agent-cpu-p50-ms
// the agent's for the call, measured from its threads' scheduler account); Istio's plugin,
// which has no such agent path in sidecar mode, GETs the pod from the same
// API server. Both plugins reach the API server through a proxy that counts
// the connections they open (none, with the agent answering, means no
// request). The pods exist in the API before the round, bound to the
// agent's node, as kubelet sees them; every ADD goes into a fresh netns and
// is checked with nft.
//
//	go test -run '^$' -bench AgentUp -benchtime 30x ./e2e/bench/
func BenchmarkAgentUp(b *testing.B) {
	needEnv(b)
	api := kubetest.Start(b)
	a := startAgent(b, api)
	a.waitSynced(b)
	sock := filepath.Join(a.runDir, "agent-sock", "pod.sock")
	if _, err := os.Stat(sock); err != nil {
		b.Skipf("the agent serves no pod socket at %s (an agent without it): %v", sock, err)
	}
	ours, istio, conns, tok := agentUpPlugins(b, api, a)
	ps := []plugin{ours, istio}
	if bin := os.Getenv("BENCH_BASELINE_BIN"); bin != "" {
		// Another build of our plugin (e.g. main's, before a change) in the
		// same rounds: the ratio of two builds without the machine's drift
		// between two runs. Its config names the agent's run dir, as ours
		// does: the agent declines a call whose config names another, and
		// the baseline would measure its standalone plugin instead.
		base := oursAgentPlugin(b, api, a.runDir, conns.url, tok)
		base.name, base.bin = "baseline", bin
		ps = append(ps, base)
	}

	// Every pod the rounds will ask about, created up front on the node.
	n := b.N
	pods := map[string][]*corev1.Pod{}
	api.EnsureNamespace(b, "shop")
	for _, p := range ps {
		for range n {
			pods[p.name] = append(pods[p.name], createNodePod(b, api))
		}
	}
	time.Sleep(time.Second) // the informer has them: no round waits on the watch

	walls := map[string][]time.Duration{}
	cpus := map[string][]time.Duration{}
	agentCPUs := map[string][]time.Duration{}
	runs := map[string]runResult{} // ours, by container ID
	owner := map[string]string{}   // which plugin ran each container ID
	reqs := map[string]int64{}
	i := 0
	for b.Loop() {
		for j := range ps {
			p := ps[(i+j)%len(ps)]
			b.StopTimer()
			name, path := newPodNetns(b)
			pod := pods[p.name][len(walls[p.name])%n]
			before := conns.count.Load()
			agentBefore := a.cpu(b)
			b.StartTimer()
			r := addPod(b, p, pod, path)
			b.StopTimer()
			// Ours runs its call in the agent: its CPU is the front's and
			// the agent's together (the agent idles between rounds).
			agentCPUs[p.name] = append(agentCPUs[p.name], a.cpu(b)-agentBefore)
			if b.Failed() {
				b.FailNow()
			}
			reqs[p.name] += conns.count.Load() - before
			walls[p.name] = append(walls[p.name], r.wall)
			cpus[p.name] = append(cpus[p.name], r.cpu)
			if p.name == "nftmesh" {
				runs[r.id] = r
			}
			owner[r.id] = p.name
			checkCaptured(b, p, name)
			b.StartTimer()
		}
		i++
	}
	b.StopTimer()
	reportAdds(b, walls, nil)
	b.ReportMetric(pct(cpus["nftmesh"], .5), "nftmesh-cpu-p50-ms")
	b.ReportMetric(pct(agentCPUs["nftmesh"], .5), "nftmesh-agent-cpu-p50-ms")
	total := make([]time.Duration, len(cpus["nftmesh"]))
	for i := range total {
		total[i] = cpus["nftmesh"][i] + agentCPUs["nftmesh"][i]
	}
	b.ReportMetric(pct(total, .5), "nftmesh-front+agent-cpu-p50-ms")
	b.ReportMetric(pct(cpus["istio"], .5), "istio-cpu-p50-ms")
	if len(walls["baseline"]) > 0 {
		b.ReportMetric(pct(walls["baseline"], .5), "baseline-p50-ms")
		b.ReportMetric(pct(walls["nftmesh"], .5)/pct(walls["baseline"], .5), "nftmesh/baseline")
		b.ReportMetric(pct(cpus["baseline"], .5), "baseline-cpu-p50-ms")
	}
	// Connections opened to the API server per ADD: with the agent
	// answering ours opens none (so sends no request); Istio's opens one for
	// its GET.
	b.ReportMetric(float64(reqs["nftmesh"])/float64(len(walls["nftmesh"])), "nftmesh-api-conns/add")
	b.ReportMetric(float64(reqs["istio"])/float64(len(walls["istio"])), "istio-api-conns/add")
	// The agent's log: the calls it ran log there (and in no file), the
	// standalone plugin's are re-emitted there from its file.
	data := []byte(a.logs.String())
	// Pod lookups the agent answered (the standalone plugin asks it too),
	// and calls the agent itself ran: only those measure the agent path.
	adds := float64(len(walls["nftmesh"]))
	answered, ranByAgent := agentShare(data, owner)
	b.ReportMetric(float64(answered["nftmesh"])/adds, "nftmesh-agent-answers/add")
	b.ReportMetric(float64(ranByAgent["nftmesh"])/adds, "nftmesh-ran-by-agent/add")
	for _, name := range []string{"nftmesh", "baseline"} {
		if n := len(walls[name]); ranByAgent[name] < n {
			b.Errorf("%d of %s's %d ADDs ran in the standalone plugin, not the agent: the figures are not the agent path's\nagent's reason: %s", n-ranByAgent[name], name, n, agentRefusal(a.logs.String()))
		}
	}
	reportInProcess(b, data, runs)
}

// BenchmarkBurstAgentUp starts burstSize ADDs at once on a node whose agent
// is up (a deployment scaled up onto it, pods rescheduled from a drained
// node): ours is the front handing each call to the real nftmesh-agent over
// its socket, the pod from its informer over a real kube-apiserver; Istio's
// plugin GETs each pod from the same API server. The pods exist, bound to
// the agent's node, before each burst. Every one of our ADDs must have run
// in the agent. One b.N is one burst per plugin, alternating which goes
// first.
//
//	go test -run '^$' -bench BurstAgentUp -benchtime 3x -timeout 30m ./e2e/bench/
func BenchmarkBurstAgentUp(b *testing.B) {
	needEnv(b)
	api := kubetest.Start(b)
	a := startAgent(b, api)
	a.waitSynced(b)
	ours, istio, conns, _ := agentUpPlugins(b, api, a)
	ps := []plugin{ours, istio}
	api.EnsureNamespace(b, "shop")
	f := newBurstFigures()
	reqs := map[string]int64{}
	var agentCPU time.Duration
	for i := 0; b.Loop(); i++ {
		for j := range ps {
			p := ps[(i+j)%len(ps)]
			b.StopTimer()
			pods := make([]*corev1.Pod, burstSize)
			for k := range pods {
				pods[k] = createNodePod(b, api)
			}
			time.Sleep(time.Second) // the informer has them: no ADD waits on the watch
			before, cpuBefore := conns.count.Load(), a.cpu(b)
			f.run(b, p, pods)
			b.StopTimer()
			reqs[p.name] += conns.count.Load() - before
			if p.name == "nftmesh" {
				agentCPU += a.cpu(b) - cpuBefore
			}
			b.StartTimer()
		}
	}
	b.StopTimer()
	f.report(b)
	adds := float64(len(f.adds["nftmesh"]))
	// The agent's CPU for the bursts, per ADD, on top of the front's.
	b.ReportMetric(float64(agentCPU.Microseconds())/1000/adds, "nftmesh-agent-cpu-mean-ms")
	b.ReportMetric(float64(reqs["nftmesh"])/adds, "nftmesh-api-conns/add")
	b.ReportMetric(float64(reqs["istio"])/float64(len(f.adds["istio"])), "istio-api-conns/add")
	_, ran := agentShare([]byte(a.logs.String()), f.ids) // the agent's log, as above
	b.ReportMetric(float64(ran["nftmesh"])/adds, "nftmesh-ran-by-agent/add")
	if n := int(adds); ran["nftmesh"] < n {
		b.Errorf("%d of our %d ADDs ran in the standalone plugin, not the agent: the figures are not the agent path's\nagent's reason: %s", n-ran["nftmesh"], n, agentRefusal(a.logs.String()))
	}
}

// agentUpPlugins is both plugins as they run on a node whose agent a is up:
// ours configured as the agent installs it, Istio's with its kubeconfig,
// both reaching the API server through conns, with the token (tok) of a
// service account granted what the chart's RBAC grants the plugin: get pods.
// Without the agent's cni.sock the front would exec the standalone plugin,
// which asks the agent only for the pod: every figure would be the
// standalone plugin's, not the agent path's (as happened unnoticed where
// the host's network namespace could not be registered), so that fails.
func agentUpPlugins(b *testing.B, api *kubetest.Server, a *agent) (ours, istio plugin, conns *proxy, tok string) {
	b.Helper()
	if _, err := os.Stat(filepath.Join(a.runDir, "agent-sock", "cni.sock")); err != nil {
		b.Fatalf("the agent serves no CNI socket, so the front would run the standalone plugin and this would not measure the agent path: %v\nagent's reason: %s", err, agentRefusal(a.logs.String()))
	}
	tok = api.ServiceAccount(b, agentNS, "nftmesh-cni")
	api.Grant(b, agentNS, "nftmesh-cni", true, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get"}})
	conns = countingProxy(b, strings.TrimPrefix(api.Host, "https://"))
	return oursAgentPlugin(b, api, a.runDir, conns.url, tok), istioAPIPlugin(b, api, conns.url, tok), conns, tok
}

// createNodePod creates a bench pod in the API, bound to the agent's node as
// kubelet sees it.
func createNodePod(b *testing.B, api *kubetest.Server) *corev1.Pod {
	b.Helper()
	pod := benchPod(b)
	pod.UID, pod.ResourceVersion, pod.Status = "", "", corev1.PodStatus{}
	pod.Spec.NodeName = agentNode
	got, err := api.Client().CoreV1().Pods(pod.Namespace).Create(context.Background(), pod, metav1.CreateOptions{})
	if err != nil {
		b.Fatalf("creating pod: %v", err)
	}
	return got
}

// agentShare counts, by the plugin that made each call (owner, by
// container ID), the plugin log's capture decisions whose pod the agent
// answered (lookup agent) and those the agent ran (ran_by agent).
func agentShare(log []byte, owner map[string]string) (answered, ran map[string]int) {
	answered, ran = map[string]int{}, map[string]int{}
	for _, line := range strings.Split(string(log), "\n") {
		var e struct {
			Decision string `json:"decision"`
			Lookup   string `json:"lookup"`
			RanBy    string `json:"ran_by"`
			ID       string `json:"container_id"`
		}
		if json.Unmarshal([]byte(line), &e) != nil || e.Decision != "capture" || owner[e.ID] == "" {
			continue
		}
		if e.Lookup == "agent" {
			answered[owner[e.ID]]++
		}
		if e.RanBy == "agent" {
			ran[owner[e.ID]]++
		}
	}
	return answered, ran
}

// agentRefusal is the agent's log line saying why it does not run the
// plugin's CNI calls, or a note that it logged none.
func agentRefusal(log string) string {
	for _, line := range strings.Split(log, "\n") {
		if strings.Contains(line, "not running the plugin's CNI calls") {
			return line
		}
	}
	return "(none logged)"
}

// oursAgentPlugin is nftmesh-cni configured as the agent installs it, its
// run dir the agent's (the socket), its kubeconfig for the fallback GET
// through the counting proxy.
func oursAgentPlugin(b *testing.B, api *kubetest.Server, runDir, proxy, token string) plugin {
	b.Helper()
	kc := filepath.Join(b.TempDir(), "kubeconfig")
	if err := api.WriteKubeconfigHost(kc, proxy, token); err != nil {
		b.Fatal(err)
	}
	return plugin{name: "nftmesh", bin: env.ours, runDir: runDir, conf: func(prev map[string]any) []byte {
		return mustJSON(b, map[string]any{
			"cniVersion":         "1.0.0",
			"name":               "k8s-pod-network",
			"type":               "nftmesh-cni",
			"log_level":          pluginLogLevel(),
			"exclude_namespaces": []string{"kube-system"},
			"pod_namespace":      agentNS,
			"agent_run_dir":      runDir,
			"kubeconfig":         kc,
			"backend":            "auto",
			"api_timeout":        "30s",
			"prevResult":         prev,
		})
	}}
}

// istioAPIPlugin is Istio's plugin with its kubeconfig (TLS, the token)
// reaching the real API server through the counting proxy.
func istioAPIPlugin(b *testing.B, api *kubetest.Server, proxy, token string) plugin {
	b.Helper()
	p := istioPlugin(b, "http://127.0.0.1:1")
	if err := api.WriteKubeconfigHost(filepath.Join(p.runDir, "istio-cni-kubeconfig"), proxy, token); err != nil {
		b.Fatal(err)
	}
	return p
}

// proxy forwards TCP connections to the API server and counts them.
type proxy struct {
	url   string
	count atomic.Int64
}

func countingProxy(b *testing.B, target string) *proxy {
	b.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	p := &proxy{url: "https://" + ln.Addr().String()}
	b.Cleanup(func() { ln.Close() })
	go kubetest.Forward(&countingListener{Listener: ln, n: &p.count}, target)
	return p
}

type countingListener struct {
	net.Listener
	n *atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

// reportInProcess adds the medians of our plugin's own figures from its
// decision lines: the whole verb in process (duration_ms) and the pod
// lookup in it (lookup_ms). What the wall time has beyond duration_ms is
// process start, runtime init and exit.
func reportInProcess(b *testing.B, log []byte, runs map[string]runResult) {
	var verb, lookup []float64
	steps := map[string][]float64{}
	var order []string
	for _, line := range strings.Split(string(log), "\n") {
		var e struct {
			Decision string  `json:"decision"`
			Duration float64 `json:"duration_ms"`
			Lookup   float64 `json:"lookup_ms"`
			Phases   string  `json:"phases_us"`
			ID       string  `json:"container_id"`
		}
		if json.Unmarshal([]byte(line), &e) != nil || e.Decision != "capture" {
			continue
		}
		verb, lookup = append(verb, e.Duration), append(lookup, e.Lookup)
		prev, t0 := 0.0, 0.0
		for _, f := range strings.Fields(e.Phases) {
			name, v, _ := strings.Cut(f, "=")
			at, _ := strconv.ParseFloat(v, 64)
			if name == "t0" {
				t0 = at
				continue
			}
			if _, seen := steps[name]; !seen {
				order = append(order, name)
			}
			steps[name] = append(steps[name], at-prev)
			prev = at
		}
		// Lined up with the process as the benchmark saw it: from its
		// start to the first mark's clock, and from the last mark to its
		// exit (the decision line is written, the result printed, the
		// process torn down and reaped).
		if r, ok := runs[e.ID]; ok && t0 > 0 {
			first := t0 - float64(r.start.UnixMicro())
			steps["(exec to t0)"] = append(steps["(exec to t0)"], first)
			steps["(last to exit)"] = append(steps["(last to exit)"], float64(r.wall.Microseconds())-first-prev)
		}
	}
	// With BENCH_PLUGIN_LOG_LEVEL=debug the plugin's decision lines carry
	// its phases: the median time each step took (µs since the previous).
	if len(order) > 0 {
		var sb strings.Builder
		if len(steps["(exec to t0)"]) > 0 {
			order = append([]string{"(exec to t0)"}, append(order, "(last to exit)")...)
		}
		for _, name := range order {
			v := steps[name]
			slices.Sort(v)
			fmt.Fprintf(&sb, "\n  %-16s p50 %6.0f µs", name, v[len(v)/2])
		}
		// b.Logf would cut this off after ten lines.
		fmt.Printf("%s: our plugin's phases (time since the previous one):%s\n", b.Name(), sb.String())
	}
	if len(verb) == 0 {
		return
	}
	med := func(v []float64) float64 { slices.Sort(v); return v[len(v)/2] }
	b.ReportMetric(med(verb), "nftmesh-inproc-p50-ms")
	b.ReportMetric(med(lookup), "nftmesh-lookup-p50-ms")
}

// pluginLogLevel is our plugin's log_level in the benchmarks: info, as the
// chart installs it, unless BENCH_PLUGIN_LOG_LEVEL says otherwise (debug
// adds the phases of every ADD to its decision line; reportInProcess shows
// them).
func pluginLogLevel() string {
	if l := os.Getenv("BENCH_PLUGIN_LOG_LEVEL"); l != "" {
		return l
	}
	return "info"
}
