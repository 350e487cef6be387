package bench

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
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

// The scale contract: what one node's agent asks of the API server at start
// depends on the pods of its own node, not on the cluster's size. Measured
// against one real kube-apiserver + etcd holding pod objects only (no
// kubelets): P pods over N nodes, K real nftmesh-agent processes, each for
// its own node, started together; then the cluster doubled (P more pods on
// N more nodes, the pods per node unchanged) and the same K agents started
// again. Sizes from the environment (defaults below; the machine's limits
// are in docs/performance.md).
//
//	make scale     # or: go test -run '^$' -bench ScaleContract -benchtime 1x -timeout 60m ./e2e/bench/
func BenchmarkScaleContract(b *testing.B) {
	needOurs(b)
	for range b.N {
		scaleContract(b)
	}
}

func envInt(b *testing.B, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		b.Fatalf("%s=%q: not a positive number", name, v)
	}
	return n
}

// apiCall is one request an agent made, as its proxy saw it.
type apiCall struct {
	method, path string
	query        url.Values
	bytes        int64 // answer bytes sent to the agent
}

// kind is the call's class: list, watch, get, patch, create, ...
func (c apiCall) kind() string {
	switch {
	case c.method == http.MethodGet && c.query.Get("watch") == "true":
		return "watch"
	case c.method == http.MethodGet && strings.Count(strings.Trim(c.path, "/"), "/") >= 5 && !strings.HasSuffix(c.path, "/pods"):
		return "get"
	case c.method == http.MethodGet:
		return "list"
	}
	return strings.ToLower(c.method)
}

// fromCache says whether the API server answers the call from its watch
// cache rather than a read of etcd: a list at resourceVersion 0 or
// NotOlderThan, or a watch that streams the initial state
// (sendInitialEvents, WatchList).
func (c apiCall) fromCache() bool {
	switch c.kind() {
	case "watch":
		return c.query.Get("sendInitialEvents") == "true" || c.query.Get("resourceVersion") != ""
	case "list":
		return c.query.Get("resourceVersion") == "0" || c.query.Get("resourceVersionMatch") == "NotOlderThan"
	}
	return false
}

// meteredAPI is a TLS reverse proxy in front of the API server for one
// agent, recording each request and the bytes of its answer.
type meteredAPI struct {
	url   string
	caPEM []byte
	mu    sync.Mutex
	calls []apiCall
	bytes atomic.Int64
}

type countingWriter struct {
	http.ResponseWriter
	n *atomic.Int64
	c *int64
}

func (w countingWriter) Write(p []byte) (int, error) {
	n, err := w.ResponseWriter.Write(p)
	w.n.Add(int64(n))
	atomic.AddInt64(w.c, int64(n))
	return n, err
}

func (w countingWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func newMeteredAPI(b *testing.B, api *kubetest.Server) *meteredAPI {
	b.Helper()
	target, err := url.Parse(api.Host)
	if err != nil {
		b.Fatal(err)
	}
	ca, err := os.ReadFile(api.CAFile)
	if err != nil {
		b.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.Transport = &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: true}
	rp.FlushInterval = -1 // watches stream
	m := &meteredAPI{}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.mu.Lock()
		m.calls = append(m.calls, apiCall{method: r.Method, path: r.URL.Path, query: r.URL.Query()})
		i := len(m.calls) - 1
		m.mu.Unlock()
		var n int64
		rp.ServeHTTP(countingWriter{ResponseWriter: w, n: &m.bytes, c: &n}, r)
		m.mu.Lock()
		m.calls[i].bytes = atomic.LoadInt64(&n)
		m.mu.Unlock()
	}))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	b.Cleanup(srv.Close)
	m.url = srv.URL
	m.caPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	return m
}

func (m *meteredAPI) reset() {
	m.mu.Lock()
	m.calls = nil
	m.mu.Unlock()
	m.bytes.Store(0)
}

func (m *meteredAPI) snapshot() []apiCall {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]apiCall(nil), m.calls...)
}

// scaleAgent is one agent process of the contract run, for its own node.
type scaleAgent struct {
	node    string
	dir     string
	api     *meteredAPI
	cmd     *exec.Cmd
	metrics string
	logs    *syncbuf.Buffer
	started time.Time
}

func (a *scaleAgent) start(b *testing.B) {
	b.Helper()
	writeFile(b, filepath.Join(a.dir, "sa", "ca.crt"), string(a.api.caPEM))
	a.metrics = freeAddr(b)
	a.logs = &syncbuf.Buffer{}
	a.cmd = exec.Command(env.agent,
		"--cni-bin-dir", filepath.Join(a.dir, "bin"), "--cni-conf-dir", filepath.Join(a.dir, "conf"),
		"--agent-run-dir", filepath.Join(a.dir, "run"), "--plugin-binary", env.ours,
		"--service-account-dir", filepath.Join(a.dir, "sa"), "--kube-api-server", a.api.url,
		"--health-addr", a.metrics, "--metrics-addr", a.metrics,
		"--repair-enabled", "--repair-pods", "--host-proc", "/proc", "--node-name", a.node)
	a.cmd.Stdout, a.cmd.Stderr = a.logs, a.logs
	a.started = time.Now()
	if err := a.cmd.Start(); err != nil {
		b.Fatal(err)
	}
}

