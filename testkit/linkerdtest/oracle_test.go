package linkerdtest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/nftmesh/nftmesh/netlab"
	"github.com/nftmesh/nftmesh/podinfo/meshpod"
	"github.com/nftmesh/nftmesh/redirect"
	"github.com/nftmesh/nftmesh/testkit/kubetest"
)

// oracleCase is one pod on one node configuration.
type oracleCase struct {
	name   string
	pod    *corev1.Pod
	node   meshpod.LinkerdConfig
	nsAnn  map[string]string // the namespace's annotations
	stack  netlab.Stack
	extraP []uint16 // more app ports to listen on and probe
}

// runner applies one CNI plugin's ADD to a pod namespace.
type runner struct {
	name string
	add  func(t *testing.T, c oracleCase, netns string) error
}

// oracleEnv is what every case shares: the API server, the two plugins and
// their kubeconfigs.
type oracleEnv struct {
	api                      *kubetest.Server
	linkerdCNI, nftmeshCNI   string
	linkerdKube, nftmeshKube string
	runDir                   string
}

// TestLinkerdOracle runs Linkerd's own CNI plugin (linkerd-cni and its
// proxy-init code, built from shared/oracles/linkerd, exec'ing Debian's
// iptables-legacy or iptables-nft as on a Linkerd node) and nftmesh's
// standalone plugin (both backends), each in a throw-away pod network
// namespace, for every pod Linkerd's injector wrote (CNI-mode form) and a
// matrix of node settings and annotations, both plugins reading the pod
// (and its namespace) from a real kube-apiserver. Real connections then
// probe where each lands: inbound to every port, the app's outbound,
// loopback, the proxy's own (by UID, by GID), excluded ports and subnets,
// IPv6; every nftmesh run must land each one where linkerd-cni's does,
// original destination (SO_ORIGINAL_DST) included.
func TestLinkerdOracle(t *testing.T) {
	env := setupOracle(t)
	runners := []runner{
		{"linkerd-cni/legacy", env.linkerdAdd("legacy")},
		{"linkerd-cni/nft", env.linkerdAdd("nft")},
		{"nftmesh/nftables", env.nftmeshAdd(redirect.BackendNFTables)},
		{"nftmesh/iptables-legacy", env.nftmeshAdd(redirect.BackendLegacy)},
	}
	cases := oracleCases(t)
	probes := 0
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			env.createPod(t, c)
			ps := probesFor(c)
			var want []netlab.Result
			for i, r := range runners {
				got := runCase(t, c, r, ps)
				if i == 0 {
					want = got
					checkNotVacuous(t, c, ps, got)
					continue
				}
				for j := range ps {
					if got[j] != want[j] {
						t.Errorf("%s: %s landed %s, linkerd-cni's lands it %s", r.name, ps[j], got[j], want[j])
					}
				}
			}
			probes += len(ps)
		})
	}
	t.Logf("%d cases, %d probes in all, each compared across %d runs (linkerd-cni legacy and nft, nftmesh nftables and iptables-legacy)", len(cases), probes, len(runners))
}

func setupOracle(t *testing.T) *oracleEnv {
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces, runs iptables and nftmesh's plugin in them")
	}
	if testing.Short() {
		t.Skip("builds linkerd-cni and runs real traffic (-short)")
	}
	oracle, err := OracleDir()
	if errors.Is(err, ErrNoOracle) {
		t.Skipf("skipping: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	for _, bin := range []string{"iptables-legacy", "iptables-legacy-save", "iptables-nft", "iptables-nft-save", "ip6tables-legacy", "ip6tables-nft", "nsenter"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("skipping: %s not found (linkerd-cni runs Debian's iptables binaries: apt-get install iptables util-linux)", bin)
		}
	}
	env := &oracleEnv{api: kubetest.Start(t), runDir: t.TempDir()}
	if env.linkerdCNI, err = Build(oracle); err != nil {
		t.Fatal(err)
	}
	bin := t.TempDir()
	build := exec.Command("go", "build", "-o", bin+"/", "github.com/nftmesh/nftmesh/cmd/nftmesh-cni-standalone")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building nftmesh-cni-standalone: %v\n%s", err, out)
	}
	env.nftmeshCNI = filepath.Join(bin, "nftmesh-cni-standalone")
	env.nftmeshKube = filepath.Join(env.runDir, "kubeconfig")
	if err := env.api.WriteKubeconfig(env.nftmeshKube, env.api.AdminToken()); err != nil {
		t.Fatal(err)
	}
	env.linkerdKube = filepath.Join(env.runDir, "linkerd-kubeconfig")
	linkerdKubeconfig(t, env.nftmeshKube, env.linkerdKube)
	return env
}

