package bench

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/nftmesh/nftmesh/testkit/kubetest"
	"github.com/nftmesh/nftmesh/testkit/linkerdtest"
)

// linkerdPodFile is the reference pod Linkerd's injector wrote in CNI mode
// (linkerd-network-validator, no linkerd-init): what linkerd-cni captures.
const linkerdPodFile = "inject_emojivoto_deployment_no_init_container"

// BenchmarkLinkerdAgentUp is one ADD of a Linkerd-injected pod (Linkerd's
// own injector output, CNI mode) on a node whose agent runs with --linkerd:
// our nftmesh-cni front hands the call to the real nftmesh-agent, which has
// the pod from its node's pod watch and the namespace's annotations from
// its namespace watch over a real kube-apiserver; alternating with it in
// the same loop, Linkerd's own linkerd-cni (built from the reference source
// by testkit/linkerdtest) with its conflist entry as linkerd2-cni's chart
// writes it (iptables-mode nft, IPv6 off), which GETs the pod and its
// namespace and runs proxy-init's iptables-nft and iptables-nft-save
// processes. Both reach the API server through a proxy that counts their
// connections. Every ADD goes into a fresh netns and is checked with nft.
//
//	go test -run '^$' -bench LinkerdAgentUp -benchtime 30x ./e2e/bench/
func BenchmarkLinkerdAgentUp(b *testing.B) {
	needOurs(b)
	linkerdCNI, pod := needLinkerd(b)
	api := kubetest.Start(b)
	a := startAgentWith(b, api, []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"namespaces"}, Verbs: []string{"list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"services"}, Verbs: []string{"list", "watch"}},
	}, "--linkerd")
	a.waitSynced(b)
	ours, _, conns, _ := agentUpPlugins(b, api, a)
	api.ServiceAccount(b, agentNS, "linkerd-cni")
	api.Grant(b, agentNS, "linkerd-cni", true, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods", "namespaces"}, Verbs: []string{"get"}})
	// linkerd-cni's requests, counted one by one at an HTTP proxy.
	var theirReqs atomic.Int64
	var mu sync.Mutex
	reqKinds := map[string]int{} // "GET pods" etc.
	url, ca := api.Proxy(b, func(r *http.Request) func() {
		theirReqs.Add(1)
		mu.Lock()
		reqKinds[r.Method+" "+apiResource(r.URL.Path)]++
		mu.Unlock()
		return nil
	})
	theirs := linkerdCNIPlugin(b, linkerdCNI, url, ca, api.TokenFor(b, agentNS, "linkerd-cni"))
	ps := []plugin{ours, theirs}

	n := b.N
	pods := map[string][]*corev1.Pod{}
	api.EnsureNamespace(b, pod.Namespace)
	for _, p := range ps {
		for range n {
			pods[p.name] = append(pods[p.name], createLinkerdNodePod(b, api, pod))
		}
	}
	time.Sleep(time.Second) // the agent's watches have them

	walls := map[string][]time.Duration{}
	cpus := map[string][]time.Duration{}
	agentCPUs := []time.Duration{}
	owner := map[string]string{}
	reqs := map[string]int64{}
	i := 0
	for b.Loop() {
		for j := range ps {
			p := ps[(i+j)%len(ps)]
			b.StopTimer()
			name, path := newPodNetns(b)
			before, theirBefore, agentBefore := conns.count.Load(), theirReqs.Load(), a.cpu(b)
			b.StartTimer()
			r := addPod(b, p, pods[p.name][len(walls[p.name])%n], path)
			b.StopTimer()
			if b.Failed() {
				b.FailNow()
			}
			if p.name == "nftmesh" {
				agentCPUs = append(agentCPUs, a.cpu(b)-agentBefore)
			}
			reqs[p.name] += conns.count.Load() - before + theirReqs.Load() - theirBefore
			walls[p.name] = append(walls[p.name], r.wall)
			cpus[p.name] = append(cpus[p.name], r.cpu)
			owner[r.id] = p.name
			checkLinkerdCaptured(b, p, name)
			b.StartTimer()
		}
		i++
	}
	b.StopTimer()
	o50, l50 := pct(walls["nftmesh"], .5), pct(walls["linkerd-cni"], .5)
	b.ReportMetric(o50, "nftmesh-p50-ms")
	b.ReportMetric(pct(walls["nftmesh"], .99), "nftmesh-p99-ms")
	b.ReportMetric(l50, "linkerd-cni-p50-ms")
	b.ReportMetric(pct(walls["linkerd-cni"], .99), "linkerd-cni-p99-ms")
	b.ReportMetric(o50/l50, "p50-ratio")
	b.ReportMetric(pct(cpus["nftmesh"], .5), "nftmesh-cpu-p50-ms")
	b.ReportMetric(pct(agentCPUs, .5), "nftmesh-agent-cpu-p50-ms")
	b.ReportMetric(pct(cpus["linkerd-cni"], .5), "linkerd-cni-cpu-p50-ms")
	adds := float64(len(walls["nftmesh"]))
	b.ReportMetric(float64(reqs["nftmesh"])/adds, "nftmesh-api-conns/add")
	b.ReportMetric(float64(reqs["linkerd-cni"])/float64(len(walls["linkerd-cni"])), "linkerd-cni-api-req/add")
	mu.Lock()
	var kinds []string
	for k, v := range reqKinds {
		kinds = append(kinds, fmt.Sprintf("%s %.1f", k, float64(v)/float64(len(walls["linkerd-cni"]))))
	}
	mu.Unlock()
	slices.Sort(kinds)
	b.Logf("linkerd-cni's API requests per ADD: %s", strings.Join(kinds, ", "))
	_, ran := agentShare([]byte(a.logs.String()), owner)
	b.ReportMetric(float64(ran["nftmesh"])/adds, "nftmesh-ran-by-agent/add")
	if ran["nftmesh"] < len(walls["nftmesh"]) {
		b.Errorf("%d of %d ADDs ran in the standalone plugin, not the agent: the figures are not the agent path's\nagent's reason: %s",
			len(walls["nftmesh"])-ran["nftmesh"], len(walls["nftmesh"]), agentRefusal(a.logs.String()))
	}
	b.ReportMetric(0, "ns/op")
}

