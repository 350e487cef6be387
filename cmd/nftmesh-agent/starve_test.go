package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftmesh/nftmesh/netlab"
	"github.com/nftmesh/nftmesh/nft"
	"github.com/nftmesh/nftmesh/podinfo/agentsock"
	"github.com/nftmesh/nftmesh/testkit/kubetest"
	"github.com/nftmesh/nftmesh/testkit/nstest"
	"github.com/nftmesh/nftmesh/testkit/syncbuf"
)

// TestStarvationReadiness: /readyz says why while a call was declined for
// lack of a resource within the window, or the descriptors are at the high
// water mark, and nothing otherwise; not knowing the count is not starvation.
func TestStarvationReadiness(t *testing.T) {
	var open, limit int
	var fdErr error
	s := &starvation{window: time.Hour, fds: func() (int, int, error) { return open, limit, fdErr }}
	open, limit = 100, 1000
	if err := s.check(); err != nil {
		t.Fatalf("fresh: %v", err)
	}
	open = 900
	if err := s.check(); err == nil || !strings.Contains(err.Error(), "900 file descriptors open of RLIMIT_NOFILE 1000") {
		t.Fatalf("at the high water mark: %v", err)
	}
	open, fdErr = 0, fmt.Errorf("opening /proc/self/fd: %w", unix.EMFILE)
	if err := s.check(); err == nil || !strings.Contains(err.Error(), "too many open files") {
		t.Fatalf("cannot open a descriptor to count them: %v", err)
	}
	fdErr = unix.ENOENT
	if err := s.check(); err != nil {
		t.Fatalf("no /proc: %v", err)
	}
	fdErr = nil
	s.note("cni", agentsock.ResourceMemory, "opening sockets in netns /x: cannot allocate memory")
	if err := s.check(); err == nil || !strings.Contains(err.Error(), "the cni socket declined a call for lack of kernel memory") {
		t.Fatalf("after a starved call: %v", err)
	}
	s.window = 0
	if err := s.check(); err != nil {
		t.Fatalf("after the window: %v", err)
	}
	// The process's own count: this test's descriptors, under its limit.
	if open, limit, err := openFDs(); err != nil || open < 3 || limit < open {
		t.Fatalf("openFDs = %d, %d, %v", open, limit, err)
	}
}