func (a *scaleAgent) stop() {
	if a.cmd == nil || a.cmd.Process == nil {
		return
	}
	_ = a.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = a.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		_ = a.cmd.Process.Kill()
		<-done
	}
	a.cmd = nil
}

// scaleFigures is what one agent cost the API server at start.
type scaleFigures struct {
	lists, watches, gets, other int
	fromCache, fromEtcd         int
	bytes                       int64
	ready                       time.Duration
	rssKiB                      int64
	calls                       []apiCall
}

func scaleContract(b *testing.B) {
	pods := envInt(b, "NFTMESH_SCALE_PODS", 50000)
	nodes := envInt(b, "NFTMESH_SCALE_NODES", 500)
	agents := envInt(b, "NFTMESH_SCALE_AGENTS", 20)
	if agents > nodes {
		b.Fatalf("NFTMESH_SCALE_AGENTS=%d is more than NFTMESH_SCALE_NODES=%d", agents, nodes)
	}
	api := kubetest.Start(b)
	tok := api.ServiceAccount(b, agentNS, "nftmesh-agent")
	api.Grant(b, agentNS, "nftmesh-agent", true,
		rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch"}},
		rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "patch"}},
		rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
		rbacv1.PolicyRule{APIGroups: []string{"events.k8s.io"}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}})

	t0 := time.Now()
	fillCluster(b, api, 0, pods, 0, nodes)
	b.Logf("cluster P=%d pods over N=%d nodes created in %v", pods, nodes, time.Since(t0).Round(time.Second))

	as := make([]*scaleAgent, agents)
	for i := range as {
		dir := b.TempDir()
		for _, d := range []string{"bin", "conf", "run", "sa"} {
			if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
				b.Fatal(err)
			}
		}
		writeFile(b, filepath.Join(dir, "sa", "token"), tok)
		writeFile(b, filepath.Join(dir, "sa", "namespace"), agentNS)
		writeFile(b, filepath.Join(dir, "conf", "10-bridge.conflist"),
			`{"cniVersion":"1.0.0","name":"k8s-pod-network","plugins":[{"type":"bridge","bridge":"cni0","ipam":{"type":"host-local","subnet":"10.244.0.0/24"}}]}`)
		// The agents' nodes are spread over the first N nodes.
		as[i] = &scaleAgent{node: nodeName(i * (nodes / agents)), dir: dir, api: newMeteredAPI(b, api)}
	}
	b.Cleanup(func() {
		for _, a := range as {
			a.stop()
		}
	})

	small := runAgents(b, as)
	t0 = time.Now()
	fillCluster(b, api, pods, 2*pods, nodes, 2*nodes)
	b.Logf("cluster doubled to 2P=%d pods over 2N=%d nodes in %v", 2*pods, 2*nodes, time.Since(t0).Round(time.Second))
	big := runAgents(b, as)

	report(b, pods, nodes, small, big)
}

func nodeName(i int) string { return fmt.Sprintf("node-%04d", i) }