// needLinkerd skips unless the Linkerd reference and Debian's iptables-nft
// are here, and returns linkerd-cni (built once into .cache) and the
// reference's CNI-mode pod.
func needLinkerd(b *testing.B) (string, *corev1.Pod) {
	b.Helper()
	oracle, err := linkerdtest.OracleDir()
	if errors.Is(err, linkerdtest.ErrNoOracle) {
		b.Skipf("skipping: %v", err)
	}
	if err != nil {
		b.Fatal(err)
	}
	for _, bin := range []string{"iptables-nft", "iptables-nft-save"} {
		if _, err := exec.LookPath(bin); err != nil {
			b.Skipf("skipping: %s not found (linkerd-cni runs Debian's iptables binaries: apt-get install iptables)", bin)
		}
	}
	bin, err := linkerdtest.Build(oracle)
	if err != nil {
		b.Fatal(err)
	}
	pods, err := linkerdtest.Pods(oracle)
	if err != nil {
		b.Fatal(err)
	}
	for _, p := range pods {
		if p.File == linkerdPodFile {
			return bin, p.Pod
		}
	}
	b.Fatalf("no %s.yaml in %s/pods", linkerdPodFile, oracle)
	return "", nil
}

// createLinkerdNodePod creates a copy of pod bound to the agent's node,
// named uniquely, with the bench netns's addresses.
func createLinkerdNodePod(b *testing.B, api *kubetest.Server, pod *corev1.Pod) *corev1.Pod {
	b.Helper()
	p := pod.DeepCopy()
	p.Name, p.UID, p.ResourceVersion = "web-"+randHex(4), "", ""
	p.Spec.NodeName = agentNode
	// No service account controller here to make the token volume's
	// account; volumes play no part in capture.
	p.Spec.Volumes = nil
	for _, list := range [][]corev1.Container{p.Spec.InitContainers, p.Spec.Containers} {
		for i := range list {
			list[i].VolumeMounts = nil
		}
	}
	got, err := api.Client().CoreV1().Pods(p.Namespace).Create(context.Background(), p, metav1.CreateOptions{})
	if err != nil {
		b.Fatalf("creating pod: %v", err)
	}
	got.Status = corev1.PodStatus{Phase: corev1.PodPending, PodIP: podIPv4, PodIPs: []corev1.PodIP{{IP: podIPv4}, {IP: podIPv6}}}
	if got, err = api.Client().CoreV1().Pods(p.Namespace).UpdateStatus(context.Background(), got, metav1.UpdateOptions{}); err != nil {
		b.Fatalf("updating pod status: %v", err)
	}
	return got
}