// TestStarvedAgentDeclinesToTheStandalone: the built agent, run as the
// DaemonSet runs it (CNI calls handed over by the front, pods from a real
// API server), with its RLIMIT_NOFILE lowered (prlimit) to leave it 0 to
// 24 descriptors: every ADD and DEL through the front on a real network
// namespace succeeds, run by the agent where it has what the call needs and
// else declined at once to the standalone plugin, never failed; its
// /readyz says not ready, naming why, while it is starved, and ready again
// once it recovers. Before, the agent took the calls and failed them with
// CNI code 4 ("opening netns ...: too many open files"), and /readyz said
// ready throughout.
func TestStarvedAgentDeclinesToTheStandalone(t *testing.T) {
	nstest.NeedRoot(t)
	api := kubetest.Start(t)
	front := buildFront(t)
	pod := starvedPod(t, api)
	_, nsPath := nstest.New(t, "starved-")
	a := startNodeAgent(t, api, pod.Spec.NodeName, nil)
	h, node, health, metrics, cmd, logs := a.host, a.node, a.health, a.metrics, a.cmd, a.logs
	sweep := "unstarved" // where the calls are, for a failure's message
	call := func(verb string) {
		t.Helper()
		start := time.Now()
		out, err := runFront(front, verb, nsPath, h.run, pod)
		if err != nil {
			t.Fatalf("%s through the front: %v\n%s", verb, err, out)
		}
		// Declined at once, not left to the front's ten-second wait.
		if took := time.Since(start); took > 5*time.Second {
			t.Errorf("%s through the front (%s) took %v", verb, sweep, took)
		}
		has := strings.Contains(nstest.Run(t, nsPath, "", "nft", "list", "tables"), nft.TableName)
		if has != (verb == "ADD") {
			t.Fatalf("after %s the namespace holds our table: %t", verb, has)
		}
	}
	// Unstarved, the agent runs the calls itself.
	call("ADD")
	call("DEL")
	node.waitMetrics(t, metrics, `nftmesh_agent_socket_cni_calls_total{outcome="ok"} 2`)

	pid := cmd.Process.Pid
	// From below the descriptors open (none to be had, even should one
	// close meanwhile) to more than a call needs.
	for free := -3; free <= 24; free++ {
		restore := starve(t, pid, free)
		sweep = fmt.Sprintf("%d descriptors free", free)
		call("ADD")
		call("DEL")
		restore()
	}
	sweep = "recovered"
	body := node.waitMetrics(t, metrics, `nftmesh_agent_socket_starved_total{resource="fds",socket="cni"}`)
	for _, l := range strings.Split(body, "\n") {
		if strings.HasPrefix(l, "nftmesh_agent_socket_") {
			t.Log(l)
		}
	}
	// Where the calls starved: each a place a decline is safe.
	where := map[string]bool{}
	for _, l := range strings.Split(logs.String(), "\n") {
		var e struct{ Outcome, Command, Reason string }
		if json.Unmarshal([]byte(l), &e) == nil && e.Outcome == "starved" && !where[e.Command+" "+e.Reason] {
			where[e.Command+" "+e.Reason] = true
			t.Logf("declined %s: %s", e.Command, e.Reason)
		}
	}
	if !strings.Contains(logs.String(), `cni.sock: accept4: too many open files","command"`) {
		t.Errorf("no call was declined at the accept, with the reserve descriptor")
	}
	if strings.Contains(body, `nftmesh_agent_socket_cni_calls_total{outcome="error"}`) {
		t.Errorf("the agent failed a call instead of declining it")
	}
	if !strings.Contains(body, `nftmesh_agent_socket_cni_calls_total{outcome="ok"} `) ||
		strings.Contains(body, `nftmesh_agent_socket_cni_calls_total{outcome="ok"} 2`+"\n") {
		t.Errorf("with room enough the agent ran no call of the sweep itself")
	}

	// Starved: not ready, naming why.
	restore := starve(t, pid, 3)
	code, text := node.get("http://" + health + "/readyz")
	restore()
	if code != http.StatusServiceUnavailable || !strings.Contains(text, "starved") {
		t.Errorf("/readyz with 3 descriptors left: %d %q, want 503 naming the starvation", code, text)
	}
	restore = starve(t, pid, 1)
	out, err := runFront(front, "ADD", nsPath, h.run, pod)
	restore()
	if err != nil {
		t.Fatalf("ADD with 1 descriptor left: %v\n%s", err, out)
	}
	code, text = node.get("http://" + health + "/readyz")
	if code != http.StatusServiceUnavailable || !strings.Contains(text, "declined a call for lack of file descriptors") {
		t.Errorf("/readyz just after a starved call: %d %q, want 503 naming it", code, text)
	}
	start := time.Now()
	node.waitReady(t, health, starvedFor+10*time.Second)
	t.Logf("ready again %v after recovering (the window is %v)", time.Since(start).Round(100*time.Millisecond), starvedFor)
	call("DEL")
}

// nodeAgent is the agent binary running as in its pod on node: in a
// network namespace of its own, with the API server at its address there.
type nodeAgent struct {
	host            *fakeHost
	node            netnsNode
	health, metrics string
	cmd             *exec.Cmd
	logs            *syncbuf.Buffer
}

