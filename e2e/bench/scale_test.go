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
	bytes        int64 // answer bytes sent to the agent (as on the wire: gzip when the server compressed)
}

// kind is the call's class: list, watch, get, or the method (create,
// patch, ...). The path is a resource path: /api/v1/... or
// /apis/GROUP/VERSION/..., then [namespaces/NS/]RESOURCE[/NAME[/SUB]]; a
// GET of the collection is a list, or a watch with watch=true (or 1); a
// GET of a named object is a get.
func (c apiCall) kind() string {
	segs := strings.Split(strings.Trim(c.path, "/"), "/")
	switch {
	case len(segs) >= 2 && segs[0] == "api":
		segs = segs[2:]
	case len(segs) >= 3 && segs[0] == "apis":
		segs = segs[3:]
	default:
		segs = nil // not a resource path (/version, /healthz, ...)
	}
	if len(segs) >= 3 && segs[0] == "namespaces" {
		segs = segs[2:] // a namespaced resource
	}
	if c.method != http.MethodGet {
		return strings.ToLower(c.method)
	}
	if len(segs) != 1 {
		return "get"
	}
	if w := c.query.Get("watch"); w == "true" || w == "1" {
		return "watch"
	}
	return "list"
}

// streaming says whether a watch is a streaming list (WatchList): it sends
// the current objects as initial events, served from the watch cache.
func (c apiCall) streaming() bool {
	return c.kind() == "watch" && c.query.Get("sendInitialEvents") == "true" &&
		c.query.Get("resourceVersionMatch") == string(metav1.ResourceVersionMatchNotOlderThan)
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
	exited  chan struct{} // closed when the process has ended (and been waited for)
	metrics string
	logs    *syncbuf.Buffer
	started time.Time
}

// prepare builds the agent's command; start runs it. They are apart so
// that every agent of a run is started in one tight loop, together.
func (a *scaleAgent) prepare(b *testing.B) {
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
	a.exited = make(chan struct{})
}

func (a *scaleAgent) start() error {
	a.started = time.Now()
	if err := a.cmd.Start(); err != nil {
		close(a.exited)
		return fmt.Errorf("starting the agent for %s: %w", a.node, err)
	}
	go func(cmd *exec.Cmd, exited chan struct{}) { _ = cmd.Wait(); close(exited) }(a.cmd, a.exited)
	return nil
}

// listed says whether the agent has its node's pods listed: its repair
// controller logs that it started only once its pod informer has synced
// (cache.WaitForCacheSync), i.e. the initial list, paged or streamed, is
// in. (nftmesh_repair_api_reachable turns 1 on the first successful call,
// which for a streaming list is when the stream opens, before any pod.)
func (a *scaleAgent) listed() bool {
	return strings.Contains(a.logs.String(), "repair controller started") && agentSynced(a.metrics)
}

func (a *scaleAgent) stop() {
	if a.cmd == nil || a.cmd.Process == nil {
		return
	}
	_ = a.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-a.exited:
	case <-time.After(15 * time.Second):
		_ = a.cmd.Process.Kill()
		<-a.exited
	}
	a.cmd = nil
}

// scaleFigures is what one agent cost the API server at start.
type scaleFigures struct {
	lists, watches, gets, other int
	streamed                    int // watches that were streaming lists (WatchList)
	bytes                       int64
	ready                       time.Duration
	rssKiB                      int64
	calls                       []apiCall
}

// scaleRun is one start of the K agents: each agent's figures, and what
// the API server itself counted meanwhile (see serverCounters).
type scaleRun struct {
	agents []scaleFigures
	server map[string]float64 // counter deltas over the run, all agents together
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

	small := runAgents(b, api, as)
	t0 = time.Now()
	fillCluster(b, api, pods, 2*pods, nodes, 2*nodes)
	b.Logf("cluster doubled to 2P=%d pods over 2N=%d nodes in %v", 2*pods, 2*nodes, time.Since(t0).Round(time.Second))
	big := runAgents(b, api, as)

	report(b, pods, nodes, small, big)
}

func nodeName(i int) string { return fmt.Sprintf("node-%04d", i) }

