package node

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	current "github.com/containernetworking/cni/pkg/types/100"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftmesh/nftmesh/netlab"
	"github.com/nftmesh/nftmesh/nft"
	"github.com/nftmesh/nftmesh/podinfo"
	"github.com/nftmesh/nftmesh/redirect"
	"github.com/nftmesh/nftmesh/testkit/cgrouptest"
	"github.com/nftmesh/nftmesh/testkit/kubetest"

	"github.com/nftmesh/nftmesh/testkit/nstest"

	"github.com/nftmesh/nftmesh/testkit/cnitest"
)

const (
	refPluginDir = "/usr/lib/cni" // Debian's containernetworking-plugins
	agentNS      = "nftmesh-system"
	podSubnet    = "10.244.7.0/24"
	gatewayIP    = "10.244.7.1"
)

func needEnv(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("skipping: -short (builds both binaries, starts etcd and kube-apiserver, needs root)")
	}
	if os.Geteuid() != 0 {
		t.Skip("skipping: needs root (network namespaces, nftables, the bridge plugin)")
	}
	for _, p := range []string{"bridge", "host-local", "loopback"} {
		if _, err := os.Stat(filepath.Join(refPluginDir, p)); err != nil {
			t.Skipf("skipping: reference plugin %s missing in %s: install containernetworking-plugins", p, refPluginDir)
		}
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("skipping: needs the ip command (iproute2)")
	}
}

// repoRoot is the module root, two levels above this package.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("no go.mod at %s: %v", root, err)
	}
	return root
}

// build compiles a command as `make build` does (static, stripped).
func build(t *testing.T, pkg, out string) {
	t.Helper()
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", out, "./"+pkg)
	cmd.Dir = repoRoot(t)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, b)
	}
}

func copyFile(t *testing.T, src, dst string, mode os.FileMode) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, b, mode); err != nil {
		t.Fatal(err)
	}
}

// inNetns runs fn inside the namespace at path (see netlab.Do).
func inNetns(path string, fn func() error) error { return netlab.Do(path, fn) }

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// originalDst reads SO_ORIGINAL_DST (the destination before REDIRECT) of
// an accepted IPv4 connection. The kernel fills a sockaddr_in; an
// ipv6_mreq is the same size, the usual way to fetch it without cgo.
func originalDst(c net.Conn) (netip.AddrPort, error) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return netip.AddrPort{}, fmt.Errorf("not TCP")
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	var ap netip.AddrPort
	var serr error
	if err := raw.Control(func(fd uintptr) {
		m, err := unix.GetsockoptIPv6Mreq(int(fd), unix.SOL_IP, 80)
		if err != nil {
			serr = err
			return
		}
		b := m.Multiaddr
		ap = netip.AddrPortFrom(netip.AddrFrom4([4]byte{b[4], b[5], b[6], b[7]}), uint16(b[2])<<8|uint16(b[3]))
	}); err != nil {
		return ap, err
	}
	return ap, serr
}

// captureListener stands in for Envoy on port inside the pod namespace:
// every accepted connection reports its SO_ORIGINAL_DST.
func captureListener(t *testing.T, podNetns string, port int) <-chan netip.AddrPort {
	t.Helper()
	var ln net.Listener
	if err := inNetns(podNetns, func() (err error) {
		ln, err = net.Listen("tcp4", "0.0.0.0:"+strconv.Itoa(port))
		return err
	}); err != nil {
		t.Fatalf("listening on %d in the pod: %v", port, err)
	}
	t.Cleanup(func() { ln.Close() })
	got := make(chan netip.AddrPort, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			od, err := originalDst(c)
			if err != nil {
				od = netip.AddrPort{}
			}
			got <- od
			c.Close()
		}
	}()
	return got
}

// dialFrom connects to dst from inside a namespace.
func dialFrom(nsPath, dst string) error {
	return inNetns(nsPath, func() error {
		c, err := net.DialTimeout("tcp4", dst, 2*time.Second)
		if err != nil {
			return err
		}
		return c.Close()
	})
}

