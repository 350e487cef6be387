package node

import (
	"bufio"
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
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftmesh/nftmesh/nft"
	"github.com/nftmesh/nftmesh/podinfo"
	"github.com/nftmesh/nftmesh/redirect"
	"github.com/nftmesh/nftmesh/testkit/cnitest"
	"github.com/nftmesh/nftmesh/testkit/kubetest"
	"github.com/nftmesh/nftmesh/testkit/nstest"
	"github.com/nftmesh/nftmesh/testkit/syncbuf"
)

// The flood and what the agent may spend on it (issue 29).
const (
	floodConns     = 12000 // idle keep-alive connections tried at once
	floodAttackers = 2     // processes of user nobody holding them
	floodRate      = 4000  // connections the attackers open per second at most, together
	maxAgentFDs    = 2500
	maxRSSGrowth   = 48 << 20
	maxProbe       = 2 * time.Second // kubelet's probe must be answered within
	floodHold      = 6 * time.Second // the flood at full strength, after its ramp
	agentHealth    = "127.0.0.1:8000"
	agentMetrics   = "127.0.0.1:15014"
)

// TestMain runs this test binary as an attacker when the test starts it so
// (attack); otherwise it runs the tests.
func TestMain(m *testing.M) {
	if os.Getenv(attackEnv) != "" {
		attack()
		return
	}
	os.Exit(m.Run())
}

