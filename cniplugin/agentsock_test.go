package cniplugin

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/nftmesh/nftmesh/installer/podcache"
	"github.com/nftmesh/nftmesh/installer/repair"
	"github.com/nftmesh/nftmesh/internal/cnisock"
	"github.com/nftmesh/nftmesh/nft"
	"github.com/nftmesh/nftmesh/podinfo/agentsock"
	"github.com/nftmesh/nftmesh/podinfo/meshpod"
	"github.com/rs/zerolog"

	"github.com/nftmesh/nftmesh/testkit/nstest"
)

// The tests in this file run the plugin binary as the runtime does, with
// the agent's socket served in-process from a real informer over the real
// kube-apiserver, and the plugin's own API traffic counted by a proxy its
// kubeconfig points at.

// testNode is the node the test pods are scheduled to.
const testNode = "node-sock"

// countingRunDir is an agent run dir whose kubeconfig reaches the real API
// server through a TLS proxy that counts the plugin's pod reads.
func countingRunDir(t testing.TB) (string, *atomic.Int32) {
	t.Helper()
	var reads atomic.Int32
	target, err := url.Parse(env.api.Host)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	ca, err := os.ReadFile(env.api.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	pool.AppendCertsFromPEM(ca)
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.Transport = &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.URL.Path, "/pods/") {
			reads.Add(1)
		}
		rp.ServeHTTP(w, r)
	}))
	srv.StartTLS()
	t.Cleanup(srv.Close)
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	dir := t.TempDir()
	kc := fmt.Sprintf(`{"apiVersion":"v1","kind":"Config","clusters":[{"name":"c","cluster":{"server":%q,"certificate-authority-data":%q}}],`+
		`"users":[{"name":"u","user":{"token":%q}}],"contexts":[{"name":"x","context":{"cluster":"c","user":"u"}}],"current-context":"x"}`,
		srv.URL, base64.StdEncoding.EncodeToString(caPEM), env.token)
	if err := os.WriteFile(filepath.Join(dir, "kubeconfig"), []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}
	return dir, &reads
}

// agent is the agent's socket side: a node-scoped informer and the server.
type agent struct {
	stop func()
	// gets counts the agent's own API reads (pods its informer had not
	// seen in time).
	gets atomic.Int32
	// ran counts the CNI calls the agent ran for the front, by outcome.
	mu  sync.Mutex
	ran map[string]int
}

// calls is a's count of CNI calls with outcome.
func (a *agent) calls(outcome string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.ran[outcome]
}

// callsReach waits up to a second for a's count of outcome to reach want
// (the server counts a call after its reply is written, so after the
// front may have exited) and returns the count.
func (a *agent) callsReach(outcome string, want int) int {
	deadline := time.Now().Add(time.Second)
	for a.calls(outcome) < want && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	return a.calls(outcome)
}

// startAgent serves the socket in runDir until the returned agent is
// stopped (or the test ends).
func startAgent(t testing.TB, runDir string, linkerd ...*podcache.Watches) *agent {
	t.Helper()
	a := &agent{}
	client := env.api.Client()
	pods, err := repair.NodePods{Node: testNode}.Informer(client.CoreV1())
	if err != nil {
		t.Fatal(err)
	}
	get := podcache.APIGetter(client.CoreV1())
	src := podcache.New(pods.GetIndexer(), pods.HasSynced, func(ctx context.Context, ns, name string) (*corev1.Pod, error) {
		a.gets.Add(1)
		return get(ctx, ns, name)
	})
	if _, err := pods.AddEventHandler(src.Handler()); err != nil {
		t.Fatal(err)
	}
	for _, w := range linkerd {
		src.Linkerd = w
	}
	ln, err := agentsock.Listen(runDir)
	if err != nil {
		t.Fatal(err)
	}
	cniLn, err := agentsock.ListenAt(runDir, cnisock.SocketName)
	if err != nil {
		t.Fatal(err)
	}
	a.ran = map[string]int{}
	// The calls it runs log where the standalone plugin's go, so that the
	// helpers reading the decision lines (lookups) see both.
	agentLog, err := os.OpenFile(filepath.Join(runDir, LogFileName), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o640)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { agentLog.Close() })
	calls := &Server{RunDir: runDir, Resolver: src, AllowUID: agentsock.PeerUID, HostNetns: hostKnown, Log: AgentLog(agentLog, zerolog.DebugLevel), Observe: func(o agentsock.Outcome) {
		a.mu.Lock()
		a.ran[o.Status]++
		a.mu.Unlock()
	}}
	ctx, cancel := context.WithCancel(context.Background())
	go pods.RunWithContext(ctx)
	for _, w := range linkerd {
		go w.Run(ctx)
	}
	done := make(chan error, 2)
	go func() { done <- (&agentsock.Server{Resolver: src, AllowUID: agentsock.PeerUID}).Serve(ctx, ln) }()
	go func() { done <- calls.Serve(ctx, cniLn) }()
	if !cache.WaitForCacheSync(ctx.Done(), pods.HasSynced) {
		t.Fatal("informer did not sync")
	}
	var once sync.Once
	a.stop = func() {
		once.Do(func() {
			cancel()
			for range 2 {
				if err := <-done; err != nil {
					t.Errorf("agent socket: %v", err)
				}
			}
		})
	}
	t.Cleanup(a.stop)
	return a
}