// linkerdKubeconfig copies the kubeconfig at from with its context named
// as linkerd-cni asks for it (linkerd-cni-context).
func linkerdKubeconfig(t *testing.T, from, to string) {
	cfg, err := clientcmd.LoadFromFile(from)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Contexts["linkerd-cni-context"] = cfg.Contexts[cfg.CurrentContext]
	if err := clientcmd.WriteToFile(*cfg, to); err != nil {
		t.Fatal(err)
	}
}

// createPod creates the case's namespace (with its annotations) and pod.
func (e *oracleEnv) createPod(t *testing.T, c oracleCase) {
	ctx := context.Background()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: c.pod.Namespace, Annotations: c.nsAnn}}
	if _, err := e.api.Client().CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	p := c.pod.DeepCopy()
	// Volumes play no part in capture; the injected token volume needs a
	// service account this bare API server has no controller to make.
	p.Spec.Volumes = nil
	for _, list := range [][]corev1.Container{p.Spec.InitContainers, p.Spec.Containers} {
		for i := range list {
			list[i].VolumeMounts = nil
			if list[i].Image == "" {
				list[i].Image = "registry.example/x:1"
			}
		}
	}
	created, err := e.api.Client().CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c.pod.UID = created.UID
}

// linkerdAdd runs linkerd-cni's ADD as a runtime does, with its conflist
// entry as linkerd2-cni's chart writes it.
func (e *oracleEnv) linkerdAdd(mode string) func(*testing.T, oracleCase, string) error {
	return func(t *testing.T, c oracleCase, netns string) error {
		conf := map[string]any{
			"cniVersion": "0.3.1", "name": "k8s-pod-network", "type": "linkerd-cni", "log_level": "debug",
			"linkerd": map[string]any{
				"incoming-proxy-port": c.node.IncomingProxyPort, "outgoing-proxy-port": c.node.OutgoingProxyPort,
				"proxy-uid": c.node.ProxyUID, "proxy-gid": c.node.ProxyGID, "ports-to-redirect": orEmpty(c.node.PortsToRedirect),
				"inbound-ports-to-ignore": orEmpty(c.node.InboundPortsToIgnore), "outbound-ports-to-ignore": orEmpty(c.node.OutboundPortsToIgnore),
				"subnets-to-ignore": orEmpty(c.node.SubnetsToIgnore), "simulate": false, "use-wait-flag": false,
				"iptables-mode": mode, "ipv6": c.node.IPv6,
			},
			"kubernetes": map[string]any{"kubeconfig": e.linkerdKube},
		}
		return e.exec(e.linkerdCNI, conf, c, netns, "")
	}
}

// nftmeshAdd runs nftmesh's standalone plugin's ADD (no agent: it reads
// the pod and, lacking overrides, the namespace from the API).
func (e *oracleEnv) nftmeshAdd(backend string) func(*testing.T, oracleCase, string) error {
	return func(t *testing.T, c oracleCase, netns string) error {
		node := c.node
		conf := map[string]any{
			"cniVersion": "1.0.0", "name": "k8s-pod-network", "type": "nftmesh-cni", "log_level": "debug",
			"agent_run_dir": e.runDir, "kubeconfig": e.nftmeshKube, "backend": backend, "linkerd": &node,
		}
		return e.exec(e.nftmeshCNI, conf, c, netns, ";K8S_POD_UID="+string(c.pod.UID))
	}
}