// runAgents starts every agent at once, waits for each to be ready with its
// node's pods listed, records what it asked and received until then, its
// time to ready and resident memory, and stops them all. The API server's
// own counters are read before and after (nothing else talks to it
// meanwhile), which says where the agents' calls were served from.
func runAgents(b *testing.B, api *kubetest.Server, as []*scaleAgent) scaleRun {
	b.Helper()
	for _, a := range as {
		a.api.reset()
		a.prepare(b)
	}
	before := serverCounters(b, api)
	// Together: one tight loop of fork+exec, nothing else in between.
	for _, a := range as {
		if err := a.start(); err != nil {
			b.Fatal(err)
		}
	}
	out := make([]scaleFigures, len(as))
	var wg sync.WaitGroup
	errs := make(chan error, len(as))
	for i, a := range as {
		wg.Add(1)
		go func() {
			defer wg.Done()
			deadline := time.Now().Add(10 * time.Minute)
			for !a.listed() {
				select {
				case <-a.exited:
					errs <- fmt.Errorf("agent for %s exited before it was ready; log:\n%s", a.node, tail([]byte(a.logs.String())))
					return
				default:
				}
				if time.Now().After(deadline) {
					errs <- fmt.Errorf("agent for %s not ready with its pods listed after 10m; log:\n%s", a.node, tail([]byte(a.logs.String())))
					return
				}
				time.Sleep(20 * time.Millisecond)
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
				checkScoped(b, a.node, c)
			case "watch":
				f.watches++
				if c.streaming() {
					f.streamed++
				}
				checkScoped(b, a.node, c)
			case "get":
				f.gets++
			default:
				f.other++
			}
		}
	}
	after := serverCounters(b, api)
	for _, a := range as {
		a.stop()
	}
	delta := map[string]float64{}
	for k, v := range after {
		if d := v - before[k]; d != 0 {
			delta[k] = d
		}
	}
	return scaleRun{agents: out, server: delta}
}

// serverCounters reads the API server's own metrics of pod reads: where
// each LIST was served from and how many objects it read, and how the
// watches were served. This is how the benchmark tells which calls read
// etcd, rather than guessing from the request: in Kubernetes 1.35 a list
// is answered from the watch cache when it can be (resourceVersion=0 or
// NotOlderThan, a paged or exact read from the cache's snapshots, and a
// consistent read (no resourceVersion) too, but only when etcd supports
// watch progress requests: etcd >= 3.4.31 / 3.5.13), else from etcd; a
// watch is always served from the watch cache (a streaming list's initial
// events as well, but the server refuses a streaming list when etcd lacks
// watch progress requests, and the reflector then lists). The counters:
//   - etcd_requests_total{resource="pods"} by operation: "list" is a range
//     read (a LIST served from etcd), "get" a single-key read (the
//     cache's probe of the current version before a consistent read or
//     a streaming list; apiserver_storage_list_total counts it as well);
//   - apiserver_storage_list_fetched_objects_total{resource="pods"}: the
//     pods LISTs read from etcd (all of the cluster's for a node's);
//   - apiserver_cache_list_total{resource="pods"} (by index): LISTs served
//     from the watch cache;
//   - apiserver_watch_cache_consistent_read_total{resource="pods"}:
//     consistent reads the cache served (fallback="true": it fell back
//     to etcd);
//   - apiserver_request_total{resource="pods"} by verb: what was asked.
//
// Each series is a sum over all agents of the run (the server cannot tell
// them apart); nothing else reads pods meanwhile.
func serverCounters(b *testing.B, api *kubetest.Server) map[string]float64 {
	b.Helper()
	raw, err := api.Client().CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(context.Background())
	if err != nil {
		b.Fatalf("reading the API server's metrics: %v", err)
	}
	out := map[string]float64{}
	for _, line := range strings.Split(string(raw), "\n") {
		if line == "" || line[0] == '#' {
			continue
		}
		name, _, _ := strings.Cut(line, "{")
		switch name {
		case "apiserver_storage_list_total", "apiserver_storage_list_fetched_objects_total", "apiserver_cache_list_total",
			"apiserver_watch_cache_consistent_read_total", "etcd_requests_total", "apiserver_request_total":
		default:
			continue
		}
		if !strings.Contains(line, `="pods"`) && !strings.Contains(line, `="/pods"`) {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			b.Fatalf("API server metric line %q: %v", line, err)
		}
		key := line[:i]
		if name == "apiserver_request_total" {
			// Only the verb and the code matter here.
			key = name + "{" + labelOf(line, "verb") + "," + labelOf(line, "code") + "}"
		}
		out[key] += v
	}
	return out
}

// labelOf returns `name="value"` of a metric line, or "".
func labelOf(line, name string) string {
	i := strings.Index(line, name+`="`)
	if i < 0 {
		return ""
	}
	j := strings.IndexByte(line[i+len(name)+2:], '"')
	if j < 0 {
		return ""
	}
	return line[i : i+len(name)+2+j+1]
}

// sumOf sums the series of m whose key starts with prefix and holds every
// one of labels.
func sumOf(m map[string]float64, prefix string, labels ...string) float64 {
	var sum float64
next:
	for k, v := range m {
		if !strings.HasPrefix(k, prefix) {
			continue
		}
		for _, l := range labels {
			if !strings.Contains(k, l) {
				continue next
			}
		}
		sum += v
	}
	return sum
}