// nodePod is a pod of testdata/pods/file scheduled to testNode, stored in
// the API.
func nodePod(t testing.TB, file string) *corev1.Pod {
	t.Helper()
	p := loadPod(t, file)
	p.Spec.NodeName = testNode
	return createPod(t, env.api, p)
}

// lookups reads the lookup field of the plugin's decision lines in runDir,
// by pod name.
func lookups(t testing.TB, runDir string) map[string]string {
	t.Helper()
	f, err := os.Open(filepath.Join(runDir, LogFileName))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	got := map[string]string{}
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var e struct{ Pod, Decision, Lookup, AgentMiss string }
		var raw map[string]any
		if json.Unmarshal(sc.Bytes(), &raw) != nil || raw["decision"] == nil {
			continue
		}
		e.Pod, _ = raw["pod"].(string)
		e.Lookup, _ = raw["lookup"].(string)
		e.AgentMiss, _ = raw["agent_miss"].(string)
		got[e.Pod] = e.Lookup
		if e.AgentMiss != "" {
			got[e.Pod+"/miss"] = e.AgentMiss
		}
	}
	return got
}

// addExec runs the plugin binary's ADD for pod in a fresh netns and
// returns the netns path.
func addExec(t *testing.T, runDir string, pod *corev1.Pod) (string, error) {
	t.Helper()
	_, nsPath := nstest.New(t, "cni-sock-")
	conf := directConf(t, "1.0.0", runDir, prevResultV4("1.0.0", "198.51.100.40/24"), nil)
	id := "ctr-" + nstest.RandHex(6)
	out, stderr, err := execPlugin("ADD", nsPath, id, cniArgsFor(pod, id), conf)
	if err != nil {
		return nsPath, fmt.Errorf("ADD of %s: %v\n%s\n%s", pod.Name, err, out, stderr)
	}
	return nsPath, nil
}

// TestAgentSocketNoAPIReads: with the agent up, ADDs of mesh and plain
// pods (one created a moment before its ADD) read nothing from the API
// server: each decision line says lookup=agent, the proxy counts 0 pod
// reads, and the mesh pods have exactly their planned rules.
func TestAgentSocketNoAPIReads(t *testing.T) {
	needEnv(t)
	runDir, reads := countingRunDir(t)
	ag := startAgent(t, runDir)
	mesh := []*corev1.Pod{nodePod(t, "injected.yaml"), nodePod(t, "native-sidecar.yaml")}
	plain := nodePod(t, "no-sidecar.yaml")
	time.Sleep(200 * time.Millisecond) // the informer has them
	for _, p := range append(mesh, plain) {
		ns, err := addExec(t, runDir, p)
		if err != nil {
			t.Fatal(err)
		}
		if p != plain {
			if err := nft.New().Check(context.Background(), ns, wantPlan(t, p, false)); err != nil {
				t.Fatalf("rules of %s: %v", p.Name, err)
			}
		} else {
			assertNoRules(t, ns)
		}
	}
	// Created a moment ago: the ADD starts right after the create returns,
	// before or while the watch brings the pod to the agent.
	fresh := nodePod(t, "injected.yaml")
	ns, err := addExec(t, runDir, fresh)
	if err != nil {
		t.Fatal(err)
	}
	if err := nft.New().Check(context.Background(), ns, wantPlan(t, fresh, false)); err != nil {
		t.Fatalf("rules of the fresh pod: %v", err)
	}
	got := lookups(t, runDir)
	for _, p := range append(mesh, plain, fresh) {
		if got[p.Name] != lookupAgent {
			t.Errorf("pod %s: lookup=%q (%s), want agent", p.Name, got[p.Name], got[p.Name+"/miss"])
		}
	}
	if n := reads.Load(); n != 0 {
		t.Errorf("the plugin read pods from the API %d times with the agent up, want 0", n)
	}
	// The front handed every call to the agent, which ran it: no
	// standalone plugin ran.
	if want := len(mesh) + 2; ag.callsReach(agentsock.OutcomeOK, want) != want {
		n := ag.calls(agentsock.OutcomeOK)
		t.Errorf("the agent ran %d ADDs for the front (declined %d, bad %d), want %d", n, ag.calls(agentsock.OutcomeDeclined), ag.calls(agentsock.OutcomeBadRequest), want)
	}
	t.Logf("agent API reads for pods its informer had not seen in time: %d", ag.gets.Load())
}

