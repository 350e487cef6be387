package cniplugin

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	current "github.com/containernetworking/cni/pkg/types/100"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftmesh/nftmesh/netlab"
	"github.com/nftmesh/nftmesh/nft"
	"github.com/nftmesh/nftmesh/podinfo/meshpod"
	"github.com/nftmesh/nftmesh/redirect"
	"github.com/nftmesh/nftmesh/testkit/kubetest"
	"github.com/nftmesh/nftmesh/testkit/nettest"

	"github.com/nftmesh/nftmesh/testkit/nstest"

	"github.com/nftmesh/nftmesh/testkit/cnitest"
)

// TestChainMeshPod runs [bridge, nftmesh-cni] through libcni, as a
// container runtime does, for each cniVersion the reference plugins speak:
// the pod gets its address from bridge/host-local and our rules, CHECK
// passes, CHECK fails once someone flushed our table, DEL removes them.
func TestChainMeshPod(t *testing.T) {
	needEnv(t)
	for _, v := range []string{"0.3.1", "0.4.0", "1.0.0"} {
		t.Run(v, func(t *testing.T) {
			h := newHost(t, env.api, env.token)
			pod := createPod(t, env.api, loadPod(t, "injected.yaml"))
			nsName, nsPath := nstest.New(t, "cni-pod-")
			cl := h.conflist(t, v, nil)
			rt := cnitest.RuntimeConf(pod, nsPath, "ctr-")

			res, err := h.add(cl, rt)
			if err != nil {
				t.Fatalf("ADD: %v", err)
			}
			r, err := current.NewResultFromResult(res)
			if err != nil {
				t.Fatal(err)
			}
			if len(r.IPs) != 1 || !strings.HasPrefix(r.IPs[0].Address.IP.String(), "198.51.100.") || len(r.Interfaces) == 0 {
				t.Fatalf("ADD result lost the primary plugin's result: %s", mustJSON(r))
			}

			want := wantPlan(t, pod, false)
			if err := nft.New().Check(context.Background(), nsPath, want); err != nil {
				t.Fatalf("live rules after ADD: %v", err)
			}
			if tables := nftTables(t, nsName); !strings.Contains(tables, nft.TableName) {
				t.Fatalf("nft list tables does not show %s:\n%s", nft.TableName, tables)
			}

			if v != "0.3.1" { // 0.3.1 has no CHECK
				if err := h.check(cl, rt); err != nil {
					t.Fatalf("CHECK on intact rules: %v", err)
				}
				nstest.Sh(t, "ip", "netns", "exec", nsName, "nft", "flush", "table", "inet", nft.TableName)
				err := h.check(cl, rt)
				if err == nil || !strings.Contains(err.Error(), "not as planned") || !strings.Contains(err.Error(), pod.Name) {
					t.Fatalf("CHECK after flushing our table: err = %v, want a drift error naming the pod", err)
				}
			}

			if err := h.del(cl, rt); err != nil {
				t.Fatalf("DEL: %v", err)
			}
			assertNoRules(t, nsPath)
		})
	}
}

// TestChainPassthrough: pods that must not be captured get no rules and
// the primary result passes through. The excluded namespace and agent pod
// do not even exist in the API: they must be decided before any lookup.
func TestChainPassthrough(t *testing.T) {
	needEnv(t)
	h := newHost(t, env.api, env.token)
	tests := []struct {
		name   string
		pod    func(t *testing.T) *corev1.Pod
		reason string
	}{
		{"excluded namespace", func(t *testing.T) *corev1.Pod {
			return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "coredns-" + nstest.RandHex(3)}}
		}, "namespace excluded"},
		{"agent pod", func(t *testing.T) *corev1.Pod {
			return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: agentNS, Name: "nftmesh-agent-" + nstest.RandHex(3)}}
		}, "agent's own pod"},
		{"no sidecar", func(t *testing.T) *corev1.Pod { return createPod(t, env.api, loadPod(t, "no-sidecar.yaml")) }, "no istio-proxy container"},
		{"inject=false", func(t *testing.T) *corev1.Pod { return createPod(t, env.api, loadPod(t, "inject-false.yaml")) }, "inject=false label"},
		{"gateway", func(t *testing.T) *corev1.Pod { return createPod(t, env.api, loadPod(t, "gateway.yaml")) }, "gateway"},
		{"interceptionMode NONE", func(t *testing.T) *corev1.Pod { return createPod(t, env.api, loadPod(t, "interception-none.yaml")) }, "interceptionMode NONE"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pod := tt.pod(t)
			_, nsPath := nstest.New(t, "cni-pod-")
			cl := h.conflist(t, "1.0.0", nil)
			rt := cnitest.RuntimeConf(pod, nsPath, "ctr-")
			res, err := h.add(cl, rt)
			if err != nil {
				t.Fatalf("ADD: %v", err)
			}
			if r, _ := current.NewResultFromResult(res); r == nil || len(r.IPs) != 1 {
				t.Fatalf("primary result not passed through: %v", res)
			}
			assertNoRules(t, nsPath)
			if err := h.check(cl, rt); err != nil {
				t.Fatalf("CHECK of a passthrough pod: %v", err)
			}
			assertLogged(t, h.runDir, pod, "skip", tt.reason)
			if err := h.del(cl, rt); err != nil {
				t.Fatalf("DEL: %v", err)
			}
		})
	}
}

