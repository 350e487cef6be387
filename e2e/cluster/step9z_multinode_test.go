package cluster

// TestMultiNode runs last: its file sorts after every other step's, so the
// single-node tests before it see the one node they were written for. It
// adds nodes to the same cluster, asserts across them, and takes them out
// again.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/nftmesh/nftmesh/e2e/cluster/standin"
	"github.com/nftmesh/nftmesh/testkit/istiotest"
)

// httpbinPort is the injected httpbin's app port.
const httpbinPort = 8080

// multiNodeCount is how many nodes TestMultiNode runs on, the first one
// included: NFTMESH_E2E_NODES, 3 by default, at least 2.
func multiNodeCount(t *testing.T) int {
	v := os.Getenv("NFTMESH_E2E_NODES")
	if v == "" {
		return 3
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 2 || n > 8 {
		t.Fatalf("NFTMESH_E2E_NODES=%q: want a number from 2 to 8", v)
	}
	return n
}

// meshNode is one node as the multi-node test sees it.
type meshNode struct {
	name     string
	cidr     netip.Prefix
	conflist string // its primary CNI config (flannel's), as the test reaches it
	binDir   string
	pid      int    // its holder: the node's network namespace
	root     string // its mount namespace's root, as the test reaches it
}

// TestMultiNode is issue 23's multi-node e2e on the same cluster, on
// flannel (issue 33): flannel becomes the primary CNI (its DaemonSet, VXLAN
// backend, kube subnet manager; flannel_test.go), more nodes (kubelet +
// containerd each in its own network and mount namespace) join the control
// plane, the chart's DaemonSet must run a ready agent on every node with
// our entry last in flannel's conflist on each node, and flannel's routes
// to every other node's pods through its VXLAN device; flannel's pod on one
// node is deleted, its replacement writes its conflist again and the agent
// must put its entry back; Istio-injected
// clients and servers on different nodes must have each cross-node
// connection captured at both ends, one connection end to end as through
// Envoy (the client's app dials the server's pod address; its sidecar
// accepts it on 15001 with the server as original destination and relays
// it, as UID 1337, from some address X; the server's sidecar accepts it on
// 15006 with the server as original destination and X as peer, and
// answers the app); one node is
// drained and its agent pod deleted while the others keep starting mesh
// pods, all of which must start captured. `helm uninstall` must then give
// every node flannel's file back byte for byte. The nodes are taken out
// afterwards, leaving nothing, and the first node gets its bridge back.
func TestMultiNode(t *testing.T) {
	c := need(t)
	c.standinReady(t)
	ctx := context.Background()
	total := multiNodeCount(t)
	tStart := time.Now()
	if _, err := os.Stat(filepath.Join(flannelDir(), "flanneld-"+flannelVersion)); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI=true and flannel is missing: %v (make flannel)", err)
		}
		t.Skipf("skipping: flannel is missing: %v (make flannel builds it)", err)
	}

	var workers []*workerNode
	t.Cleanup(func() {
		if err := c.stopFlannel(context.Background()); err != nil {
			t.Errorf("stopping flannel: %v", err)
		}
	})
	t.Cleanup(func() {
		t0 := time.Now()
		c.removeNodes(t, workers)
		record("multinode: %d nodes removed (pods deleted, stopped, nothing left) %.2fs", len(workers), time.Since(t0).Seconds())
		record("multinode: whole test %.2fs", time.Since(tStart).Seconds())
	})
	t.Cleanup(func() {
		c.deleteMesh(t)
		chartMu.Lock()
		installed := chartInstalled
		chartMu.Unlock()
		if installed {
			if err := uninstallChart(context.Background(), c); err != nil {
				t.Error(err)
			}
		}
	})

	// flannel first: the first node's bridge config goes aside, which
	// takes the chart out if an earlier test left it in.
	t0 := time.Now()
	if err := c.startFlannel(ctx); err != nil {
		t.Fatalf("flannel: %v\n%s", err, c.Logs(30))
	}
	record("multinode: flannel the first node's primary CNI %.2fs", time.Since(t0).Seconds())

	// The chart goes in while the nodes join: its DaemonSet follows them.
	t0 = time.Now()
	chartDone := make(chan error, 1)
	go func() { chartDone <- installChartOnce(c) }()
	workers, err := c.AddNodes(ctx, total-1, filepath.Join(c.Dir, "images", "standin.tar"))
	chartErr := <-chartDone
	if err != nil {
		t.Fatalf("adding nodes: %v\n%s", err, c.Logs(30))
	}
	record("multinode: %d nodes joined (Ready, pod CIDR set) %.2fs", len(workers), time.Since(t0).Seconds())
	if chartErr != nil {
		t.Fatal(chartErr)
	}

	nodes := []meshNode{{name: nodeName, cidr: netip.MustParsePrefix(podCIDR), conflist: filepath.Join(c.CNIConfDir, flannelConflist),
		binDir: c.CNIBinDir, pid: c.holderPID, root: c.NodePath("")}}
	for _, w := range workers {
		nodes = append(nodes, meshNode{name: w.Name, cidr: netip.MustParsePrefix(w.PodCIDR), conflist: w.Conflist,
			binDir: w.CNIBinDir, pid: w.pid(), root: w.NodePath("")})
	}

	if err := c.meshPrerequisites(ctx, "httpbin"); err != nil {
		t.Fatal(err)
	}

	// 1. The DaemonSet on every node, each agent ready, our entry last in
	// each node's flannel conflist (and only there: each node's own
	// directories), flannel's lease and VXLAN routes on every node.
	if err := c.waitAgents(ctx, len(nodes)); err != nil {
		t.Fatal(err)
	}
	record("multinode: chart installed as they joined: DaemonSet ready on %d nodes %.2fs after the join began", len(nodes), time.Since(t0).Seconds())
	for _, n := range nodes {
		if p, err := c.agentOn(ctx, n.name); err != nil {
			t.Error(err)
		} else if !podReady(p) {
			t.Errorf("node %s: agent %s not Ready: %s", n.name, p.Name, podState(p))
		}
		if err := nftmeshLast(n.conflist); err != nil {
			t.Errorf("node %s: %v", n.name, err)
		}
		if st, err := os.Stat(filepath.Join(n.binDir, "nftmesh-cni")); err != nil || !st.Mode().IsRegular() {
			t.Errorf("node %s: nftmesh-cni not installed in %s (%v)", n.name, n.binDir, err)
		}
		if conf, err := os.ReadFile(n.conflist); err != nil || !strings.Contains(string(conf), `"type": "flannel"`) {
			t.Errorf("node %s: %s is not flannel's config (%v):\n%s", n.name, n.conflist, err, conf)
		}
		if err := c.checkFlannelNode(n, nodes); err != nil {
			t.Errorf("node %s: flannel: %v", n.name, err)
		}
	}
	if t.Failed() {
		t.FailNow()
	}

	// flannel restarted on one node: its config written again without our
	// entry, which the agent must put back before the pods below start.
	if err := c.restartFlannel(ctx, nodes[1]); err != nil {
		t.Fatalf("node %s: flannel restart: %v", nodes[1].name, err)
	}

	// 2. Cross-node capture: a server on every node, then a client on every
	// node whose app dials every other node's server through its
	// forwarding sidecar. The
	// clients need only the servers' addresses, which a pod has once its
	// sandbox is up, before its containers run.
	t0 = time.Now()
	started := 0
	servers := make([]*corev1.Pod, len(nodes))
	// The sidecars forward, as Envoy does (the servers' only for likeness:
	// nothing dials out of them).
	base := injectedHTTPBin(t, istiotest.Standin{Image: standinImage, Every: dialEvery, ProxyForward: true}).Spec.Template
	serversDone := make(chan error, 1)
	go func() {
		serversDone <- c.startMeshPods(ctx, len(nodes), func(i int) (*corev1.Pod, string) {
			return meshPodOn(base, fmt.Sprintf("mn-server-%d", i), nodes[i].name), nodes[i].name
		}, servers)
	}()
	serverIPs := make([]string, len(nodes))
	if err := c.poll(ctx, 120*time.Second, "the servers' pod addresses", func() (bool, error) {
		for i := range nodes {
			if serverIPs[i] != "" {
				continue
			}
			if p, err := c.Client.CoreV1().Pods(meshNS).Get(ctx, fmt.Sprintf("mn-server-%d", i), metav1.GetOptions{}); err == nil {
				serverIPs[i] = p.Status.PodIP
			}
		}
		return !slices.Contains(serverIPs, ""), nil
	}); err != nil {
		t.Fatalf("%v (%v)", err, <-serversDone)
	}
	clients := make([]*corev1.Pod, len(nodes))
	clientsErr := c.startMeshPods(ctx, len(nodes), func(i int) (*corev1.Pod, string) {
		var targets []string
		for j, ip := range serverIPs {
			if j != i {
				targets = append(targets, netip.AddrPortFrom(netip.MustParseAddr(ip), httpbinPort).String())
			}
		}
		tmpl := injectedHTTPBin(t, istiotest.Standin{Image: standinImage, Every: dialEvery, AppConnect: targets, ProxyForward: true}).Spec.Template
		return meshPodOn(tmpl, fmt.Sprintf("mn-client-%d", i), nodes[i].name), nodes[i].name
	}, clients)
	if err := <-serversDone; err != nil {
		t.Error(err)
	}
	if clientsErr != nil {
		t.Error(clientsErr)
	}
	if t.Failed() {
		t.FailNow()
	}
	started += len(servers) + len(clients)
	record("multinode: %d servers, and as soon as they had addresses %d clients dialing the other nodes' servers, Running and captured %.2fs", len(servers), len(clients), time.Since(t0).Seconds())
	logs := c.agentLogs(ctx, t, nodes)
	for i, n := range nodes {
		for _, p := range []*corev1.Pod{servers[i], clients[i]} {
			if !n.cidr.Contains(netip.MustParseAddr(p.Status.PodIP)) {
				t.Errorf("pod %s on %s has address %s, outside the node's %s", p.Name, n.name, p.Status.PodIP, n.cidr)
			}
			if line := decisionLine(logs[n.name], meshNS, p.Name, "ADD"); line == nil || line["decision"] != "capture" {
				t.Errorf("node %s's agent: ADD decision for %s is %v, want capture", n.name, p.Name, line)
			}
		}
	}
	t0 = time.Now()
	pairs, captured := 0, 0
	var pairMu sync.Mutex
	var pairWG sync.WaitGroup
	for i := range nodes {
		for j := range nodes {
			if i == j {
				continue
			}
			pairs++
			pairWG.Add(1)
			go func() {
				defer pairWG.Done()
				chain, err := c.crossNode(ctx, clients[i], servers[j])
				if err != nil {
					t.Errorf("client on %s → server on %s: %v", nodes[i].name, nodes[j].name, err)
					return
				}
				t.Logf("client on %s → server on %s: %s", nodes[i].name, nodes[j].name, chain)
				pairMu.Lock()
				captured++
				pairMu.Unlock()
			}()
		}
	}
	pairWG.Wait()
	t.Logf("%d/%d cross-node connections captured at both ends (checked in %.1fs)", captured, pairs, time.Since(t0).Seconds())

	// 3. One node drained and its agent deleted while the others keep
	// starting mesh pods, every one captured at its first start.
	drained := nodes[len(nodes)-1]
	started += c.churnWhileDraining(ctx, t, nodes[:len(nodes)-1], drained.name)

	record("multinode: nodes=%d pods=%d cross-node captured=%d/%d", len(nodes), started, captured, pairs)

	// 4. helm uninstall: flannel's file back on every node, byte for byte.
	c.uninstallToFlannel(ctx, t, nodes)
}

