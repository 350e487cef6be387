package bench

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/nftmesh/nftmesh/testkit/istiotest"
	"github.com/nftmesh/nftmesh/testkit/kubetest"

	"github.com/nftmesh/nftmesh/testkit/syncbuf"
)

// The cluster the agent is measured in: nodePods on its node among
// clusterPods in all, as on a full node of a mid-sized cluster.
const (
	nodePods    = 1000
	clusterPods = 10000
	agentNode   = "node-1"
	// The targets: resident memory with that cluster, and CPU while
	// nothing changes.
	maxAgentRSSMiB  = 64
	maxIdleCPUShare = 0.01 // of one core
)

// BenchmarkAgentAtScale runs the real nftmesh-agent binary (repair in place
// on, so its node-scoped pod informer runs) against a real kube-apiserver
// holding clusterPods pods, nodePods of them on the agent's node (Istio's
// injector output for httpbin; the others are small pods on other nodes).
// It reports the agent's peak and current resident memory once its
// informer has listed the node's pods, and its CPU over an idle window in
// which nothing changes. It fails when a target is missed. One run
// whatever b.N.
//
//	go test -run '^$' -bench AgentAtScale -benchtime 1x ./e2e/bench/
func BenchmarkAgentAtScale(b *testing.B) {
	needOurs(b)
	for range b.N {
		agentAtScale(b)
	}
}

// agent is a running nftmesh-agent binary.
type agent struct {
	cmd     *exec.Cmd
	runDir  string // its agent run dir (kubeconfig, socket, plugin log)
	metrics string // host:port of /readyz and /metrics
	started time.Time
	logs    *syncbuf.Buffer
	pprof   string // host:port of Go's profiles (NFTMESH_BENCH_AGENT_PROFILE only)
}

// startAgent runs the agent binary as the DaemonSet runs it, with repair in
// place (so its node-scoped pod informer runs) for agentNode, against api
// with its own service account, on a stand-in node tree in a temp dir. It is
// stopped with SIGTERM when the benchmark ends; its log is shown on failure.
func startAgent(b *testing.B, api *kubetest.Server) *agent {
	b.Helper()
	return startAgentWith(b, api, nil)
}

// startAgentWith is startAgent with more flags and the RBAC rules they
// need granted to the agent.
func startAgentWith(b *testing.B, api *kubetest.Server, rules []rbacv1.PolicyRule, flags ...string) *agent {
	b.Helper()
	dir := b.TempDir()
	sa := filepath.Join(dir, "sa")
	for _, d := range []string{"bin", "conf", "run", "sa"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			b.Fatal(err)
		}
	}
	tok := api.ServiceAccount(b, agentNS, "nftmesh-agent")
	api.Grant(b, agentNS, "nftmesh-agent", true, append([]rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create"}}}, rules...)...)
	writeFile(b, filepath.Join(sa, "token"), tok)
	ca, err := os.ReadFile(api.CAFile)
	if err != nil {
		b.Fatal(err)
	}
	writeFile(b, filepath.Join(sa, "ca.crt"), string(ca))
	writeFile(b, filepath.Join(sa, "namespace"), agentNS)
	writeFile(b, filepath.Join(dir, "conf", "10-bridge.conflist"),
		`{"cniVersion":"1.0.0","name":"k8s-pod-network","plugins":[{"type":"bridge","bridge":"cni0","ipam":{"type":"host-local","subnet":"10.244.0.0/24"}}]}`)
	a := &agent{runDir: filepath.Join(dir, "run"), metrics: freeAddr(b), logs: &syncbuf.Buffer{}}
	args := []string{
		"--cni-bin-dir", filepath.Join(dir, "bin"), "--cni-conf-dir", filepath.Join(dir, "conf"),
		"--agent-run-dir", a.runDir, "--plugin-binary", env.ours,
		"--service-account-dir", sa, "--kube-api-server", api.Host,
		"--health-addr", a.metrics, "--metrics-addr", a.metrics,
		"--repair-enabled", "--repair-pods", "--host-proc", "/proc", "--node-name", agentNode}
	a.cmd = exec.Command(env.agent, append(args, flags...)...)
	a.cmd.Env = os.Environ()
	// NFTMESH_BENCH_AGENT_GODEBUG=gctrace=1 shows where the agent's heap goes.
	if v := os.Getenv("NFTMESH_BENCH_AGENT_GODEBUG"); v != "" {
		a.cmd.Env = append(a.cmd.Env, "GODEBUG="+v)
	}
	if env.profileDir != "" {
		a.pprof = freeAddr(b)
		a.cmd.Env = append(a.cmd.Env, "NFTMESH_PPROF_ADDR="+a.pprof)
	}
	a.cmd.Stdout, a.cmd.Stderr = a.logs, a.logs
	a.started = time.Now()
	if err := a.cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = a.cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = a.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = a.cmd.Process.Kill()
			<-done
		}
		if b.Failed() {
			b.Logf("agent log:\n%s", tail([]byte(a.logs.String())))
		}
	})
	return a
}