// startNodeAgent starts the agent, running the plugin's calls, once
// prepare (if set) has seen its host, and waits until it is ready. It
// registers the test's network namespace as the host's (its parent's; PID
// 1's may not be readable here), and reaches the API server through a
// forwarder at the API server's own address, which the plugin's kubeconfig
// names.
func startNodeAgent(t *testing.T, api *kubetest.Server, nodeName string, prepare func(*fakeHost)) nodeAgent {
	t.Helper()
	bin := buildAgent(t)
	h := newFakeHost(t)
	_ = os.WriteFile(filepath.Join(h.sa, "token"), []byte(api.AdminToken()), 0o600)
	ca, err := os.ReadFile(api.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	_ = os.WriteFile(filepath.Join(h.sa, "ca.crt"), ca, 0o644)
	src, err := os.ReadFile(filepath.Join("..", "..", "testdata", "conflists", "1-k8s.conflist"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(h.conf, "1-k8s.conflist"), src, 0o644); err != nil {
		t.Fatal(err)
	}
	if prepare != nil {
		prepare(h)
	}
	a := nodeAgent{host: h, node: nodeNetns(t, api), health: "127.0.0.1:8000", metrics: "127.0.0.1:15014", logs: &syncbuf.Buffer{}}
	a.cmd = exec.Command("nsenter", append([]string{"--net=" + a.node.path, "--", bin}, append(h.args(a.health, a.metrics),
		"--kube-api-server", api.Host, "--node-name", nodeName, "--repair-enabled=false", "--host-proc", "/proc")...)...)
	a.cmd.Stdout, a.cmd.Stderr = a.logs, a.logs
	if err := a.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = a.cmd.Process.Signal(syscall.SIGTERM)
		_ = a.cmd.Wait()
		if t.Failed() {
			t.Logf("agent logs:\n%s", a.logs.String())
		}
	})
	a.node.waitReady(t, a.health, 30*time.Second)
	return a
}

// starve lowers the soft RLIMIT_NOFILE of process pid to leave it free
// descriptors beyond those open now, but never below a descriptor the
// agent holds twice (a listener and its reserve, a duplicate of it, which
// the agent closes to accept a connection it then declines: the room it
// makes is under the limit only when its number is); restore puts the
// limit back. Before that floor the sweep started below the open count
// and a reserve among the top numbers made no room, so the calls waited
// out the front's ten seconds in the backlog (one run in six), which
// cannot happen to a process whose limit is not lowered beneath it.
func starve(t *testing.T, pid, free int) (restore func()) {
	t.Helper()
	var old unix.Rlimit
	if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, nil, &old); err != nil {
		t.Fatal(err)
	}
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	floor, seen := 0, map[string]int{}
	for _, e := range ents {
		n, err := strconv.Atoi(e.Name())
		target, lerr := os.Readlink(filepath.Join(dir, e.Name()))
		if err != nil || lerr != nil || !strings.HasPrefix(target, "socket:") {
			continue
		}
		if m, dup := seen[target]; dup {
			floor = max(floor, n+1, m+1)
		}
		seen[target] = n
	}
	lim := unix.Rlimit{Cur: uint64(max(len(ents)+free, floor, 0)), Max: old.Max}
	if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, &lim, nil); err != nil {
		t.Fatal(err)
	}
	return func() {
		if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, &old, nil); err != nil {
			t.Fatal(err)
		}
	}
}

// buildFront builds nftmesh-cni and nftmesh-cni-standalone into one
// directory, as the agent installs them, and returns the front's path.
func buildFront(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	cmd := exec.Command("go", "build", "-o", dir+"/", "../nftmesh-cni", "../nftmesh-cni-standalone")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return filepath.Join(dir, "nftmesh-cni")
}