// meshPodOn is a mesh pod from tmpl named name, pinned to node by its
// hostname label (so the scheduler, and a cordon, still decide).
func meshPodOn(tmpl corev1.PodTemplateSpec, name, node string) *corev1.Pod {
	pod := &corev1.Pod{ObjectMeta: *tmpl.ObjectMeta.DeepCopy(), Spec: *tmpl.Spec.DeepCopy()}
	pod.Name, pod.Namespace = name, meshNS
	if pod.Labels == nil {
		pod.Labels = map[string]string{}
	}
	pod.Labels[meshLabel] = "true"
	pod.Spec.NodeSelector = map[string]string{corev1.LabelHostname: node}
	return pod
}

// startMeshPods creates n mesh pods at once and waits until each runs on
// its node with istio-validation passing at its first run; out gets the
// running pods.
func (c *Cluster) startMeshPods(ctx context.Context, n int, build func(int) (*corev1.Pod, string), out []*corev1.Pod) error {
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		pod, node := build(i)
		go func() {
			if _, err := c.Client.CoreV1().Pods(meshNS).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
				errs <- fmt.Errorf("creating %s: %w", pod.Name, err)
				return
			}
			restarts, err := c.waitCaptured(ctx, pod.Name)
			if err != nil {
				errs <- err
				return
			}
			p, err := c.Client.CoreV1().Pods(meshNS).Get(ctx, pod.Name, metav1.GetOptions{})
			switch {
			case err != nil:
				errs <- err
			case p.Spec.NodeName != node:
				errs <- fmt.Errorf("pod %s runs on %s, want %s", p.Name, p.Spec.NodeName, node)
			case restarts != 0:
				errs <- fmt.Errorf("pod %s: istio-validation ran %d times, want once (the agent was there)", p.Name, restarts+1)
			default:
				out[i] = p
				errs <- nil
			}
		}()
	}
	var all []string
	for i := 0; i < n; i++ {
		if err := <-errs; err != nil {
			all = append(all, err.Error())
		}
	}
	if len(all) > 0 {
		return fmt.Errorf("%s", strings.Join(all, "\n"))
	}
	return nil
}