func (e *oracleEnv) exec(bin string, conf map[string]any, c oracleCase, netns, extraArgs string) error {
	stdin, err := json.Marshal(conf)
	if err != nil {
		return err
	}
	cmd := exec.Command(bin)
	cmd.Stdin = bytes.NewReader(stdin)
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "CNI_COMMAND=ADD", "CNI_CONTAINERID=oracle-" + c.name,
		"CNI_NETNS=" + netns, "CNI_IFNAME=eth0", "CNI_PATH=/opt/cni/bin",
		"CNI_ARGS=K8S_POD_NAMESPACE=" + c.pod.Namespace + ";K8S_POD_NAME=" + c.pod.Name + extraArgs}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s ADD: %v\n%s", filepath.Base(bin), err, out.String())
	}
	return nil
}

func orEmpty[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// runCase applies r's ADD in a fresh topology and sends every probe.
func runCase(t *testing.T, c oracleCase, r runner, ps []netlab.Probe) []netlab.Result {
	t.Helper()
	topo, err := netlab.NewTopology(netlab.TopologyOptions{Prefix: "lko-", Stack: c.stack, AppPorts: appPorts(c),
		PeerTCPPorts: peerPorts, PeerUDPPorts: []uint16{53}})
	if err != nil {
		t.Fatal(err)
	}
	defer topo.Close()
	start := time.Now()
	if err := r.add(t, c, topo.PodNetnsPath()); err != nil {
		t.Fatalf("%s: %v", r.name, err)
	}
	t.Logf("%s ADD in %v", r.name, time.Since(start).Round(time.Millisecond))
	ls, err := netlab.StartListeners(topo, netlab.ListenerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer ls.Close()
	out := make([]netlab.Result, len(ps))
	for i, p := range ps {
		out[i] = topo.Probe(p)
	}
	return out
}

// checkNotVacuous: linkerd-cni itself must have captured what it should,
// or identical landings would prove nothing.
func checkNotVacuous(t *testing.T, c oracleCase, ps []netlab.Probe, got []netlab.Result) {
	out, in := listenerOf(uint16(c.node.OutgoingProxyPort)), listenerOf(uint16(c.node.IncomingProxyPort))
	var sawOut, sawIn bool
	for i := range ps {
		sawOut = sawOut || got[i].Landed == out
		sawIn = sawIn || got[i].Landed == in
	}
	if !sawOut || !sawIn {
		t.Fatalf("linkerd-cni's capture sent nothing to %s or %s: the comparison would be vacuous", out, in)
	}
}

func listenerOf(p uint16) string { return netlab.AppListener(p) }

var peerPorts = []uint16{80, 443, 3306, 5432, 6379, 6380, 6443, 9999}

// appPorts are the pod's listeners: the proxy's (so a redirected probe
// lands on a named listener, its original destination read back), its
// admin and control ports, the container ports and the ports the cases
// skip.
func appPorts(c oracleCase) []uint16 {
	ports := []uint16{4140, 4143, 4190, 4191, 22, 80, 1234, 4567, 8080, 8100, 8101, 8102, 9990, 9999}
	ports = append(ports, c.extraP...)
	for _, p := range []int{c.node.IncomingProxyPort, c.node.OutgoingProxyPort} {
		ports = append(ports, uint16(p))
	}
	return dedupPorts(ports)
}

func dedupPorts(ps []uint16) []uint16 {
	seen := map[uint16]bool{}
	var out []uint16
	for _, p := range ps {
		if !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	return out
}

// probesFor: inbound from the peer to every app port (both families),
// the app's outbound to every peer port, to loopback and to its own
// address, the proxy's own outbound (its UID; its GID with another UID),
// UDP.
func probesFor(c oracleCase) []netlab.Probe {
	tcp := redirect.ProtoTCP
	var ps []netlab.Probe
	for _, p := range appPorts(c) {
		ps = append(ps, netlab.Probe{From: netlab.FromPeer, Proto: tcp, Dst: netip.AddrPortFrom(netlab.PodV4, p)})
	}
	for _, p := range []uint16{80, 8080, 22} {
		ps = append(ps, netlab.Probe{From: netlab.FromPeer, Proto: tcp, Dst: netip.AddrPortFrom(netlab.PodV6, p)})
	}
	app := func(uid, gid uint32, dst netip.AddrPort) netlab.Probe {
		return netlab.Probe{From: netlab.FromApp, UID: uid, GID: gid, Proto: tcp, Dst: dst}
	}
	for _, p := range peerPorts {
		ps = append(ps, app(netlab.AppUID, netlab.AppGID, netip.AddrPortFrom(netlab.OtherV4Host, p)))
	}
	ps = append(ps,
		app(netlab.AppUID, netlab.AppGID, netip.AddrPortFrom(netlab.OtherV6Host, 80)),
		app(netlab.AppUID, netlab.AppGID, netip.AddrPortFrom(netlab.OtherV6Host, 5432)),
		app(netlab.AppUID, netlab.AppGID, netip.MustParseAddrPort("127.0.0.1:8080")),
		app(netlab.AppUID, netlab.AppGID, netip.MustParseAddrPort("[::1]:8080")),
		app(netlab.AppUID, netlab.AppGID, netip.AddrPortFrom(netlab.PodV4, 8080)),
		netlab.Probe{From: netlab.FromApp, UID: netlab.AppUID, GID: netlab.AppGID, Proto: redirect.ProtoUDP, Dst: netip.AddrPortFrom(netlab.OtherV4Host, 53)},
	)
	for _, id := range []uint32{2102, 3000, 3001, 2103} {
		ps = append(ps,
			app(id, netlab.AppGID, netip.AddrPortFrom(netlab.OtherV4Host, 80)),
			app(id, netlab.AppGID, netip.AddrPortFrom(netlab.PodV4, 8080)),
			app(netlab.AppUID+1, id, netip.AddrPortFrom(netlab.OtherV4Host, 80)),
			app(id, netlab.AppGID, netip.AddrPortFrom(netlab.OtherV6Host, 80)))
	}
	if c.stack != netlab.StackIPv6 {
		return ps
	}
	// An IPv6-only pod: its IPv4 probes could only time out.
	var v6 []netlab.Probe
	for _, p := range ps {
		if !p.Dst.Addr().Is4() {
			v6 = append(v6, p)
		}
	}
	return v6
}

// oracleCases: every injected pod with linkerd2-cni's chart defaults, then
// the CNI-mode pod under each variant.
func oracleCases(t *testing.T) []oracleCase {
	oracle, err := OracleDir()
	if err != nil {
		t.Fatal(err)
	}
	pods, err := Pods(oracle)
	if err != nil {
		t.Fatal(err)
	}
	var cases []oracleCase
	var base *corev1.Pod
	for i, p := range pods {
		p.Pod.Namespace = fmt.Sprintf("lk-pod%d", i)
		cases = append(cases, oracleCase{name: p.File, pod: p.Pod, node: meshpod.DefaultLinkerd(), stack: netlab.StackDual})
		if p.File == "inject_emojivoto_deployment_no_init_container" {
			base = p.Pod
		}
	}
	if base == nil {
		t.Fatal("no CNI-mode pod (inject_emojivoto_deployment_no_init_container) in the reference")
	}
	return append(cases, variants(base)...)
}

// variants are the matrix of node settings and annotations, each on the
// CNI-mode pod.
func variants(base *corev1.Pod) []oracleCase {
	ann := func(kv ...string) map[string]string {
		m := map[string]string{}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	type v struct {
		name    string
		podAnn  map[string]string
		nsAnn   map[string]string
		labels  map[string]string
		node    func(*meshpod.LinkerdConfig)
		stack   netlab.Stack
		extraPs []uint16
	}
	vs := []v{
		{name: "skip-ports-and-ranges", podAnn: ann(meshpod.AnnotationLinkerdSkipInboundPorts, "22,8100-8102,9999", meshpod.AnnotationLinkerdSkipOutboundPorts, "5432,6379-6380")},
		{name: "skip-subnet-of-the-peer", podAnn: ann(meshpod.AnnotationLinkerdSkipSubnets, "198.18.0.0/30")},
		{name: "skip-subnet-elsewhere", podAnn: ann(meshpod.AnnotationLinkerdSkipSubnets, "10.0.0.0/8, 192.168.0.0/16")},
		{name: "uid-gid-annotations", podAnn: ann(meshpod.AnnotationLinkerdProxyUID, "3000", meshpod.AnnotationLinkerdProxyGID, "3001")},
		{name: "node-gid", node: func(n *meshpod.LinkerdConfig) { n.ProxyGID = 2103 }},
		{name: "node-ports-to-redirect", node: func(n *meshpod.LinkerdConfig) { n.PortsToRedirect = []int{8080, 9990, 4191} }},
		{name: "node-ignores", node: func(n *meshpod.LinkerdConfig) {
			n.InboundPortsToIgnore = []string{"4190", "4191", "8080", "8100-8101"}
			n.OutboundPortsToIgnore = []string{"443", "3306"}
			n.SubnetsToIgnore = []string{"198.18.0.1/32"}
		}},
		{name: "node-ignores-pod-overrides", podAnn: ann(meshpod.AnnotationLinkerdSkipOutboundPorts, "80", meshpod.AnnotationLinkerdSkipInboundPorts, "22"),
			node: func(n *meshpod.LinkerdConfig) {
				n.OutboundPortsToIgnore = []string{"443"}
				n.InboundPortsToIgnore = []string{"4190", "4191", "8080"}
			}},
		{name: "node-ports", node: func(n *meshpod.LinkerdConfig) { n.IncomingProxyPort, n.OutgoingProxyPort = 5143, 5140 }, extraPs: []uint16{5140, 5143}},
		{name: "ipv6", node: func(n *meshpod.LinkerdConfig) { n.IPv6 = true }},
		{name: "ipv6-only-pod", node: func(n *meshpod.LinkerdConfig) { n.IPv6 = true }, stack: netlab.StackIPv6},
		{name: "namespace-annotations", nsAnn: ann(meshpod.AnnotationLinkerdSkipOutboundPorts, "3306", meshpod.AnnotationLinkerdSkipInboundPorts, "8080",
			meshpod.AnnotationLinkerdProxyUID, "3000", meshpod.AnnotationLinkerdSkipSubnets, "198.18.0.0/24")},
		{name: "namespace-annotations-pod-wins", nsAnn: ann(meshpod.AnnotationLinkerdSkipOutboundPorts, "3306", meshpod.AnnotationLinkerdProxyUID, "3000"),
			podAnn: ann(meshpod.AnnotationLinkerdSkipOutboundPorts, "5432", meshpod.AnnotationLinkerdProxyUID, "")},
		{name: "control-plane", labels: ann(meshpod.LabelLinkerdControlPlane, "destination")},
	}
	var out []oracleCase
	for i, x := range vs {
		p := base.DeepCopy()
		p.Namespace = fmt.Sprintf("lk-var%d", i)
		for k, val := range x.podAnn {
			if p.Annotations == nil {
				p.Annotations = map[string]string{}
			}
			p.Annotations[k] = val
		}
		for k, val := range x.labels {
			p.Labels[k] = val
		}
		node := meshpod.DefaultLinkerd()
		if x.node != nil {
			x.node(&node)
		}
		stack := x.stack
		if stack == 0 {
			stack = netlab.StackDual
		}
		out = append(out, oracleCase{name: x.name, pod: p, node: node, nsAnn: x.nsAnn, stack: stack, extraP: x.extraPs})
	}
	return out
}