// starvedPod is an injected pod of a node of its own, stored in the API.
func starvedPod(t *testing.T, api *kubetest.Server) *corev1.Pod {
	t.Helper()
	p, err := kubetest.ReadPodFile(filepath.Join("..", "..", "testdata", "pods", "injected.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	api.EnsureNamespace(t, p.Namespace)
	p.Spec.NodeName = "node-starved"
	p.ResourceVersion, p.UID = "", ""
	created, err := api.Client().CoreV1().Pods(p.Namespace).Create(context.Background(), p, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return created
}

// runFront runs one CNI call through the front as a runtime does, with the
// plugin's config naming runDir, and returns its output.
func runFront(front, verb, nsPath, runDir string, pod *corev1.Pod) (string, error) {
	conf, _ := json.Marshal(map[string]any{
		"cniVersion": "1.0.0", "name": "k8s-pod-network", "type": "nftmesh-cni",
		"agent_run_dir": runDir, "backend": "nftables", "api_timeout": "10s",
		"prevResult": map[string]any{"cniVersion": "1.0.0",
			"interfaces": []any{map[string]any{"name": "eth0", "sandbox": nsPath}},
			"ips":        []any{map[string]any{"address": "198.51.100.40/24", "gateway": "198.51.100.1", "interface": 0}}},
	})
	id := "ctr-starved"
	cmd := exec.Command(front)
	cmd.Env = append(os.Environ(), "CNI_COMMAND="+verb, "CNI_CONTAINERID="+id, "CNI_NETNS="+nsPath, "CNI_IFNAME=eth0", "CNI_PATH=/opt/cni/bin",
		fmt.Sprintf("CNI_ARGS=IgnoreUnknown=1;K8S_POD_NAMESPACE=%s;K8S_POD_NAME=%s;K8S_POD_INFRA_CONTAINER_ID=%s;K8S_POD_UID=%s", pod.Namespace, pod.Name, id, pod.UID))
	cmd.Stdin = bytes.NewReader(conf)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// netnsNode is a network namespace standing in for the agent's pod, with
// the API server forwarded to its address there.
type netnsNode struct{ path string }

func nodeNetns(t *testing.T, api *kubetest.Server) netnsNode {
	t.Helper()
	_, path := nstest.New(t, "node-")
	hostPort := strings.TrimPrefix(api.Host, "https://")
	var ln net.Listener
	if err := netlab.Do(path, func() (err error) {
		ln, err = net.Listen("tcp", hostPort)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go kubetest.Forward(ln, hostPort)
	return netnsNode{path: path}
}

// get is one GET of url in the namespace, on a connection of its own
// closed after it: the agent holds no descriptor for it afterwards.
func (n netnsNode) get(url string) (int, string) {
	dial := func(ctx context.Context, network, addr string) (c net.Conn, err error) {
		err = netlab.Do(n.path, func() (err error) {
			c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true, DialContext: dial}, Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	_, _ = b.ReadFrom(resp.Body)
	return resp.StatusCode, b.String()
}

func (n netnsNode) waitReady(t *testing.T, health string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		code, body := n.get("http://" + health + "/readyz")
		if code == http.StatusOK {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not ready after %v: %d %s", within, code, body)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitMetrics scrapes /metrics until it has a line starting with each of
// want.
func (n netnsNode) waitMetrics(t *testing.T, addr string, want ...string) string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, body := n.get("http://" + addr + "/metrics")
		missing := ""
		for _, w := range want {
			if !strings.Contains(body, "\n"+w) {
				missing = w
				break
			}
		}
		if missing == "" {
			return body
		}
		if time.Now().After(deadline) {
			t.Fatalf("/metrics never showed %q:\n%s", missing, grepLines(body, "nftmesh_agent_socket"))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// BenchmarkOpenFDs: what /readyz pays to count the agent's descriptors,
// with 2,500 open (the most the agent holds under a connection flood once
// its HTTP servers are bounded).
func BenchmarkOpenFDs(b *testing.B) {
	for range 2500 {
		fd, err := unix.Dup(0)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { unix.Close(fd) })
	}
	for b.Loop() {
		if _, _, err := openFDs(); err != nil {
			b.Fatal(err)
		}
	}
}