// crossNode checks one client → server connection across nodes, from the
// three stand-ins' logs, as ONE connection end to end: the client's app
// dialed the server's pod address from A and was answered by the server's
// sidecar's inbound listener with the server as original destination, the
// reply naming X as the peer it saw; the client's sidecar logged accepting
// that connection on its outbound listener from A, with the server as
// original destination, and forwarding it from X; the server's sidecar
// logged accepting it on its inbound listener, to the server, from X
// exactly (the same port: no NAT between the nodes, the same connection),
// and X is the client pod's address. It returns that chain, for the log.
func (c *Cluster) crossNode(ctx context.Context, client, server *corev1.Pod) (string, error) {
	target := netip.AddrPortFrom(netip.MustParseAddr(server.Status.PodIP), httpbinPort).String()
	app := ""
	for _, ctr := range client.Spec.Containers {
		if ctr.Name != istiotest.ProxyContainer {
			app = ctr.Name
			break
		}
	}
	if err := c.waitDial(ctx, "client app's connection", client.Name, app, target,
		reply{pod: server.Name, listener: standin.ListenerInbound, orig: target}); err != nil {
		return "", err
	}
	why := "no dial read yet"
	chain := ""
	err := c.poll(ctx, 30*time.Second, "one connection through both sidecars", func() (bool, error) {
		appEv, _, err := c.logEvents(ctx, meshNS, client.Name, app)
		if err != nil {
			why = err.Error()
			return false, nil
		}
		outEv, _, err := c.logEvents(ctx, meshNS, client.Name, istiotest.ProxyContainer)
		if err != nil {
			why = err.Error()
			return false, nil
		}
		inEv, _, err := c.logEvents(ctx, meshNS, server.Name, istiotest.ProxyContainer)
		if err != nil {
			why = err.Error()
			return false, nil
		}
		for _, d := range appEv {
			if d.Event != standin.EventDialed || d.Target != target || d.Reply == nil {
				continue
			}
			x := d.Reply.Peer
			out := findAccepted(outEv, standin.ListenerOutbound, target, func(e standin.Event) bool { return e.ForwardFrom == x })
			if out == nil {
				why = fmt.Sprintf("client %s's sidecar logged no outbound connection to %s forwarded from %s (the peer the server's sidecar answered)", client.Name, target, x)
				continue
			}
			if out.Peer != d.Local || out.Error != "" {
				why = fmt.Sprintf("client %s's sidecar forwarded from %s a connection from %s (error %q), want the app's %s", client.Name, x, out.Peer, out.Error, d.Local)
				continue
			}
			in := findAccepted(inEv, standin.ListenerInbound, target, func(e standin.Event) bool { return e.Peer == x })
			if in == nil {
				why = fmt.Sprintf("server %s's sidecar logged no inbound connection to %s from %s (the client sidecar's forwarding address)", server.Name, target, x)
				continue
			}
			if xa, err := netip.ParseAddrPort(x); err != nil || xa.Addr().String() != client.Status.PodIP {
				return false, fmt.Errorf("the connection to %s reached server %s from %s, not from the client pod's address %s", target, server.Name, x, client.Status.PodIP)
			}
			chain = fmt.Sprintf("app %s → %s, its sidecar forwarded from %s, the server's sidecar saw peer %s on %s", d.Local, target, out.ForwardFrom, in.Peer, in.Listener)
			return true, nil
		}
		return false, nil
	})
	if err != nil {
		return "", fmt.Errorf("%w: %s", err, why)
	}
	return chain, nil
}