// TestHeldConnectionFlood: processes of user nobody try to hold 12,000
// idle keep-alive connections (one GET each, then silence; a connection the
// agent closes is opened again) against the agent's health and metrics
// ports, on the node's network namespace. Meanwhile the agent keeps at most
// maxAgentFDs descriptors and grows by at most 48 MiB, /healthz answers a
// probe (as kubelet's: a new connection each time) within 2 s, and a
// runtime's ADD and DEL through the conflist (the nftmesh-cni front, which
// hands them to the agent or runs the standalone plugin) succeed on real
// pod namespaces. Before the servers were bounded, the agent held every
// connection: ~12,000 descriptors and ~250 MB.
func TestHeldConnectionFlood(t *testing.T) {
	needEnv(t)
	n := startFloodNode(t)
	// Warm up what a pod start allocates, so it is not counted as the
	// flood's; then the agent's usage before the flood.
	if err := n.addDel(t, "warm-"); err != nil {
		t.Fatalf("ADD/DEL before the flood: %v", err)
	}
	if code, err := n.get(agentMetrics, "/metrics"); err != nil || code != http.StatusOK {
		t.Fatalf("/metrics before the flood: %d %v", code, err)
	}
	time.Sleep(500 * time.Millisecond)
	fds0, rss0 := n.usage()
	t.Logf("agent before the flood: %d descriptors, RSS %.1f MiB", fds0, float64(rss0)/(1<<20))

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var peakFDs, peakRSS atomic.Int64
	wg.Add(2)
	go func() { defer wg.Done(); n.sample(stop, &peakFDs, &peakRSS) }()
	var probes probeStats
	go func() { defer wg.Done(); n.probe(stop, &probes) }()
	attackers := startAttackers(t, n.netns)

	// The ramp: until the attackers have opened the flood's connections,
	// or 10 s (a server that stops accepting leaves them in the listen
	// backlog, then their connects time out).
	ramp := time.Now()
	for sumOpened(attackers) < floodConns && time.Since(ramp) < 10*time.Second {
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("attackers opened %d connections in %v", sumOpened(attackers), time.Since(ramp).Round(time.Millisecond))
	full := time.Now()
	var callErrs []string
	for i := 0; time.Since(full) < floodHold; i++ {
		if err := n.addDel(t, fmt.Sprintf("flood%d-", i)); err != nil {
			callErrs = append(callErrs, err.Error())
		}
		time.Sleep(200 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	status := attackerStatus(attackers)
	fds, rss := peakFDs.Load(), peakRSS.Load()
	t.Logf("under the flood: attackers %s", status)
	t.Logf("agent peak: %d descriptors, RSS %.1f MiB (+%.1f MiB); /healthz: %d probes, slowest %v, %d failed",
		fds, float64(rss)/(1<<20), float64(rss-rss0)/(1<<20), probes.n, probes.slowest.Round(time.Millisecond), len(probes.failed))
	t.Logf("pod starts by path (the agent's own count): %s", n.byPath())
	if fds > maxAgentFDs {
		t.Errorf("the agent held %d descriptors under the flood, want at most %d", fds, maxAgentFDs)
	}
	if rss-rss0 > maxRSSGrowth {
		t.Errorf("the agent's RSS grew by %.1f MiB under the flood, want at most %d MiB", float64(rss-rss0)/(1<<20), maxRSSGrowth>>20)
	}
	if len(probes.failed) > 0 || probes.slowest > maxProbe {
		t.Errorf("/healthz under the flood: slowest answer %v (want < %v), failures %q", probes.slowest, maxProbe, probes.failed)
	}
	if opened := sumOpened(attackers); opened < floodConns/2 {
		t.Errorf("the attackers opened only %d connections: not the flood meant", opened)
	}
	if probes.n < 5 {
		t.Errorf("only %d probes ran", probes.n)
	}
	if len(callErrs) > 0 {
		t.Errorf("ADD/DEL under the flood failed: %q", callErrs)
	}
}

// floodNode is a node in a network namespace of its own: the agent (as the
// DaemonSet runs it, its ports on the node's loopback as in the pod
// network), the API server forwarded in, the bridge conflist the agent
// chained itself into.
type floodNode struct {
	netns, bin, cache string
	agent             *exec.Cmd
	cl                *libcni.NetworkConfigList
	api               *kubetest.Server
}

func startFloodNode(t *testing.T) *floodNode {
	t.Helper()
	api := kubetest.Start(t)
	tmp := t.TempDir()
	image := filepath.Join(tmp, "image")
	for _, cmd := range []string{"nftmesh-agent", "nftmesh-cni", "nftmesh-cni-standalone"} {
		build(t, "cmd/"+cmd, filepath.Join(image, cmd))
	}
	n := &floodNode{api: api, bin: filepath.Join(tmp, "opt/cni/bin"), cache: filepath.Join(tmp, "cache")}
	conf, run, sa, ipam := filepath.Join(tmp, "net.d"), filepath.Join(tmp, "run"), filepath.Join(tmp, "sa"), filepath.Join(tmp, "ipam")
	for _, d := range []string{n.bin, conf, sa, n.cache, ipam} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []string{"bridge", "host-local", "loopback"} {
		copyFile(t, filepath.Join(refPluginDir, p), filepath.Join(n.bin, p), 0o755)
	}
	primary := fmt.Sprintf(`{"cniVersion":"1.0.0","name":"flood","plugins":[{"type":"bridge","bridge":"cni0","isGateway":true,
"ipam":{"type":"host-local","dataDir":%q,"ranges":[[{"subnet":%q,"gateway":%q}]]}}]}`, ipam, podSubnet, gatewayIP)
	conflist := filepath.Join(conf, "10-bridge.conflist")
	if err := os.WriteFile(conflist, []byte(primary), 0o644); err != nil {
		t.Fatal(err)
	}
	api.ServiceAccount(t, agentNS, "nftmesh-agent")
	api.Grant(t, agentNS, "nftmesh-agent", true, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch"}})
	if err := os.WriteFile(filepath.Join(sa, "token"), []byte(api.TokenFor(t, agentNS, "nftmesh-agent")), 0o600); err != nil {
		t.Fatal(err)
	}
	copyFile(t, api.CAFile, filepath.Join(sa, "ca.crt"), 0o644)
	api.EnsureNamespace(t, "shop")

	// The node's namespace, with the API server at its own address there.
	_, n.netns = nstest.New(t, "flood-node-")
	apiAddr := strings.TrimPrefix(api.Host, "https://")
	apiHost, apiPort, _ := net.SplitHostPort(apiAddr)
	var fwd net.Listener
	if err := inNetns(n.netns, func() (err error) { fwd, err = net.Listen("tcp", apiAddr); return err }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fwd.Close() })
	go kubetest.Forward(fwd, apiAddr)

	var logs syncbuf.Buffer
	n.agent = exec.Command(filepath.Join(image, "nftmesh-agent"), "--cni-bin-dir", n.bin, "--cni-conf-dir", conf,
		"--agent-run-dir", run, "--plugin-binary", filepath.Join(image, "nftmesh-cni"), "--service-account-dir", sa,
		"--health-addr", agentHealth, "--metrics-addr", agentMetrics, "--repair-enabled=false", "--host-proc", "/proc")
	n.agent.Env = append(os.Environ(), "KUBERNETES_SERVICE_HOST="+apiHost, "KUBERNETES_SERVICE_PORT="+apiPort,
		"POD_NAMESPACE="+agentNS, "NODE_NAME=node-1")
	n.agent.Stdout, n.agent.Stderr = &logs, &logs
	if err := inNetns(n.netns, n.agent.Start); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = n.agent.Process.Kill()
		_ = n.agent.Wait()
		if t.Failed() {
			t.Logf("agent log (last 8 KiB):\n%s", tail(logs.String(), 8<<10))
		}
	})
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if code, _ := n.get(agentHealth, "/readyz"); code == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the agent never became ready")
		}
	}
	cl, err := libcni.ConfListFromFile(conflist)
	if err != nil || len(cl.Plugins) != 2 || cl.Plugins[1].Network.Type != "nftmesh-cni" {
		t.Fatalf("the agent's conflist: %v", err)
	}
	n.cl = cl
	return n
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// addDel starts and stops a pod as a runtime does: ADD through the
// conflist, the pod's capture read back from its namespace, DEL, no table
// left.
func (n *floodNode) addDel(t *testing.T, prefix string) error {
	t.Helper()
	ctx := context.Background()
	pod, err := kubetest.ReadPodFile(filepath.Join("..", "..", "testdata", "pods", "injected.yaml"))
	if err != nil {
		return err
	}
	pod.Name, pod.Spec.NodeName = prefix+nstest.RandHex(3), "node-1"
	if pod, err = n.api.Client().CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		return err
	}
	_, podNetns := nstest.New(t, "flood-pod-")
	rt := cnitest.RuntimeConf(pod, podNetns, "flood-")
	cni := libcni.NewCNIConfigWithCacheDir([]string{n.bin}, n.cache, nil)
	if err := inNetns(n.netns, func() error { _, err := cni.AddNetworkList(ctx, n.cl, rt); return err }); err != nil {
		return fmt.Errorf("ADD of %s: %w", pod.Name, err)
	}
	_, _, spec, err := podinfo.FromPod(pod)
	if err != nil {
		return err
	}
	spec.IPv6 = false
	want, err := redirect.Build(spec)
	if err != nil {
		return err
	}
	if err := nft.New().Check(ctx, podNetns, want); err != nil {
		return fmt.Errorf("capture of %s after ADD: %w", pod.Name, err)
	}
	if err := inNetns(n.netns, func() error { return cni.DelNetworkList(ctx, n.cl, rt) }); err != nil {
		return fmt.Errorf("DEL of %s: %w", pod.Name, err)
	}
	if p, err := nft.New().List(ctx, podNetns); err != nil || len(p.Tables) != 0 {
		return fmt.Errorf("capture of %s left after DEL (%v): %s", pod.Name, err, redirect.Describe(p))
	}
	return nil
}