// apiResource is the resource a core API path names ("pods", ...).
func apiResource(path string) string {
	parts := strings.Split(strings.Trim(path, "/"), "/")
	if len(parts) >= 5 && parts[2] == "namespaces" {
		return parts[4]
	}
	if len(parts) >= 3 {
		return parts[2]
	}
	return path
}

// linkerdCNIPlugin is linkerd-cni with its conflist entry as linkerd2-cni's
// chart writes it with its default values, its kubeconfig (context named
// as linkerd-cni asks) reaching the API server through the proxy at url,
// whose certificate is caPEM.
func linkerdCNIPlugin(b *testing.B, bin, url string, caPEM []byte, token string) plugin {
	b.Helper()
	runDir := b.TempDir()
	kc := filepath.Join(runDir, "ZZZ-linkerd-cni-kubeconfig")
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["c"] = &clientcmdapi.Cluster{Server: url, CertificateAuthorityData: caPEM}
	cfg.AuthInfos["u"] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["linkerd-cni-context"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "u"}
	cfg.CurrentContext = "linkerd-cni-context"
	if err := clientcmd.WriteToFile(*cfg, kc); err != nil {
		b.Fatal(err)
	}
	return plugin{name: "linkerd-cni", bin: bin, runDir: runDir, conf: func(prev map[string]any) []byte {
		// The same primary result, in the CNI version linkerd-cni reads.
		prev["cniVersion"] = "0.3.1"
		for _, ip := range prev["ips"].([]any) {
			ip := ip.(map[string]any)
			ip["version"] = map[bool]string{true: "6", false: "4"}[strings.Contains(ip["address"].(string), ":")]
		}
		return mustJSON(b, map[string]any{
			"cniVersion": "0.3.1", "name": "k8s-pod-network", "type": "linkerd-cni", "log_level": "info",
			"linkerd": map[string]any{
				"incoming-proxy-port": 4143, "outgoing-proxy-port": 4140, "proxy-uid": 2102, "proxy-gid": -1,
				"ports-to-redirect": []int{}, "inbound-ports-to-ignore": []string{"4191", "4190"},
				"outbound-ports-to-ignore": []string{}, "subnets-to-ignore": []string{}, "simulate": false,
				"use-wait-flag": false, "iptables-mode": "nft", "ipv6": false,
			},
			"kubernetes": map[string]any{"kubeconfig": kc},
			"prevResult": prev,
		})
	}}
}

// checkLinkerdCaptured reads the netns's ruleset with the nft binary and
// fails unless p's capture of the pod is there: our inet nftmesh table
// redirecting to Linkerd's proxy ports, or proxy-init's PROXY_INIT chains
// (written through iptables-nft).
func checkLinkerdCaptured(b *testing.B, p plugin, netnsName string) {
	b.Helper()
	out, err := exec.Command("ip", "netns", "exec", netnsName, "nft", "list", "ruleset").CombinedOutput()
	if err != nil {
		b.Fatalf("nft list ruleset in %s: %v %s", netnsName, err, out)
	}
	want := []string{"table inet nftmesh", "redirect to :4140", "redirect to :4143", "skuid 2102"}
	if p.name == "linkerd-cni" {
		want = []string{"table ip nat", "chain PROXY_INIT_REDIRECT", "chain PROXY_INIT_OUTPUT", "redirect to :4140", "redirect to :4143", "skuid 2102"}
	}
	var missing []string
	for _, w := range want {
		if !strings.Contains(string(out), w) {
			missing = append(missing, w)
		}
	}
	if len(missing) > 0 {
		b.Fatalf("%s: capture missing in %s (%s):\n%s", p.name, netnsName, strings.Join(missing, ", "), out)
	}
}
