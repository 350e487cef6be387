package inplace

import (
	"context"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/nftmesh/nftmesh/installer/metrics"
	"github.com/nftmesh/nftmesh/installer/repair"
	"github.com/nftmesh/nftmesh/nft"
	"github.com/nftmesh/nftmesh/redirect"
	"github.com/nftmesh/nftmesh/testkit/cgrouptest"
	"github.com/nftmesh/nftmesh/testkit/kubetest"

	"github.com/nftmesh/nftmesh/testkit/syncbuf"
)

// chartRepairRules are the rules the chart grants the agent in repairPods
// mode: the plugin's get, and the repair role's list/watch and events
// (charts' TestRBACMatchesRepairMode pins the rendered chart to these).
var chartRepairRules = []rbacv1.PolicyRule{
	{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get"}},
	{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list", "watch"}},
	{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create"}},
}

// brokenStatus is what the kubelet reports for a pod whose istio-validation
// init container found no capture: it exited 126 and is crash-looping.
func brokenStatus(ips []netip.Addr, restarts int32) corev1.PodStatus {
	st := corev1.PodStatus{Phase: corev1.PodPending}
	for _, ip := range ips {
		st.PodIPs = append(st.PodIPs, corev1.PodIP{IP: ip.String()})
	}
	st.PodIP = ips[0].String()
	st.InitContainerStatuses = []corev1.ContainerStatus{{
		Name: "istio-validation", Image: "docker.io/istio/proxyv2:1.27.0", RestartCount: restarts,
		State:                corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}},
		LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 126, Reason: "Error", Message: "iptables validation failed; workload is not ready for Istio"}},
	}}
	return st
}

func createBrokenPod(t *testing.T, c kubernetes.Interface, name, node string, ips []netip.Addr) *corev1.Pod {
	t.Helper()
	ctx := context.Background()
	p := loadPod(t, "injected.yaml")
	p.UID = ""
	p.Name = name
	p.Spec.NodeName = node
	p, err := c.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating pod: %v", err)
	}
	p.Status = brokenStatus(ips, 1)
	p, err = c.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, p, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("updating pod status: %v", err)
	}
	return p
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for: %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// The informer path end to end: a real API server holds a pod bound to
// this node whose istio-validation last exited 126; the repair controller,
// authenticated with a token that has exactly the chart's repairPods RBAC,
// sees it, finds the running pod's namespace through /proc and programs
// the rules. A later status update does not repair it twice, and a broken
// pod on another node is not touched.
func TestRepairControllerInPlace(t *testing.T) {
	needRoot(t)
	s := kubetest.Start(t)
	ctx := context.Background()
	admin := s.Client()
	s.EnsureNamespace(t, "shop")
	s.ServiceAccount(t, "nftmesh-system", "nftmesh-agent")
	s.Grant(t, "nftmesh-system", "nftmesh-agent", true, chartRepairRules...)
	agent := kubernetes.NewForConfigOrDie(s.ConfigFor(s.TokenFor(t, "nftmesh-system", "nftmesh-agent")))

	v4, v6 := uniqueAddrs()
	ips := []netip.Addr{v4.Addr(), v6.Addr()}
	nsName := podNetns(t, v4, v6)
	nsPath := "/run/netns/" + nsName

	pause := sleeper(t, nsName)
	pod := createBrokenPod(t, admin, "web-broken", "node-1", ips)
	cgrouptest.MovePod(t, pause, cgrouptest.CgroupfsLeaf(string(pod.UID)))
	o4, o6 := uniqueAddrs()
	other := podNetns(t, o4, o6)
	_ = sleeper(t, other)
	_ = createBrokenPod(t, admin, "web-other-node", "node-2", []netip.Addr{o4.Addr(), o6.Addr()})

	cfg := repair.DefaultConfig()
	cfg.Enabled, cfg.RepairPods, cfg.NodeName, cfg.HostProc = true, true, "node-1", "/proc"
	r, err := New(Options{ProcDir: cfg.HostProc, Backend: "nftables", ExcludeNamespaces: []string{"kube-system"}})
	if err != nil {
		t.Fatal(err)
	}
	m := metrics.New()
	var logs syncbuf.Buffer
	rc, err := repair.New(agent.CoreV1(), cfg, r, zerolog.New(&logs), m)
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- rc.Run(cctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("repair controller: %v", err)
		}
		if t.Failed() {
			t.Logf("controller logs:\n%s", logs.String())
		}
	})

	want, err := redirect.Build(func() redirect.Spec {
		_, _, spec, err := podinfoFromPod(pod)
		if err != nil {
			t.Fatal(err)
		}
		// A dual-stack pod whose sidecar is not dual-stack: IPv4 capture
		// only, as Istio decides.
		spec.IPv6 = false
		return spec
	}())
	if err != nil {
		t.Fatal(err)
	}
	repairs := func(result string) float64 {
		return testutil.ToFloat64(m.Repairs.WithLabelValues(string(repair.InPlace), result))
	}
	eventually(t, "capture rules in the broken pod's namespace", func() bool {
		return nft.New().Check(ctx, nsPath, want) == nil
	})
	eventually(t, "success counted", func() bool { return repairs("success") == 1 })
	if l := logs.String(); !strings.Contains(l, "repaired the pod's capture in place") || !strings.Contains(l, `"pod":"web-broken"`) || !strings.Contains(l, `"match":"pod cgroup"`) {
		t.Errorf("no repair log line naming the pod:\n%s", l)
	}
	out, err := exec.Command("ip", "netns", "exec", nsName, "nft", "list", "tables").CombinedOutput()
	if err != nil || !strings.Contains(string(out), nft.TableName) {
		t.Errorf("nft list tables in the pod namespace: %v\n%s", err, out)
	}
	if p, err := nft.New().List(ctx, "/run/netns/"+other); err != nil || !p.Empty() {
		t.Errorf("the pod on another node got rules (%v): %v", err, redirect.Describe(p))
	}

	// The validation container crash-loops once more: the pod is still
	// broken in the API, but it was repaired already (its rules only take
	// effect on the next restart), so it is skipped, not re-programmed.
	if out, err := exec.Command("ip", "netns", "exec", nsName, "nft", "delete", "table", "inet", nft.TableName).CombinedOutput(); err != nil {
		t.Fatalf("removing our table to detect a second repair: %v\n%s", err, out)
	}
	p, err := admin.CoreV1().Pods("shop").Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Status = brokenStatus(ips, 2)
	if _, err := admin.CoreV1().Pods("shop").UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "second sighting counted as a skip", func() bool { return repairs("skip") >= 1 })
	if got, err := nft.New().List(ctx, nsPath); err != nil || len(got.Tables) != 0 {
		t.Errorf("pod repaired twice (%v): %v", err, redirect.Describe(got))
	}
	if repairs("success") != 1 || repairs("fail") != 0 {
		t.Errorf("repairs: success %v fail %v, want 1 and 0", repairs("success"), repairs("fail"))
	}

	// The agent's token can do what repair needs and no more.
	if err := agent.CoreV1().Pods("shop").Delete(ctx, pod.Name, metav1.DeleteOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("repairPods RBAC may delete pods: %v", err)
	}
}