// TestAgentSocketDownFallsBack: with no agent on the socket (never
// started, or gone leaving its socket file), ADD reads the pod from the
// API itself and captures as before.
func TestAgentSocketDownFallsBack(t *testing.T) {
	needEnv(t)
	runDir, reads := countingRunDir(t)
	ag := startAgent(t, runDir)
	ag.stop()
	p := nodePod(t, "injected.yaml")
	ns, err := addExec(t, runDir, p)
	if err != nil {
		t.Fatal(err)
	}
	if err := nft.New().Check(context.Background(), ns, wantPlan(t, p, false)); err != nil {
		t.Fatalf("rules: %v", err)
	}
	if got := lookups(t, runDir); got[p.Name] != lookupAPI || !strings.Contains(got[p.Name+"/miss"], "no agent") {
		t.Fatalf("lookup=%q agent_miss=%q, want api after no agent", got[p.Name], got[p.Name+"/miss"])
	}
	if reads.Load() == 0 {
		t.Fatal("the fallback read no pod from the API")
	}
	if n := ag.calls(agentsock.OutcomeOK) + ag.calls(agentsock.OutcomeError); n != 0 {
		t.Fatalf("a stopped agent ran %d calls", n)
	}
}

// TestAgentRestartMidBurst: the agent stops and a new one starts while a
// burst of ADDs runs: one group is in flight when the agent stops, the next
// runs with no agent, another is in flight when the new agent starts, the
// last runs after it. Every ADD succeeds (through an agent or the
// fallback) and every mesh pod has exactly its rules: none fails open.
func TestAgentRestartMidBurst(t *testing.T) {
	needEnv(t)
	runDir, _ := countingRunDir(t)
	ag := startAgent(t, runDir)
	const n = 28 // 8 in flight at the stop, 8 without agent, 8 at the start, 4 after
	pods := make([]*corev1.Pod, n)
	nss := make([]string, n)
	for i := range pods {
		pods[i] = nodePod(t, "injected.yaml")
		_, nss[i] = nstest.New(t, "cni-sock-")
	}
	time.Sleep(200 * time.Millisecond)
	conf := directConf(t, "1.0.0", runDir, prevResultV4("1.0.0", "198.51.100.40/24"), nil)
	errs := make([]error, n)
	var wg sync.WaitGroup
	launch := func(from, to int) {
		for i := from; i < to; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				id := "ctr-" + nstest.RandHex(6)
				if out, stderr, err := execPlugin("ADD", nss[i], id, cniArgsFor(pods[i], id), conf); err != nil {
					errs[i] = fmt.Errorf("ADD of %s: %v\n%s\n%s", pods[i].Name, err, out, stderr)
				}
			}()
		}
	}
	launch(0, 8)
	ag.stop()
	launch(8, 16)
	wg.Wait()
	launch(16, 24)
	startAgent(t, runDir)
	wg.Wait()
	launch(24, n)
	wg.Wait()

	got := lookups(t, runDir)
	paths := map[string]int{}
	for i, p := range pods {
		if errs[i] != nil {
			t.Errorf("ADD %d: %v", i, errs[i])
			continue
		}
		paths[got[p.Name]]++
		if err := nft.New().Check(context.Background(), nss[i], wantPlan(t, p, false)); err != nil {
			t.Errorf("pod %s (lookup=%s): %v", p.Name, got[p.Name], err)
		}
		switch {
		case i >= 8 && i < 16 && got[p.Name] != lookupAPI:
			t.Errorf("ADD %d ran with no agent but says lookup=%q", i, got[p.Name])
		case i >= 24 && got[p.Name] != lookupAgent:
			t.Errorf("ADD %d ran after the new agent started but says lookup=%q (%s)", i, got[p.Name], got[p.Name+"/miss"])
		}
	}
	t.Logf("lookups: %v", paths)
	if paths[lookupAgent]+paths[lookupAPI] != n {
		t.Fatalf("lookup paths %v, want all %d ADDs through the agent or the API", paths, n)
	}
}