// checkScoped fails the benchmark for a list or watch that is not narrowed
// to the agent's own node: the contract allows no cluster-wide list or
// watch of anything (pods, namespaces, nodes). A term of the field
// selector must be exactly the node's (a pod's spec.nodeName, or the
// node's own metadata.name for a list or watch of nodes).
func checkScoped(b *testing.B, node string, c apiCall) {
	if !scopedTo(node, c) {
		b.Errorf("agent for %s: %s %s?%s is not narrowed to its node", node, c.kind(), c.path, c.query.Encode())
	}
}

func scopedTo(node string, c apiCall) bool {
	nodes := strings.HasSuffix(c.path, "/nodes")
	for _, term := range strings.Split(c.query.Get("fieldSelector"), ",") {
		if (!nodes && term == "spec.nodeName="+node) || (nodes && term == "metadata.name="+node) {
			return true
		}
	}
	return false
}

func report(b *testing.B, pods, nodes int, small, big scaleRun) {
	k := float64(len(small.agents))
	type col struct {
		name  string
		get   func(scaleFigures) float64
		unit  string
		check bool // must not grow over 1.1x with the cluster
	}
	cols := []col{
		{"requests (all)", func(f scaleFigures) float64 { return float64(f.lists + f.watches + f.gets + f.other) }, "", true},
		{"lists", func(f scaleFigures) float64 { return float64(f.lists) }, "", true},
		{"watches", func(f scaleFigures) float64 { return float64(f.watches) }, "", true},
		{"of which streaming lists (WatchList)", func(f scaleFigures) float64 { return float64(f.streamed) }, "", false},
		{"gets and writes", func(f scaleFigures) float64 { return float64(f.gets + f.other) }, "", true},
		{"bytes received", func(f scaleFigures) float64 { return float64(f.bytes) / 1024 }, "KiB", true},
		{"time to ready (pods listed)", func(f scaleFigures) float64 { return f.ready.Seconds() }, "s", false},
		{"peak RSS", func(f scaleFigures) float64 { return float64(f.rssKiB) / 1024 }, "MiB", true},
	}
	med := func(fs []scaleFigures, g func(scaleFigures) float64) float64 {
		vs := make([]float64, len(fs))
		for i, f := range fs {
			vs[i] = g(f)
		}
		sort.Float64s(vs)
		return vs[len(vs)/2]
	}
	maxOf := func(fs []scaleFigures, g func(scaleFigures) float64) float64 {
		m := 0.0
		for _, f := range fs {
			m = max(m, g(f))
		}
		return m
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "\n| per agent, median (max) of %d started together | P=%d pods, N=%d nodes | 2P=%d, 2N=%d | ratio |\n|---|---|---|---|\n",
		len(small.agents), pods, nodes, 2*pods, 2*nodes)
	row := func(name, unit string, s, g float64, sMax, gMax float64, check bool) {
		ratio := 1.0
		if s > 0 {
			ratio = g / s
		} else if g > 0 {
			ratio = g
		}
		fmt.Fprintf(&sb, "| %s | %.4g (%.4g) %s | %.4g (%.4g) %s | %.2fx |\n", name, s, sMax, unit, g, gMax, unit, ratio)
		if check && ratio > 1.1 {
			b.Errorf("contract broken: %s per agent went from %.4g to %.4g (%.2fx) when the cluster doubled with the pods per node unchanged", name, s, g, ratio)
		}
	}
	for _, c := range cols {
		row(c.name, c.unit, med(small.agents, c.get), med(big.agents, c.get), maxOf(small.agents, c.get), maxOf(big.agents, c.get), c.check)
	}
	// What the API server counted, over all K agents (it cannot tell them
	// apart), per agent.
	server := []struct {
		name, prefix string
		labels       []string
	}{
		{"pod range reads of etcd (server's count / K)", "etcd_requests_total", []string{`resource="pods"`, `operation="list"`}},
		{"pods read from etcd (server's count / K)", "apiserver_storage_list_fetched_objects_total", []string{`resource="pods"`}},
		{"pod LISTs from the watch cache (server's count / K)", "apiserver_cache_list_total", []string{`resource="pods"`}},
		{"single-key etcd reads: the cache's current-version probe (server's count / K)", "etcd_requests_total", []string{`resource="pods"`, `operation="get"`}},
	}
	for _, r := range server {
		s, g := sumOf(small.server, r.prefix, r.labels...)/k, sumOf(big.server, r.prefix, r.labels...)/k
		fmt.Fprintf(&sb, "| %s | %.4g | %.4g | |\n", r.name, s, g)
	}
	// A streaming list, or a list at the most recent version served from
	// the cache, first reads the current version from etcd: one
	// single-key read of the resource's prefix that finds nothing (it
	// counts in apiserver_storage_list_total too, with no object fetched).
	// A list served from etcd is range reads that fetch pods.
	for _, run := range []struct {
		name string
		r    scaleRun
	}{{"P", small}, {"2P", big}} {
		if n, o := sumOf(run.r.server, "etcd_requests_total", `resource="pods"`, `operation="list"`), sumOf(run.r.server, "apiserver_storage_list_fetched_objects_total", `resource="pods"`); n > 0 || o > 0 {
			b.Errorf("contract broken: at %s the agents' pod lists read etcd, not the watch cache (%v range reads, %v pods read)", run.name, n, o)
		}
	}
	reqs := med(big.agents, cols[0].get)
	kib := med(big.agents, cols[5].get)
	fmt.Fprintf(&sb, "\nextrapolated: a 5,000-node cluster (%d pods per node) whose agents all start at once sends its API server %.0f requests and receives %.1f MiB (per agent: %.0f requests, %.1f KiB)\n",
		pods/nodes, reqs*5000, kib*5000/1024, reqs, kib)
	fmt.Fprintf(&sb, "\nthe API server's counters over the 2P run, all agents:\n")
	keys := make([]string, 0, len(big.server))
	for key := range big.server {
		keys = append(keys, key)
	}
	sort.Strings(keys)
	for _, key := range keys {
		fmt.Fprintf(&sb, "  %s %v\n", key, big.server[key])
	}
	fmt.Fprintf(&sb, "calls of one agent (%d) at 2P:\n", len(big.agents[0].calls))
	for _, c := range big.agents[0].calls {
		fmt.Fprintf(&sb, "  %s %s?%s (%d B)\n", c.kind(), c.path, c.query.Encode(), c.bytes)
	}
	b.Log(sb.String())
	b.ReportMetric(reqs, "req/agent")
	b.ReportMetric(kib, "KiB/agent")
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

// TestScaleCallKind checks the benchmark's own reading of the agents'
// requests: a wrong class would let a cluster-wide list through unchecked
// (a GET of a named node was once counted as a list).
func TestScaleCallKind(t *testing.T) {
	q := func(s string) url.Values {
		v, err := url.ParseQuery(s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	for _, tc := range []struct {
		method, path, query string
		kind                string
		streaming           bool
		scoped              bool // to node-0001
	}{
		{"GET", "/api/v1/pods", "fieldSelector=spec.nodeName%3Dnode-0001&limit=100", "list", false, true},
		{"GET", "/api/v1/pods", "fieldSelector=spec.nodeName%3Dnode-00010", "list", false, false},
		{"GET", "/api/v1/pods", "fieldSelector=spec.nodeName%3Dnode-0001&watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true", "watch", true, true},
		{"GET", "/api/v1/pods", "watch=1&resourceVersion=12", "watch", false, false},
		{"GET", "/api/v1/namespaces/scale-1/pods", "", "list", false, false},
		{"GET", "/api/v1/namespaces/scale-1/pods/pod-000001", "", "get", false, false},
		{"GET", "/api/v1/nodes/node-0001", "", "get", false, false},
		{"GET", "/api/v1/nodes", "fieldSelector=metadata.name%3Dnode-0001", "list", false, true},
		{"GET", "/api/v1/nodes", "fieldSelector=spec.nodeName%3Dnode-0001", "list", false, false},
		{"GET", "/api/v1/namespaces", "watch=true", "watch", false, false},
		{"GET", "/api/v1/namespaces/scale-1", "", "get", false, false},
		{"GET", "/apis/events.k8s.io/v1/events", "", "list", false, false},
		{"POST", "/apis/events.k8s.io/v1/namespaces/nftmesh/events", "", "post", false, false},
		{"PATCH", "/api/v1/nodes/node-0001/status", "", "patch", false, false},
	} {
		c := apiCall{method: tc.method, path: tc.path, query: q(tc.query)}
		if got := c.kind(); got != tc.kind {
			t.Errorf("%s %s?%s: kind %q, want %q", tc.method, tc.path, tc.query, got, tc.kind)
		}
		if got := c.streaming(); got != tc.streaming {
			t.Errorf("%s %s?%s: streaming %v, want %v", tc.method, tc.path, tc.query, got, tc.streaming)
		}
		if got := scopedTo("node-0001", c); got != tc.scoped {
			t.Errorf("%s %s?%s: scoped to node-0001 %v, want %v", tc.method, tc.path, tc.query, got, tc.scoped)
		}
	}
}