// addEvent is the plugin's ADD capture log line for pod.
func addEvent(t *testing.T, runDir string, pod *corev1.Pod) map[string]any {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(runDir, LogFileName))
	if err != nil {
		t.Fatalf("reading plugin log: %v", err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		var ev map[string]any
		if json.Unmarshal([]byte(line), &ev) == nil && ev["pod"] == pod.Name && ev["command"] == "ADD" && ev["decision"] == "capture" {
			return ev
		}
	}
	t.Fatalf("no ADD capture line for pod %s in the log:\n%s", pod.Name, data)
	return nil
}

// assertLogged finds the decision line of pod in the plugin's log file.
func assertLogged(t *testing.T, runDir string, pod *corev1.Pod, decision, reason string) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(runDir, LogFileName))
	if err != nil {
		t.Fatalf("reading plugin log: %v", err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		var ev map[string]any
		if json.Unmarshal([]byte(line), &ev) != nil || ev["pod"] != pod.Name || ev["command"] != "ADD" {
			continue
		}
		for _, k := range []string{"namespace", "container_id", "backend", "duration_ms", "netns"} {
			if _, ok := ev[k]; !ok {
				t.Errorf("log line lacks %s: %s", k, line)
			}
		}
		if ev["decision"] == decision && strings.Contains(fmt.Sprint(ev["reason"]), reason) {
			return
		}
	}
	t.Fatalf("no ADD %s line with reason %q for pod %s in the log:\n%s", decision, reason, pod.Name, data)
}