// cpu is the CPU time the agent's threads have run so far, in nanoseconds
// (the scheduler's own account, /proc/PID/task/*/schedstat: clock ticks
// would be far too coarse for one call).
func (a *agent) cpu(b *testing.B) time.Duration {
	b.Helper()
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", a.cmd.Process.Pid))
	if err != nil || len(tasks) == 0 {
		b.Fatalf("the agent's threads: %v", err)
	}
	var sum time.Duration
	for _, f := range tasks {
		data, err := os.ReadFile(f)
		if err != nil {
			continue // a thread that just exited
		}
		ns, _, _ := strings.Cut(string(data), " ")
		v, err := strconv.ParseInt(ns, 10, 64)
		if err != nil {
			b.Fatalf("%s: %q", f, data)
		}
		sum += time.Duration(v)
	}
	return sum
}

// waitSynced waits until the agent is ready and its informer has listed.
func (a *agent) waitSynced(b *testing.B) time.Duration {
	b.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for !agentSynced(a.metrics) {
		if time.Now().After(deadline) {
			b.Fatalf("agent not ready with its pods listed after 2m")
		}
		time.Sleep(100 * time.Millisecond)
	}
	return time.Since(a.started)
}

func agentAtScale(b *testing.B) {
	api := kubetest.Start(b)
	created := createPods(b, api)
	b.Logf("created %d pods (%d on %s) in %v", clusterPods, nodePods, agentNode, created.Round(time.Millisecond))

	a := startAgent(b, api)
	pid := a.cmd.Process.Pid

	// Ready (plugin installed) and the informer's list done: the API
	// reachable gauge goes to 1 on the first successful list.
	synced := a.waitSynced(b)
	// Let the first list's garbage be collected and the heap settle: the
	// resident set is sampled until it stops moving.
	prev := int64(-1)
	for i := 0; i < 30; i++ {
		time.Sleep(time.Second)
		rss := procStatus(b, pid, "VmRSS")
		if prev >= 0 && abs(rss-prev) < 256 {
			break
		}
		prev = rss
	}
	const idle = 20 * time.Second
	cpu0 := procCPU(b, pid)
	t0 := time.Now()
	time.Sleep(idle)
	cpu := procCPU(b, pid) - cpu0
	window := time.Since(t0)
	rss, hwm := procStatus(b, pid, "VmRSS"), procStatus(b, pid, "VmHWM")
	share := cpu.Seconds() / window.Seconds()
	anon, file := procStatus(b, pid, "RssAnon"), procStatus(b, pid, "RssFile")
	b.Logf("agent ready with %d node pods listed %v after start; RSS %.1f MiB (anonymous %.1f, file %.1f), peak %.1f MiB; idle CPU %v over %v (%.2f%% of a core)",
		nodePods, synced.Round(time.Millisecond), float64(rss)/1024, float64(anon)/1024, float64(file)/1024, float64(hwm)/1024, cpu, window.Round(time.Millisecond), share*100)
	// The Go runtime's own account (the agent's /metrics): the heap in
	// use, what it holds free but not yet returned to the kernel, the
	// goroutine stacks, and everything it has mapped.
	ms := goMemStats(b, a.metrics)
	b.Logf("agent Go runtime: heap in use %.1f MiB, heap free not released %.1f MiB, stacks %.1f MiB, runtime sys %.1f MiB, next GC at %.1f MiB",
		ms["go_memstats_heap_inuse_bytes"]/mib, (ms["go_memstats_heap_idle_bytes"]-ms["go_memstats_heap_released_bytes"])/mib,
		ms["go_memstats_stack_inuse_bytes"]/mib, ms["go_memstats_sys_bytes"]/mib, ms["go_memstats_next_gc_bytes"]/mib)
	b.ReportMetric(ms["go_memstats_heap_inuse_bytes"]/mib, "heap-inuse-MiB")
	if a.pprof != "" {
		saveHeapProfile(b, a.pprof, filepath.Join(env.profileDir, "agent-heap.pprof"))
	}
	b.ReportMetric(float64(rss)/1024, "rss-MiB")
	b.ReportMetric(float64(hwm)/1024, "peak-rss-MiB")
	b.ReportMetric(share*100, "idle-cpu-%")
	b.ReportMetric(synced.Seconds(), "synced-s")
	b.ReportMetric(0, "ns/op")
	if float64(hwm)/1024 > maxAgentRSSMiB {
		b.Errorf("agent peak RSS %.1f MiB with %d pods on its node and %d in the cluster: over the %d MiB target", float64(hwm)/1024, nodePods, clusterPods, maxAgentRSSMiB)
	}
	if share > maxIdleCPUShare {
		b.Errorf("agent used %v of CPU in %v with nothing changing (%.2f%% of a core): over %.0f%%", cpu, window, share*100, maxIdleCPUShare*100)
	}
}