// BenchmarkPluginAddAgent alternates mesh ADDs (whole plugin process, fresh
// netns each) answered by the agent's socket with ADDs that read the pod
// from the API themselves (another run dir, no agent), so
// the two paths are compared in one interleaved loop. It reports each
// path's p50 and the plugin's API reads on the agent path (want 0).
//
//	go test -run '^$' -bench BenchmarkPluginAddAgent -benchtime=100x ./cniplugin
func BenchmarkPluginAddAgent(b *testing.B) {
	needEnv(b)
	withAgent, reads := countingRunDir(b)
	startAgent(b, withAgent)
	without := agentRunDir(b, env.token)
	type target struct {
		pod   *corev1.Pod
		netns string
	}
	targets := make([]target, b.N)
	for i := range targets {
		_, path := nstest.New(b, "cni-bench-")
		targets[i] = target{pod: nodePod(b, "injected.yaml"), netns: path}
	}
	confs := [2][]byte{
		directConf(b, "1.0.0", withAgent, prevResultV4("1.0.0", "198.51.100.30/24"), nil),
		directConf(b, "1.0.0", without, prevResultV4("1.0.0", "198.51.100.30/24"), nil),
	}
	var times [2][]time.Duration
	time.Sleep(time.Second)
	b.ResetTimer()
	for i := range b.N {
		path := i % 2
		id := "ctr-" + nstest.RandHex(6)
		start := time.Now()
		out, stderr, err := execPlugin("ADD", targets[i].netns, id, cniArgsFor(targets[i].pod, id), confs[path])
		times[path] = append(times[path], time.Since(start))
		if err != nil {
			b.Fatalf("ADD: %v\n%s\n%s", err, out, stderr)
		}
	}
	b.StopTimer()
	med := func(v []time.Duration) float64 {
		if len(v) == 0 {
			return 0
		}
		slices.Sort(v)
		return float64(v[len(v)/2].Microseconds()) / 1000
	}
	a, g := med(times[0]), med(times[1])
	b.ReportMetric(a, "agent-p50-ms")
	b.ReportMetric(g, "api-p50-ms")
	if g > 0 {
		b.ReportMetric(a/g, "agent/api")
	}
	b.ReportMetric(float64(reads.Load()), "api-reads-agent-path")
	reportLookup(b, filepath.Join(withAgent, LogFileName))
	got := lookups(b, withAgent)
	for i := 0; i < b.N; i += 2 {
		if p := targets[i].pod.Name; got[p] != lookupAgent {
			b.Fatalf("pod %s on the agent path: lookup=%q (%s)", p, got[p], got[p+"/miss"])
		}
	}
}

// TestAgentWrongAnswerNeverUsed: an "agent" on the socket that answers
// about another UID (a stale cache, a bug, a forgery) or with garbage is
// never believed: the plugin reads the pod from the API and captures by the
// API's answer, saying why in agent_miss.
func TestAgentWrongAnswerNeverUsed(t *testing.T) {
	needEnv(t)
	for name, answer := range map[string]func(req agentsock.Request) []byte{
		"another UID": func(req agentsock.Request) []byte {
			// Claims the pod is not injected, under an older UID.
			b, _ := json.Marshal(agentsock.Found("0ld-uid", &meshpod.Pod{Namespace: req.Namespace, Name: req.Name}))
			return b
		},
		"garbage": func(agentsock.Request) []byte { return []byte(`{"v":1,"status":"found","pod":7}`) },
	} {
		t.Run(name, func(t *testing.T) {
			runDir, reads := countingRunDir(t)
			dir := filepath.Join(runDir, agentsock.DirName)
			if err := os.Mkdir(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			ln, err := net.Listen("unix", agentsock.Path(runDir))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { ln.Close() })
			go func() {
				for {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					var hdr [4]byte
					_, _ = io.ReadFull(c, hdr[:])
					body := make([]byte, binary.BigEndian.Uint32(hdr[:])&0xfff)
					_, _ = io.ReadFull(c, body)
					var req agentsock.Request
					_ = json.Unmarshal(body, &req)
					out := answer(req)
					_, _ = c.Write(append(binary.BigEndian.AppendUint32(nil, uint32(len(out))), out...))
					c.Close()
				}
			}()
			p := nodePod(t, "injected.yaml")
			ns, err := addExec(t, runDir, p)
			if err != nil {
				t.Fatal(err)
			}
			if err := nft.New().Check(context.Background(), ns, wantPlan(t, p, false)); err != nil {
				t.Fatalf("rules: %v", err)
			}
			got := lookups(t, runDir)
			if got[p.Name] != lookupAPI || !strings.Contains(got[p.Name+"/miss"], "answer") || reads.Load() == 0 {
				t.Fatalf("lookup=%q agent_miss=%q after %d API reads; want the API's answer used", got[p.Name], got[p.Name+"/miss"], reads.Load())
			}
		})
	}
}