// TestChainBadAnnotation: an invalid annotation fails ADD with an error
// naming the pod, the annotation and its value, and leaves no rules.
func TestChainBadAnnotation(t *testing.T) {
	needEnv(t)
	h := newHost(t, env.api, env.token)
	pod := createPod(t, env.api, loadPod(t, "bad-annotation.yaml"))
	_, nsPath := nstest.New(t, "cni-pod-")
	cl := h.conflist(t, "1.0.0", nil)
	rt := cnitest.RuntimeConf(pod, nsPath, "ctr-")
	_, err := h.add(cl, rt)
	if err == nil {
		t.Fatal("ADD succeeded for a pod with an invalid annotation")
	}
	for _, want := range []string{pod.Namespace + "/" + pod.Name, redirect.AnnotationExcludeOutboundIPRanges, `"192.0.2.10"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("ADD error %q does not mention %s", err, want)
		}
	}
	assertNoRules(t, nsPath)
	_ = h.del(cl, rt)
}

// TestChainAPIStopped: with the API server down, ADD retries until
// api_timeout and then fails closed, with no rules.
func TestChainAPIStopped(t *testing.T) {
	needEnv(t)
	api := kubetest.Start(t)
	api.EnsureNamespace(t, "shop")
	h := newHost(t, api, api.AdminToken())
	pod := createPod(t, api, loadPod(t, "injected.yaml"))
	api.Stop()

	_, nsPath := nstest.New(t, "cni-pod-")
	const timeout = 2 * time.Second
	cl := h.conflist(t, "1.0.0", map[string]any{"api_timeout": timeout.String()})
	rt := cnitest.RuntimeConf(pod, nsPath, "ctr-")
	start := time.Now()
	_, err := h.add(cl, rt)
	took := time.Since(start)
	if err == nil {
		t.Fatal("ADD succeeded with the API server stopped")
	}
	if !strings.Contains(err.Error(), "not reachable") || !strings.Contains(err.Error(), pod.Name) {
		t.Errorf("ADD error %q does not say the API is unreachable for the pod", err)
	}
	if took < timeout || took > timeout+3*time.Second {
		t.Errorf("ADD failed after %v, want about api_timeout (%v)", took, timeout)
	}
	t.Logf("ADD failed after %v: %v", took.Round(time.Millisecond), err)
	assertNoRules(t, nsPath)
	_ = h.del(cl, rt)
}

// TestChainRBACDenied: a token whose RBAC does not allow get pods makes
// ADD fail at once, saying forbidden.
func TestChainRBACDenied(t *testing.T) {
	needEnv(t)
	token := env.api.ServiceAccount(t, agentNS, "no-pods-"+nstest.RandHex(3))
	h := newHost(t, env.api, token)
	pod := createPod(t, env.api, loadPod(t, "injected.yaml"))
	_, nsPath := nstest.New(t, "cni-pod-")
	cl := h.conflist(t, "1.0.0", nil)
	rt := cnitest.RuntimeConf(pod, nsPath, "ctr-")
	start := time.Now()
	_, err := h.add(cl, rt)
	if err == nil {
		t.Fatal("ADD succeeded without RBAC to get pods")
	}
	if !strings.Contains(err.Error(), "forbidden") || !strings.Contains(err.Error(), pod.Name) {
		t.Errorf("ADD error %q does not say forbidden for the pod", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("forbidden took %v; it cannot change by retrying and should fail at once", took)
	}
	assertNoRules(t, nsPath)
	_ = h.del(cl, rt)
}

// TestChainAddTwiceAndDelAfterNetnsGone: a repeated ADD (runtime retry)
// leaves the same rules; DEL after the netns is gone succeeds.
func TestChainAddTwiceAndDelAfterNetnsGone(t *testing.T) {
	needEnv(t)
	h := newHost(t, env.api, env.token)
	pod := createPod(t, env.api, loadPod(t, "native-sidecar.yaml"))
	nsName, nsPath := nstest.New(t, "cni-pod-")
	cl := h.conflist(t, "1.0.0", nil)
	rt := cnitest.RuntimeConf(pod, nsPath, "ctr-")
	res, err := h.add(cl, rt)
	if err != nil {
		t.Fatalf("ADD: %v", err)
	}
	first := live(t, nsPath)

	// The second ADD is ours alone, with the primary's cached result, as
	// when a runtime retries after a later plugin failed.
	prev := map[string]any{}
	if err := json.Unmarshal([]byte(mustJSON(res)), &prev); err != nil {
		t.Fatal(err)
	}
	conf := directConf(t, "1.0.0", h.runDir, prev, nil)
	var out, stderr []byte
	err = inNetns(h.netnsPath, func() (err error) {
		// Reach the API through the host's forwarder, as in the chain.
		out, stderr, err = execPlugin("ADD", nsPath, rt.ContainerID, cniArgsFor(pod, rt.ContainerID), conf)
		return err
	})
	if err != nil {
		t.Fatalf("second ADD: %v\nstdout %s\nstderr %s", err, out, stderr)
	}
	second := live(t, nsPath)
	if d := redirect.Diff(first, second); len(d) > 0 {
		t.Fatalf("second ADD changed the rules:\n%s", strings.Join(d, "\n"))
	}
	if err := nft.New().Check(context.Background(), nsPath, wantPlan(t, pod, false)); err != nil {
		t.Fatal(err)
	}

	nstest.Sh(t, "ip", "netns", "del", nsName)
	if err := h.del(cl, rt); err != nil {
		t.Fatalf("DEL after the netns is gone: %v", err)
	}
}

// TestChainConcurrent: 50 pods ADDed at once on 50 namespaces of one node
// all get exactly their rules.
func TestChainConcurrent(t *testing.T) {
	needEnv(t)
	h := newHost(t, env.api, env.token)
	const n = 50
	type podNS struct {
		pod  *corev1.Pod
		path string
		rt   *libcni.RuntimeConf
	}
	cl := h.conflist(t, "1.0.0", nil)
	pods := make([]podNS, n)
	for i := range pods {
		p := loadPod(t, "injected.yaml")
		if i%2 == 1 { // half the pods differ, so a mix-up would show
			p = loadPod(t, "native-sidecar.yaml")
			p.Namespace = "shop"
		}
		p = createPod(t, env.api, p)
		_, path := nstest.New(t, fmt.Sprintf("cni-c%02d-", i))
		pods[i] = podNS{pod: p, path: path, rt: cnitest.RuntimeConf(p, path, "ctr-")}
	}
	var wg sync.WaitGroup
	errs := make([]error, n)
	start := time.Now()
	for i := range pods {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = h.add(cl, pods[i].rt)
		}()
	}
	wg.Wait()
	t.Logf("%d concurrent chain ADDs (bridge + nftmesh-cni) took %v", n, since(start))
	for i, p := range pods {
		if errs[i] != nil {
			t.Errorf("ADD %s: %v", p.pod.Name, errs[i])
			continue
		}
		if err := nft.New().Check(context.Background(), p.path, wantPlan(t, p.pod, false)); err != nil {
			t.Errorf("pod %s: %v", p.pod.Name, err)
		}
	}
	for _, p := range pods {
		if err := h.del(cl, p.rt); err != nil {
			t.Errorf("DEL %s: %v", p.pod.Name, err)
		}
		assertNoRules(t, p.path)
	}
}

// TestChainDualStack runs [bridge + dual-stack host-local, nftmesh-cni]
// through libcni and proves with real connections in both families what
// Istio does with a dual-stack pod (IPv4 listed first): when its sidecar is
// not dual-stack, only IPv4 is captured and IPv6 connections, outbound and
// inbound, go straight to their destination, with no ::6 on lo; with
// ISTIO_DUAL_STACK=true both families are captured and ::6 is on lo. CHECK
// agrees with the rules ADD installed.
func TestChainDualStack(t *testing.T) {
	needEnv(t)
	for _, dualStack := range []bool{false, true} {
		t.Run(fmt.Sprintf("ISTIO_DUAL_STACK=%t", dualStack), func(t *testing.T) {
			h := newHost(t, env.api, env.token)
			p := loadPod(t, "injected.yaml")
			if dualStack {
				for i := range p.Spec.Containers {
					if p.Spec.Containers[i].Name == meshpod.ProxyContainer {
						p.Spec.Containers[i].Env = append(p.Spec.Containers[i].Env, corev1.EnvVar{Name: meshpod.EnvDualStack, Value: "true"})
					}
				}
			}
			pod := createPod(t, env.api, p)
			nsName, nsPath := nstest.New(t, "cni-pod-")
			cl := h.conflist(t, "1.0.0", nil)
			// Replace the IPAM ranges with a dual-stack pair.
			var bridge map[string]any
			if err := json.Unmarshal(cl.Plugins[0].Bytes, &bridge); err != nil {
				t.Fatal(err)
			}
			bridge["ipam"].(map[string]any)["ranges"] = []any{
				[]any{map[string]any{"subnet": "198.51.100.0/24"}},
				[]any{map[string]any{"subnet": "2001:db8:100::/64"}},
			}
			data, _ := json.Marshal(map[string]any{"cniVersion": "1.0.0", "name": "nftmesh-test", "plugins": []any{bridge, h.pluginConf(nil)}})
			cl, err := libcni.ConfListFromBytes(data)
			if err != nil {
				t.Fatal(err)
			}
			rt := cnitest.RuntimeConf(pod, nsPath, "ctr-")
			res, err := h.add(cl, rt)
			if err != nil {
				t.Fatalf("ADD: %v", err)
			}
			t.Cleanup(func() { _ = h.del(cl, rt) })
			r, _ := current.NewResultFromResult(res)
			var pod4, pod6, gw4, gw6 netip.Addr
			for _, ip := range r.IPs {
				a, _ := netip.AddrFromSlice(ip.Address.IP)
				g, _ := netip.AddrFromSlice(ip.Gateway)
				if a.Unmap().Is4() {
					pod4, gw4 = a.Unmap(), g.Unmap()
				} else {
					pod6, gw6 = a, g
				}
			}
			if !pod4.IsValid() || !pod6.IsValid() || !gw4.IsValid() || !gw6.IsValid() {
				t.Fatalf("host-local did not give an address and gateway of each family: %s", mustJSON(r))
			}
			if err := nft.New().Check(context.Background(), nsPath, wantPlan(t, pod, dualStack)); err != nil {
				t.Fatalf("rules after ADD: %v", err)
			}
			out, err := exec.Command("ip", "-n", nsName, "-6", "addr", "show", "dev", "lo").CombinedOutput()
			if err != nil || strings.Contains(string(out), "::6/128") != dualStack {
				t.Errorf("::6 on lo: %t, want %t (%v):\n%s", strings.Contains(string(out), "::6/128"), dualStack, err, out)
			}
			if err := h.check(cl, rt); err != nil {
				t.Fatalf("CHECK: %v", err)
			}
			if got := addEvent(t, h.runDir, pod)["ipv6"]; got != dualStack {
				t.Errorf("ADD log line says ipv6 %v, want %v", got, dualStack)
			}

			// The bridge's gateway addresses stand for the world (a listener
			// on port 80 in the node's namespace); the node connects to the
			// pod's app port.
			topo := &netlab.Topology{PodNetns: nsName, PeerNetns: strings.TrimPrefix(h.netnsPath, "/run/netns/"), PodIface: "eth0",
				AppPorts: []uint16{8080}, PeerTCPPorts: []uint16{80}, PeerUDPPorts: []uint16{}}
			ls, err := netlab.StartListeners(topo, netlab.ListenerOptions{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = ls.Close() })
			ap := netip.AddrPortFrom
			app := func(dst netip.AddrPort) netlab.Probe {
				return netlab.Probe{From: netlab.FromApp, UID: netlab.AppUID, GID: netlab.AppGID, Proto: redirect.ProtoTCP, Dst: dst}
			}
			node := func(dst netip.AddrPort) netlab.Probe {
				return netlab.Probe{From: netlab.FromPeer, Proto: redirect.ProtoTCP, Dst: dst}
			}
			out6, in6, why6 := netlab.PeerListener(ap(gw6, 80)), netlab.AppListener(8080), "IPv6 not captured: the sidecar is not dual-stack"
			if dualStack {
				out6, in6, why6 = netlab.ListenerOutbound, netlab.ListenerInbound, "IPv6 captured: ISTIO_DUAL_STACK=true"
			}
			cases := []nettest.ProbeCase{
				{Name: "app→gateway-v4:80", Probe: app(ap(gw4, 80)), WantLanded: netlab.ListenerOutbound, WantOrig: ap(gw4, 80), Why: "IPv4 captured"},
				{Name: "app→gateway-v6:80", Probe: app(ap(gw6, 80)), WantLanded: out6, WantOrig: ap(gw6, 80), Why: why6},
				{Name: "node→pod-v4:8080", Probe: node(ap(pod4, 8080)), WantLanded: netlab.ListenerInbound, WantOrig: ap(pod4, 8080), Why: "IPv4 captured"},
				{Name: "node→pod-v6:8080", Probe: node(ap(pod6, 8080)), WantLanded: in6, WantOrig: ap(pod6, 8080), Why: why6},
			}
			waitReachable(t, topo, ap(gw6, 80))
			for _, o := range nettest.RunProbes(topo, cases) {
				if !o.OK() {
					t.Errorf("MISMATCH %s", o)
				} else {
					t.Logf("ok %s", o)
				}
			}

			if err := h.del(cl, rt); err != nil {
				t.Fatal(err)
			}
			assertNoRules(t, nsPath)
		})
	}
}

// waitReachable waits until dst (in the node's namespace) answers a
// connection from the pod sent as the proxy, whose traffic is never
// captured: until the bridge's duplicate address detection is over, a
// missing answer would look like a capture failure.
func waitReachable(t *testing.T, topo *netlab.Topology, dst netip.AddrPort) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := topo.Probe(netlab.Probe{From: netlab.FromApp, UID: 1337, GID: 1337, Proto: redirect.ProtoTCP, Dst: dst})
		if got.Landed == netlab.PeerListener(dst) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not reachable from the pod as the proxy after 10s: %s", dst, got)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return err.Error()
	}
	return string(b)
}