// runAgents starts every agent at once, waits for each to be ready with its
// node's pods listed, records what it asked and received until then, its
// time to ready and resident memory, and stops them all.
func runAgents(b *testing.B, as []*scaleAgent) []scaleFigures {
	b.Helper()
	for _, a := range as {
		a.api.reset()
	}
	for _, a := range as {
		a.start(b)
	}
	out := make([]scaleFigures, len(as))
	var wg sync.WaitGroup
	errs := make(chan error, len(as))
	for i, a := range as {
		wg.Add(1)
		go func() {
			defer wg.Done()
			deadline := time.Now().Add(5 * time.Minute)
			for !agentSynced(a.metrics) {
				if time.Now().After(deadline) || a.cmd.ProcessState != nil {
					errs <- fmt.Errorf("agent for %s not ready with its pods listed after 5m; log:\n%s", a.node, tail([]byte(a.logs.String())))
					return
				}
				time.Sleep(50 * time.Millisecond)
			}
			out[i].ready = time.Since(a.started)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	// A moment for the watch requests to settle; then the figures.
	time.Sleep(2 * time.Second)
	for i, a := range as {
		f := &out[i]
		f.calls = a.api.snapshot()
		f.bytes = a.api.bytes.Load()
		f.rssKiB = procStatus(b, a.cmd.Process.Pid, "VmHWM")
		for _, c := range f.calls {
			switch c.kind() {
			case "list":
				f.lists++
			case "watch":
				f.watches++
			case "get":
				f.gets++
			default:
				f.other++
			}
			if c.kind() == "list" || c.kind() == "watch" {
				if c.fromCache() {
					f.fromCache++
				} else {
					f.fromEtcd++
				}
				checkScoped(b, a.node, c)
			}
		}
	}
	for _, a := range as {
		a.stop()
	}
	return out
}

// checkScoped fails the benchmark for a list or watch that is not narrowed
// to the agent's own node: the contract allows no cluster-wide list or
// watch of anything (pods, namespaces, nodes).
func checkScoped(b *testing.B, node string, c apiCall) {
	sel := c.query.Get("fieldSelector")
	if strings.Contains(sel, "spec.nodeName="+node) || strings.Contains(sel, "metadata.name="+node) {
		return
	}
	b.Errorf("agent for %s: %s %s?%s is not narrowed to its node", node, c.kind(), c.path, c.query.Encode())
}

func report(b *testing.B, pods, nodes int, small, big []scaleFigures) {
	type col struct {
		name string
		get  func(scaleFigures) float64
		unit string
	}
	cols := []col{
		{"requests (list+watch+get)", func(f scaleFigures) float64 { return float64(f.lists + f.watches + f.gets + f.other) }, ""},
		{"lists", func(f scaleFigures) float64 { return float64(f.lists) }, ""},
		{"watches", func(f scaleFigures) float64 { return float64(f.watches) }, ""},
		{"from etcd (not the watch cache)", func(f scaleFigures) float64 { return float64(f.fromEtcd) }, ""},
		{"bytes received", func(f scaleFigures) float64 { return float64(f.bytes) }, "B"},
		{"time to ready", func(f scaleFigures) float64 { return f.ready.Seconds() }, "s"},
		{"peak RSS", func(f scaleFigures) float64 { return float64(f.rssKiB) / 1024 }, "MiB"},
	}
	med := func(fs []scaleFigures, g func(scaleFigures) float64) float64 {
		vs := make([]float64, len(fs))
		for i, f := range fs {
			vs[i] = g(f)
		}
		sort.Float64s(vs)
		return vs[len(vs)/2]
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "\n| per agent, median of %d (started together) | P=%d pods, N=%d nodes | 2P=%d, 2N=%d | ratio |\n|---|---|---|---|\n", len(small), pods, nodes, 2*pods, 2*nodes)
	for _, c := range cols {
		s, g := med(small, c.get), med(big, c.get)
		ratio := 1.0
		if s > 0 {
			ratio = g / s
		}
		fmt.Fprintf(&sb, "| %s | %.4g %s | %.4g %s | %.2fx |\n", c.name, s, c.unit, g, c.unit, ratio)
		// Requests, bytes and memory must not grow with the cluster.
		switch c.name {
		case "requests (list+watch+get)", "bytes received", "peak RSS":
			if ratio > 1.1 {
				b.Errorf("contract broken: %s per agent went from %.4g to %.4g (%.2fx) when the cluster doubled with the pods per node unchanged", c.name, s, g, ratio)
			}
		case "from etcd (not the watch cache)":
			if g > 0 {
				b.Errorf("contract broken: %v list/watch calls per agent read etcd instead of the watch cache", g)
			}
		}
	}
	bytes := med(big, cols[4].get)
	reqs := med(big, cols[0].get)
	fmt.Fprintf(&sb, "\nextrapolated: a 5,000-node cluster's agents starting at once send %.0f requests and receive %.1f MiB from the API server in all (per agent: %.0f requests, %.1f KiB)\n",
		reqs*5000, bytes*5000/(1<<20), reqs, bytes/1024)
	fmt.Fprintf(&sb, "calls of one agent at 2P: ")
	for _, c := range big[0].calls {
		fmt.Fprintf(&sb, "%s %s?%s (%d B, cache=%v); ", c.kind(), c.path, c.query.Encode(), c.bytes, c.fromCache())
	}
	b.Log(sb.String())
	b.ReportMetric(reqs, "req/agent")
	b.ReportMetric(bytes/1024, "KiB/agent")
	b.ReportMetric(0, "ns/op")
}

// fillCluster creates pods [from, to) spread evenly over nodes [nfrom, nto):
// on each node its share of Istio's injected httpbin pod (what an agent's
// node holds), bound by spec.nodeName (no scheduler).
func fillCluster(b *testing.B, api *kubetest.Server, from, to, nfrom, nto int) {
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
	for _, o := range objs {
		if m, s, err := istiotest.PodTemplate(o); err == nil {
			meta, spec = m, s
			break
		}
	}
	cfg := api.AdminConfig()
	cfg.QPS, cfg.Burst = 5000, 5000
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		b.Fatal(err)
	}
	const namespaces = 20
	for i := range namespaces {
		api.EnsureNamespace(b, fmt.Sprintf("scale-%d", i))
	}
	var next atomic.Int64
	next.Store(int64(from))
	var failed atomic.Value
	var wg sync.WaitGroup
	for range 48 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= to || failed.Load() != nil {
					return
				}
				pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{
					Name: fmt.Sprintf("pod-%06d", i), Namespace: fmt.Sprintf("scale-%d", i%namespaces),
					Labels: meta.Labels, Annotations: meta.Annotations,
				}}
				pod.Spec = *spec.DeepCopy()
				pod.Spec.NodeName = nodeName(nfrom + (i-from)%(nto-nfrom))
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
}