// findAccepted returns the first "accepted" event of listener for orig
// for which match is true, or nil.
func findAccepted(ev []standin.Event, listener, orig string, match func(standin.Event) bool) *standin.Event {
	for i := range ev {
		e := &ev[i]
		if e.Event == standin.EventAccepted && e.Listener == listener && e.Orig == orig && match(*e) {
			return e
		}
	}
	return nil
}

// waitAgents waits until the DaemonSet runs one ready agent on each of n
// nodes.
func (c *Cluster) waitAgents(ctx context.Context, n int) error {
	var last string
	err := c.poll(ctx, 120*time.Second, fmt.Sprintf("the DaemonSet ready on %d nodes", n), func() (bool, error) {
		ds, err := c.Client.AppsV1().DaemonSets(agentNS).Get(ctx, agentDaemonSet, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		st := ds.Status
		last = fmt.Sprintf("desired %d, scheduled %d, ready %d, updated %d, available %d", st.DesiredNumberScheduled, st.CurrentNumberScheduled, st.NumberReady, st.UpdatedNumberScheduled, st.NumberAvailable)
		return int(st.DesiredNumberScheduled) == n && int(st.NumberReady) == n && int(st.UpdatedNumberScheduled) == n && int(st.NumberAvailable) == n, nil
	})
	if err != nil {
		return fmt.Errorf("%w (%s)", err, last)
	}
	return nil
}

// agentOn returns the agent pod on node that is not being deleted.
func (c *Cluster) agentOn(ctx context.Context, node string) (*corev1.Pod, error) {
	return c.livePodOn(ctx, agentNS, "app.kubernetes.io/name=nftmesh-agent", node, "agent")
}

// livePodOn returns the pod in ns matching selector on node that is not
// being deleted (what names it in the error).
func (c *Cluster) livePodOn(ctx context.Context, ns, selector, node, what string) (*corev1.Pod, error) {
	l, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{
		LabelSelector: selector,
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", node).String(),
	})
	if err != nil {
		return nil, err
	}
	for i := range l.Items {
		if l.Items[i].DeletionTimestamp == nil {
			return &l.Items[i], nil
		}
	}
	return nil, fmt.Errorf("no %s pod on %s", what, node)
}