// get asks the agent as kubelet's probe does: a new connection, one
// request, Connection: close; bounded by maxProbe.
func (n *floodNode) get(addr, path string) (int, error) {
	var c net.Conn
	if err := inNetns(n.netns, func() (err error) { c, err = net.DialTimeout("tcp", addr, maxProbe); return err }); err != nil {
		return 0, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(maxProbe))
	if _, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: kube-probe/1.35\r\nConnection: close\r\n\r\n", path, addr); err != nil {
		return 0, err
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0, err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, err
}

// usage is the agent's open descriptors and resident memory (bytes).
func (n *floodNode) usage() (int64, int64) {
	pid := strconv.Itoa(n.agent.Process.Pid)
	fds, _ := os.ReadDir("/proc/" + pid + "/fd")
	status, _ := os.ReadFile("/proc/" + pid + "/status")
	var kb int64
	for _, l := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, _ = strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		}
	}
	return int64(len(fds)), kb << 10
}

func (n *floodNode) sample(stop <-chan struct{}, fds, rss *atomic.Int64) {
	for {
		f, r := n.usage()
		fds.Store(max(fds.Load(), f))
		rss.Store(max(rss.Load(), r))
		select {
		case <-stop:
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
}

type probeStats struct {
	n       int
	slowest time.Duration
	failed  []string
}

// probe asks /healthz every 250 ms, as kubelet would (more often).
func (n *floodNode) probe(stop <-chan struct{}, s *probeStats) {
	for {
		start := time.Now()
		code, err := n.get(agentHealth, "/healthz")
		took := time.Since(start)
		s.n++
		s.slowest = max(s.slowest, took)
		if err != nil || code != http.StatusOK {
			s.failed = append(s.failed, fmt.Sprintf("%d %v after %v", code, err, took.Round(time.Millisecond)))
		}
		select {
		case <-stop:
			return
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// byPath is the agent's count of pod starts by path, from its /metrics.
func (n *floodNode) byPath() string {
	var c net.Conn
	if err := inNetns(n.netns, func() (err error) { c, err = net.DialTimeout("tcp", agentMetrics, maxProbe); return err }); err != nil {
		return err.Error()
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(maxProbe))
	fmt.Fprintf(c, "GET /metrics HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\r\n")
	b, _ := io.ReadAll(c)
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "nftmesh_cni_add_duration_by_path_seconds_count") {
			out = append(out, strings.TrimPrefix(l, "nftmesh_cni_add_duration_by_path_seconds_count"))
		}
	}
	return strings.Join(out, " ")
}