func expectCaptured(t *testing.T, what string, ch <-chan netip.AddrPort, want string) {
	t.Helper()
	select {
	case od := <-ch:
		if od.String() != want {
			t.Errorf("%s: captured with original destination %s, want %s", what, od, want)
		} else {
			t.Logf("%s: captured, original destination %s", what, od)
		}
	case <-time.After(3 * time.Second):
		t.Errorf("%s: never reached the capture port", what)
	}
}

// The whole node on one machine: agent install, a runtime's ADD through
// the agent's conflist for a mesh pod, real captured traffic, the plugin's
// log in the agent's log, DEL, and the agent's SIGTERM restoring the host.
func TestNodeEndToEnd(t *testing.T) {
	needEnv(t)
	api := kubetest.Start(t)
	ctx := context.Background()
	tmp := t.TempDir()

	// The images' binaries: the plugin's companion next to it, where the
	// agent takes it from.
	agentBin := filepath.Join(tmp, "image", "nftmesh-agent")
	pluginBin := filepath.Join(tmp, "image", "nftmesh-cni")
	build(t, "cmd/nftmesh-agent", agentBin)
	build(t, "cmd/nftmesh-cni", pluginBin)
	build(t, "cmd/nftmesh-cni-standalone", filepath.Join(tmp, "image", "nftmesh-cni-standalone"))

	// The "host".
	host := struct{ bin, conf, run, sa, cache, ipam string }{
		filepath.Join(tmp, "host/opt/cni/bin"), filepath.Join(tmp, "host/etc/cni/net.d"),
		filepath.Join(tmp, "host/var/run/nftmesh"), filepath.Join(tmp, "sa"),
		filepath.Join(tmp, "host/var/lib/cni/cache"), filepath.Join(tmp, "host/var/lib/cni/networks"),
	}
	for _, d := range []string{host.bin, host.conf, host.sa, host.cache, host.ipam} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []string{"bridge", "host-local", "loopback"} {
		copyFile(t, filepath.Join(refPluginDir, p), filepath.Join(host.bin, p), 0o755)
	}
	conflist := filepath.Join(host.conf, "10-bridge.conflist")
	primary := []byte(fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": "e2e-bridge",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "ipMasq": false,
      "ipam": {
        "type": "host-local",
        "dataDir": %q,
        "ranges": [[{"subnet": %q, "gateway": %q}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    }
  ]
}
`, host.ipam, podSubnet, gatewayIP))
	if err := os.WriteFile(conflist, primary, 0o644); err != nil {
		t.Fatal(err)
	}

	// The agent's service account, with the chart's RBAC in its default
	// repairPods mode: get, list and watch pods for the plugin and the
	// agent's watch of its node's pods; list/watch pods and create events
	// for the repair controller.
	api.ServiceAccount(t, agentNS, "nftmesh-agent")
	api.Grant(t, agentNS, "nftmesh-agent", true,
		rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch"}},
		rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list", "watch"}},
		rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create"}})
	if err := os.WriteFile(filepath.Join(host.sa, "token"), []byte(api.TokenFor(t, agentNS, "nftmesh-agent")), 0o600); err != nil {
		t.Fatal(err)
	}
	copyFile(t, api.CAFile, filepath.Join(host.sa, "ca.crt"), 0o644)
	apiHostPort := strings.TrimPrefix(api.Host, "https://")
	apiHost, apiPort, err := net.SplitHostPort(apiHostPort)
	if err != nil {
		t.Fatal(err)
	}

	// The node's network namespace, where the runtime runs the chain; the
	// API server answers at the same address there.
	_, hostNetns := nstest.New(t, "e2e-host-")
	var fwd net.Listener
	if err := inNetns(hostNetns, func() (err error) {
		fwd, err = net.Listen("tcp", apiHostPort)
		return err
	}); err != nil {
		t.Fatalf("API forwarder in the host netns: %v", err)
	}
	t.Cleanup(func() { fwd.Close() })
	go kubetest.Forward(fwd, apiHostPort)

	// A pod that started before the agent: the runtime ran the primary's
	// conflist alone, so the pod runs (a process in its netns stands in
	// for the pause container) without capture, and its istio-validation
	// init container exits 126, crash-looping.
	cni := func() *libcni.CNIConfig { return libcni.NewCNIConfigWithCacheDir([]string{host.bin}, host.cache, nil) }
	api.EnsureNamespace(t, "shop")
	early := createPod(t, api, "early-")
	earlyNetnsName, earlyNetns := nstest.New(t, "e2e-early-")
	earlyRT := cnitest.RuntimeConf(early, earlyNetns, "e2e-")
	bridgeOnly, err := libcni.ConfListFromBytes(primary)
	if err != nil {
		t.Fatal(err)
	}
	var earlyIP string
	if err := inNetns(hostNetns, func() error {
		r, err := cni().AddNetworkList(ctx, bridgeOnly, earlyRT)
		if err != nil {
			return err
		}
		res, err := current.NewResultFromResult(r)
		if err == nil {
			earlyIP = res.IPs[0].Address.IP.String()
		}
		return err
	}); err != nil {
		t.Fatalf("ADD of the primary alone for the early pod: %v", err)
	}
	t.Cleanup(func() { _ = inNetns(hostNetns, func() error { return cni().DelNetworkList(ctx, bridgeOnly, earlyRT) }) })
	pause := exec.Command("ip", "netns", "exec", earlyNetnsName, "sleep", "300")
	if err := pause.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pause.Process.Kill(); _ = pause.Wait() })
	// In the pod's cgroup, as on a node: repair in place takes a namespace
	// holding the pod's IP only when its processes are the pod's.
	cgrouptest.MovePod(t, pause.Process.Pid, cgrouptest.CgroupfsLeaf(string(early.UID)))
	early.Status = corev1.PodStatus{
		Phase: corev1.PodPending, PodIP: earlyIP, PodIPs: []corev1.PodIP{{IP: earlyIP}},
		InitContainerStatuses: []corev1.ContainerStatus{{
			Name: "istio-validation", RestartCount: 1,
			State:                corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}},
			LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 126, Reason: "Error"}},
		}},
	}
	if _, err := api.Client().CoreV1().Pods("shop").UpdateStatus(ctx, early, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if p, err := nft.New().List(ctx, earlyNetns); err != nil || len(p.Tables) != 0 {
		t.Fatalf("the early pod has rules before the agent runs (%v)", err)
	}
	earlyOut := captureListener(t, earlyNetns, 15001)

	// Start the agent, with the chart's default repair mode (in place).
	health, metrics := freeAddr(t), freeAddr(t)
	logPath := filepath.Join(tmp, "agent.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	agent := exec.Command(agentBin,
		"--cni-bin-dir", host.bin, "--cni-conf-dir", host.conf, "--agent-run-dir", host.run,
		"--plugin-binary", pluginBin, "--service-account-dir", host.sa,
		"--health-addr", health, "--metrics-addr", metrics, "--log-level", "debug",
		"--repair-enabled", "--repair-pods", "--host-proc", "/proc")
	agent.Env = append(os.Environ(), "KUBERNETES_SERVICE_HOST="+apiHost, "KUBERNETES_SERVICE_PORT="+apiPort,
		"POD_NAMESPACE="+agentNS, "NODE_NAME=node-1")
	agent.Stdout, agent.Stderr = logFile, logFile
	if err := agent.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- agent.Wait() }()
	agentLog := func() string { b, _ := os.ReadFile(logPath); return string(b) }
	t.Cleanup(func() {
		_ = agent.Process.Kill()
		if t.Failed() {
			t.Logf("agent log:\n%s", agentLog())
		}
	})

	start := time.Now()
	for {
		if resp, err := http.Get("http://" + health + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Since(start) > 30*time.Second {
			t.Fatal("agent never became ready")
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("agent ready after %v", time.Since(start).Round(time.Millisecond))

	// What the runtime will read: the agent's conflist.
	cl, err := libcni.ConfListFromFile(conflist)
	if err != nil {
		t.Fatalf("the agent's conflist does not parse: %v", err)
	}
	if n := len(cl.Plugins); n != 2 || cl.Plugins[1].Network.Type != "nftmesh-cni" || cl.CNIVersion != "1.0.0" {
		t.Fatalf("the agent's conflist: %s", cl.Bytes)
	}
	for _, name := range []string{"nftmesh-cni", "nftmesh-cni-standalone"} {
		if _, err := os.Stat(filepath.Join(host.bin, name)); err != nil {
			t.Fatalf("%s not installed: %v", name, err)
		}
	}

	// The early pod is repaired in place by the agent: its rules appear
	// and its outbound traffic is captured from then on.
	_, _, earlySpec, err := podinfo.FromPod(early)
	if err != nil {
		t.Fatal(err)
	}
	earlySpec.IPv6 = false
	earlyWant, err := redirect.Build(earlySpec)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for nft.New().Check(ctx, earlyNetns, earlyWant) != nil {
		if time.Now().After(deadline) {
			t.Fatalf("the agent never repaired the early pod: %v", nft.New().Check(ctx, earlyNetns, earlyWant))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if n := strings.Count(findLine(agentLog(), "repair controller started"), `"component"`); n != 1 {
		t.Errorf("repair controller start line has %d component keys", n)
	}
	if err := dialFrom(earlyNetns, net.JoinHostPort(gatewayIP, "443")); err != nil {
		t.Errorf("outbound connect from the repaired pod: %v", err)
	}
	expectCaptured(t, "repaired pod outbound "+gatewayIP+":443", earlyOut, gatewayIP+":443")
	if line := findLine(agentLog(), `"subsystem":"repair"`, `"pod":"`+early.Name+`"`, "repaired the pod's capture in place"); line == "" {
		t.Errorf("no repair line for %s in the agent log", early.Name)
	}

	// A new pod, as the API server has it when the runtime sets it up.
	pod := createPod(t, api, "web-")
	podNetnsName, podNetns := nstest.New(t, "e2e-pod-")
	rt := cnitest.RuntimeConf(pod, podNetns, "e2e-")
	outbound := captureListener(t, podNetns, 15001)
	inbound := captureListener(t, podNetns, 15006)

	var res *current.Result
	start = time.Now()
	if err := inNetns(hostNetns, func() error {
		r, err := cni().AddNetworkList(ctx, cl, rt)
		if err != nil {
			return err
		}
		res, err = current.NewResultFromResult(r)
		return err
	}); err != nil {
		t.Fatalf("ADD through the agent's conflist: %v", err)
	}
	t.Logf("ADD of [bridge, nftmesh-cni] took %v", time.Since(start).Round(time.Millisecond))
	if len(res.IPs) != 1 {
		t.Fatalf("ADD result: %+v", res)
	}
	podIP := res.IPs[0].Address.IP.String()

	// The rules are exactly the pod's plan, read back independently.
	_, _, spec, err := podinfo.FromPod(pod)
	if err != nil {
		t.Fatal(err)
	}
	spec.IPv6 = false // host-local gave the pod IPv4 only
	want, err := redirect.Build(spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := nft.New().Check(ctx, podNetns, want); err != nil {
		t.Errorf("rules in the pod after ADD: %v", err)
	}
	if out := nstest.Sh(t, "ip", "netns", "exec", podNetnsName, "nft", "list", "tables"); !strings.Contains(out, nft.TableName) {
		t.Errorf("nft list tables in the pod: %s", out)
	}
	if err := inNetns(hostNetns, func() error { return cni().CheckNetworkList(ctx, cl, rt) }); err != nil {
		t.Errorf("CHECK: %v", err)
	}

	// Real traffic. Outbound from the app (root, not the proxy's 1337) to
	// the gateway lands on 15001 with its original destination; inbound
	// from the node to the app's port lands on 15006; 15020 (always
	// excluded inbound) is not captured, so nothing answers there.
	if err := dialFrom(podNetns, net.JoinHostPort(gatewayIP, "80")); err != nil {
		t.Errorf("outbound connect: %v", err)
	}
	expectCaptured(t, "outbound "+gatewayIP+":80", outbound, gatewayIP+":80")
	if err := dialFrom(hostNetns, net.JoinHostPort(podIP, "8080")); err != nil {
		t.Errorf("inbound connect: %v", err)
	}
	expectCaptured(t, "inbound "+podIP+":8080", inbound, podIP+":8080")
	if err := dialFrom(hostNetns, net.JoinHostPort(podIP, "15020")); err == nil || !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("inbound to excluded port 15020: %v, want connection refused", err)
	}
	select {
	case od := <-inbound:
		t.Errorf("port 15020 was captured (orig %s)", od)
	default:
	}

	// The plugin's decision line is in the agent's log as its own line.
	deadline = time.Now().Add(10 * time.Second)
	for {
		line := findLine(agentLog(), `"component":"cni-plugin"`, `"decision":"capture"`, `"pod":"`+pod.Name+`"`)
		if line != "" {
			var m map[string]any
			if err := json.Unmarshal([]byte(line), &m); err != nil || m["command"] != "ADD" || m["time"] == nil || m["level"] != "info" {
				t.Errorf("plugin line in the agent log: %v %s", err, line)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the plugin's ADD decision never appeared in the agent's log")
		}
		time.Sleep(50 * time.Millisecond)
	}

	if err := inNetns(hostNetns, func() error { return cni().DelNetworkList(ctx, cl, rt) }); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	if p, err := nft.New().List(ctx, podNetns); err != nil || len(p.Tables) != 0 {
		t.Errorf("rules left after DEL (%v): %v", err, redirect.Describe(p))
	}

	// Stop the agent: the host is as it was.
	if err := agent.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("agent exited with %v after SIGTERM", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("agent did not exit after SIGTERM")
	}
	if got, _ := os.ReadFile(conflist); !bytes.Equal(got, primary) {
		t.Errorf("conflist not restored byte for byte:\n%s", got)
	}
	for _, p := range []string{filepath.Join(host.bin, "nftmesh-cni"), filepath.Join(host.bin, "nftmesh-cni-standalone"), filepath.Join(host.run, "kubeconfig")} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s left behind (%v)", p, err)
		}
	}
	for _, p := range []string{"bridge", "host-local", "loopback"} {
		if _, err := os.Stat(filepath.Join(host.bin, p)); err != nil {
			t.Errorf("the primary's %s was removed: %v", p, err)
		}
	}
}

// findLine returns the first line containing every part.
func findLine(s string, parts ...string) string {
	for _, l := range strings.Split(s, "\n") {
		ok := true
		for _, p := range parts {
			if !strings.Contains(l, p) {
				ok = false
				break
			}
		}
		if ok {
			return l
		}
	}
	return ""
}

// createPod stores the sample injected pod, bound to node-1, under a
// unique name.
func createPod(t *testing.T, api *kubetest.Server, prefix string) *corev1.Pod {
	t.Helper()
	pod, err := kubetest.ReadPodFile(filepath.Join(repoRoot(t), "testdata", "pods", "injected.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	pod.Name = prefix + nstest.RandHex(3)
	pod.Spec.NodeName = "node-1"
	pod.Status = corev1.PodStatus{}
	pod, err = api.Client().CoreV1().Pods(pod.Namespace).Create(context.Background(), pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return pod
}