func podReady(p *corev1.Pod) bool {
	for _, cond := range p.Status.Conditions {
		if cond.Type == corev1.PodReady {
			return cond.Status == corev1.ConditionTrue
		}
	}
	return false
}

// agentLogs reads the log of each node's agent.
func (c *Cluster) agentLogs(ctx context.Context, t *testing.T, nodes []meshNode) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, n := range nodes {
		p, err := c.agentOn(ctx, n.name)
		if err != nil {
			t.Fatal(err)
		}
		raw, err := c.Client.CoreV1().Pods(agentNS).GetLogs(p.Name, &corev1.PodLogOptions{Container: "agent"}).DoRaw(ctx)
		if err != nil {
			t.Fatalf("reading the log of agent %s on %s: %v", p.Name, n.name, err)
		}
		out[n.name] = string(raw)
	}
	return out
}

// nftmeshLast says why conflist does not end in exactly one nftmesh-cni
// entry.
func nftmeshLast(conflist string) error {
	conf, err := os.ReadFile(conflist)
	if err != nil {
		return err
	}
	var list struct {
		Plugins []map[string]any `json:"plugins"`
	}
	if err := json.Unmarshal(conf, &list); err != nil {
		return fmt.Errorf("conflist %s: %w\n%s", conflist, err, conf)
	}
	n := 0
	for _, p := range list.Plugins {
		if p["type"] == "nftmesh-cni" {
			n++
		}
	}
	if k := len(list.Plugins); n != 1 || k < 2 || list.Plugins[k-1]["type"] != "nftmesh-cni" {
		return fmt.Errorf("nftmesh-cni is not the one last plugin of %s:\n%s", conflist, conf)
	}
	return nil
}