// createPods fills the API server: nodePods copies of Istio's injected
// httpbin pod on agentNode, the rest small pods spread over other nodes,
// created concurrently. Pods are bound by spec.nodeName (no scheduler).
func createPods(b *testing.B, api *kubetest.Server) time.Duration {
	b.Helper()
	data, err := os.ReadFile(filepath.Join(istiotest.TestdataDir(), "injected", "httpbin.yaml"))
	if err != nil {
		b.Fatal(err)
	}
	objs, err := istiotest.SplitManifests(data)
	if err != nil {
		b.Fatal(err)
	}
	var meta metav1.ObjectMeta
	var spec corev1.PodSpec
	found := false
	for _, o := range objs {
		if m, s, err := istiotest.PodTemplate(o); err == nil {
			meta, spec, found = m, s, true
			break
		}
	}
	if !found {
		b.Fatal("no pod template in httpbin.yaml")
	}
	cfg := api.AdminConfig()
	cfg.QPS, cfg.Burst = 5000, 5000
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		b.Fatal(err)
	}
	const namespaces = 10
	for i := range namespaces {
		api.EnsureNamespace(b, fmt.Sprintf("bench-%d", i))
	}
	small := corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "registry.example/app:1"}}}
	start := time.Now()
	var next atomic.Int64
	var failed atomic.Value
	var wg sync.WaitGroup
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= clusterPods || failed.Load() != nil {
					return
				}
				pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("pod-%05d", i), Namespace: fmt.Sprintf("bench-%d", i%namespaces)}}
				if i < nodePods {
					pod.Labels, pod.Annotations = meta.Labels, meta.Annotations
					pod.Spec = *spec.DeepCopy()
					pod.Spec.NodeName = agentNode
				} else {
					pod.Spec = *small.DeepCopy()
					pod.Spec.NodeName = fmt.Sprintf("node-%d", 2+i%99)
				}
				if _, err := client.CoreV1().Pods(pod.Namespace).Create(context.Background(), pod, metav1.CreateOptions{}); err != nil {
					failed.Store(fmt.Errorf("creating pod %s/%s: %w", pod.Namespace, pod.Name, err))
					return
				}
			}
		}()
	}
	wg.Wait()
	if err, _ := failed.Load().(error); err != nil {
		b.Fatal(err)
	}
	return time.Since(start)
}

// agentSynced is true once the agent's /readyz answers 200 and its
// metrics say the API was reached (the informer's first list succeeded).
func agentSynced(addr string) bool {
	r, err := http.Get("http://" + addr + "/readyz")
	if err != nil {
		return false
	}
	r.Body.Close()
	if r.StatusCode != http.StatusOK {
		return false
	}
	m, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return false
	}
	defer m.Body.Close()
	sc := bufio.NewScanner(m.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "nftmesh_repair_api_reachable ") {
			return strings.TrimSpace(strings.TrimPrefix(sc.Text(), "nftmesh_repair_api_reachable ")) == "1"
		}
	}
	return false
}

// procStatus reads a "kB" field of /proc/PID/status (VmRSS, VmHWM), in KiB.
func procStatus(b *testing.B, pid int, field string) int64 {
	b.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			v, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				b.Fatalf("/proc/%d/status %s: %v", pid, field, err)
			}
			return v
		}
	}
	b.Fatalf("/proc/%d/status has no %s", pid, field)
	return 0
}

// procCPU is the user+system CPU time the process has used, from
// /proc/PID/stat (clock ticks of 1/100 s, as on every Linux USER_HZ).
func procCPU(b *testing.B, pid int) time.Duration {
	b.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	// The command name may hold spaces; fields count from after its ')'.
	rest := string(data[bytes.LastIndexByte(data, ')')+2:])
	f := strings.Fields(rest)
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		b.Fatalf("parsing /proc/%d/stat: %q", pid, data)
	}
	return time.Duration(utime+stime) * 10 * time.Millisecond
}

const mib = 1 << 20

// goMemStats reads the agent's go_memstats_* gauges from its /metrics.
func goMemStats(b *testing.B, addr string) map[string]float64 {
	b.Helper()
	r, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		b.Fatalf("reading the agent's metrics: %v", err)
	}
	defer r.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(r.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		name, val, ok := strings.Cut(sc.Text(), " ")
		if !ok || !strings.HasPrefix(name, "go_memstats_") {
			continue
		}
		if v, err := strconv.ParseFloat(val, 64); err == nil {
			out[name] = v
		}
	}
	if _, ok := out["go_memstats_heap_inuse_bytes"]; !ok {
		b.Fatalf("the agent's metrics have no go_memstats_heap_inuse_bytes")
	}
	return out
}

// saveHeapProfile writes the agent's heap profile (in use and allocated
// since start) to path, for go tool pprof, after a collection (gc=1), so
// that in use is what is live now, not at the last collection (which may
// have run mid-list). It runs after every figure is taken.
func saveHeapProfile(b *testing.B, addr, path string) {
	b.Helper()
	r, err := http.Get("http://" + addr + "/debug/pprof/heap?gc=1")
	if err != nil {
		b.Fatalf("reading the agent's heap profile: %v", err)
	}
	defer r.Body.Close()
	data, err := io.ReadAll(r.Body)
	if err != nil || r.StatusCode != http.StatusOK {
		b.Fatalf("reading the agent's heap profile: %v (HTTP %d)", err, r.StatusCode)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		b.Fatal(err)
	}
	b.Logf("agent heap profile: %s (go tool pprof -sample_index=inuse_space %s)", path, path)
}

func freeAddr(b *testing.B) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func writeFile(b *testing.B, path, text string) {
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		b.Fatal(err)
	}
}

func abs(v int64) int64 {
	if v < 0 {
		return -v
	}
	return v
}