// churnWhileDraining creates mesh pods one after the other, round-robin
// over busy, while drained is drained (kubectl drain: cordoned, its pods
// evicted) and, during the drain, its agent pod deleted; it waits for the
// agent's replacement on the drained node, uncordons it and starts one more
// mesh pod there. Every pod must run with validation passing at its first
// run (the busy nodes' agents never left; the drained node's is back) and
// have a capture decision in its node's agent log. It returns how many pods
// it started.
func (c *Cluster) churnWhileDraining(ctx context.Context, t *testing.T, busy []meshNode, drained string) int {
	t.Helper()
	base := injectedHTTPBin(t, istiotest.Standin{Image: standinImage, Every: dialEvery}).Spec.Template
	const maxInFlight = 4
	var (
		mu       sync.Mutex
		failures []string
		onNode   = map[string][]string{} // node → pods started there
		starts   []time.Duration
		checks   sync.WaitGroup
	)
	slots := make(chan struct{}, maxInFlight)
	stop := make(chan struct{})
	var createDone sync.WaitGroup
	createDone.Add(1)
	go func() {
		defer createDone.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case slots <- struct{}{}:
			}
			node := busy[i%len(busy)].name
			pod := meshPodOn(base, fmt.Sprintf("mn-churn-%d", i), node)
			t0 := time.Now()
			if _, err := c.Client.CoreV1().Pods(meshNS).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
				mu.Lock()
				failures = append(failures, fmt.Sprintf("creating %s: %v", pod.Name, err))
				mu.Unlock()
				<-slots
				return
			}
			mu.Lock()
			onNode[node] = append(onNode[node], pod.Name)
			mu.Unlock()
			checks.Add(1)
			go func(name string) {
				defer checks.Done()
				defer func() { <-slots }()
				restarts, err := c.waitCaptured(ctx, name)
				took := time.Since(t0)
				mu.Lock()
				switch {
				case err != nil:
					failures = append(failures, err.Error())
				case restarts != 0:
					failures = append(failures, fmt.Sprintf("%s: istio-validation ran %d times, want once", name, restarts+1))
				default:
					starts = append(starts, took)
				}
				mu.Unlock()
				if err := c.deletePodAndWait(ctx, name); err != nil {
					mu.Lock()
					failures = append(failures, err.Error())
					mu.Unlock()
				}
			}(pod.Name)
			time.Sleep(500 * time.Millisecond)
		}
	}()

	time.Sleep(2 * time.Second)
	old, err := c.agentOn(ctx, drained)
	if err != nil {
		t.Fatal(err)
	}
	// The drain and the agent's deletion overlap: the evicted pods' DEL
	// may find the node without its agent (the plugin then runs alone).
	t0 := time.Now()
	var drainTook time.Duration
	drainDone := make(chan struct{})
	go func() {
		defer close(drainDone)
		out, err := c.Kubectl(ctx, "drain", drained, "--ignore-daemonsets", "--delete-emptydir-data", "--force",
			"--grace-period=1", "--timeout=90s")
		drainTook = time.Since(t0)
		if err != nil {
			t.Error(err)
			return
		}
		t.Logf("kubectl drain %s:\n%s", drained, strings.TrimSpace(out))
	}()
	if err := c.poll(ctx, 30*time.Second, drained+" cordoned", func() (bool, error) {
		n, err := c.Client.CoreV1().Nodes().Get(ctx, drained, metav1.GetOptions{})
		return err == nil && n.Spec.Unschedulable, nil
	}); err != nil {
		t.Error(err)
	}
	t1 := time.Now()
	if err := c.Client.CoreV1().Pods(agentNS).Delete(ctx, old.Name, metav1.DeleteOptions{}); err != nil {
		t.Error(err)
	}
	err = c.poll(ctx, 120*time.Second, "the replacement agent on "+drained, func() (bool, error) {
		p, err := c.agentOn(ctx, drained)
		return err == nil && p.Name != old.Name && podReady(p), nil
	})
	if err != nil {
		t.Error(err)
	}
	agentTook := time.Since(t1)
	<-drainDone
	record("multinode: drain of %s %.2fs, its agent pod deleted during it → replacement Ready %.2fs", drained, drainTook.Seconds(), agentTook.Seconds())
	close(stop)

	// The drained node back in service: a new pod there starts captured by
	// the replacement agent, while the last churn pods finish.
	afterOK := false
	if _, err := c.Kubectl(ctx, "uncordon", drained); err != nil {
		t.Error(err)
	} else {
		after := make([]*corev1.Pod, 1)
		if err := c.startMeshPods(ctx, 1, func(int) (*corev1.Pod, string) {
			return meshPodOn(base, "mn-after-drain", drained), drained
		}, after); err != nil {
			t.Error(err)
		} else {
			afterOK = true
			log := c.agentLogs(ctx, t, []meshNode{{name: drained}})[drained]
			if line := decisionLine(log, meshNS, after[0].Name, "ADD"); line == nil || line["decision"] != "capture" {
				t.Errorf("the replacement agent on %s: ADD decision for %s is %v, want capture", drained, after[0].Name, line)
			}
		}
	}
	createDone.Wait()
	checks.Wait()
	for _, f := range failures {
		t.Error(f)
	}
	// Each busy node's agent logged a capture decision for each of its pods.
	logs := c.agentLogs(ctx, t, busy)
	created := 0
	for node, pods := range onNode {
		created += len(pods)
		for _, p := range pods {
			if line := decisionLine(logs[node], meshNS, p, "ADD"); line == nil || line["decision"] != "capture" {
				t.Errorf("node %s's agent: ADD decision for %s is %v, want capture", node, p, line)
			}
		}
	}
	var p50, p95 time.Duration
	if len(starts) > 0 {
		p50, p95 = percentiles(starts)
	}
	record("multinode: %d mesh pods started on %d nodes while %s was drained and its agent replaced: %d not captured at the first start; create → Running and captured p50 %v p95 %v",
		created, len(busy), drained, len(failures), p50.Round(100*time.Millisecond), p95.Round(100*time.Millisecond))
	if afterOK {
		created++
	}
	return created
}
