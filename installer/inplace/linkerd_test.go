package inplace

import (
	"context"
	"errors"
	"net/netip"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftmesh/nftmesh/installer/metrics"
	"github.com/nftmesh/nftmesh/installer/podcache"
	"github.com/nftmesh/nftmesh/installer/repair"
	"github.com/nftmesh/nftmesh/nft"
	"github.com/nftmesh/nftmesh/podinfo"
	"github.com/nftmesh/nftmesh/podinfo/meshpod"
	"github.com/nftmesh/nftmesh/redirect"
	"github.com/nftmesh/nftmesh/testkit/cgrouptest"
	"github.com/nftmesh/nftmesh/testkit/kubetest"
	"github.com/nftmesh/nftmesh/testkit/syncbuf"
)

// TestRepairControllerInPlaceLinkerd: a Linkerd pod of this node whose
// linkerd-network-validator last exited 95, on a real API server, is
// repaired in place with the rules the plugin would have written there:
// the node's Linkerd settings (here not linkerd2-cni's defaults) and its
// namespace's override annotation, read from the agent's namespace watch.
func TestRepairControllerInPlaceLinkerd(t *testing.T) {
	needRoot(t)
	s := kubetest.Start(t)
	ctx := context.Background()
	admin := s.Client()
	nsAnn := map[string]string{meshpod.AnnotationLinkerdProxyUID: "2200"}
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "emojivoto", Annotations: nsAnn}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	v4, v6 := uniqueAddrs()
	ips := []netip.Addr{v4.Addr(), v6.Addr()}
	nsName := podNetns(t, v4, v6)
	pause := sleeper(t, nsName)

	pod := loadPod(t, "linkerd.yaml")
	pod.UID, pod.Spec.NodeName = "", "node-1"
	pod.Labels = map[string]string{repair.LinkerdPodLabel: "linkerd"}
	pod, err := admin.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod.Status = corev1.PodStatus{Phase: corev1.PodPending, PodIP: ips[0].String()}
	for _, ip := range ips {
		pod.Status.PodIPs = append(pod.Status.PodIPs, corev1.PodIP{IP: ip.String()})
	}
	st := corev1.ContainerStatus{Name: repair.LinkerdValidatorContainer, Image: "registry.example/linkerd/proxy:1", RestartCount: 1}
	st.LastTerminationState.Terminated = &corev1.ContainerStateTerminated{ExitCode: repair.LinkerdValidatorExitCode, Reason: "Error"}
	pod.Status.InitContainerStatuses = []corev1.ContainerStatus{st}
	if pod, err = admin.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	cgrouptest.MovePod(t, pause, cgrouptest.CgroupfsLeaf(string(pod.UID)))

	node := meshpod.DefaultLinkerd()
	node.IncomingProxyPort, node.OutgoingProxyPort = 4243, 4240
	watches := podcache.NewWatches(admin.CoreV1())
	wctx, stopWatches := context.WithCancel(ctx)
	defer stopWatches()
	go watches.Run(wctx)

	cfg := repair.DefaultConfig()
	cfg.Enabled, cfg.RepairPods, cfg.NodeName, cfg.HostProc, cfg.Linkerd = true, true, "node-1", "/proc", true
	r, err := New(Options{ProcDir: cfg.HostProc, Backend: "nftables", ExcludeNamespaces: []string{"kube-system"},
		Linkerd: &node, LinkerdFacts: watches})
	if err != nil {
		t.Fatal(err)
	}
	m := metrics.New()
	var logs syncbuf.Buffer
	rc, err := repair.New(admin.CoreV1(), cfg, r, zerolog.New(&logs), m)
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

	mp := podinfo.Mesh(pod)
	mp.Linkerd, mp.NamespaceAnnotations = &node, nsAnn
	in, reason, spec, err := meshpod.Decide(mp)
	if err != nil || !in || reason != meshpod.ReasonLinkerdInMesh || spec.InboundProxyPort != 4243 {
		t.Fatalf("the plugin's decision: %v %s %+v %v", in, reason, spec, err)
	}
	want, err := redirect.Build(spec)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the plugin's rules in the broken Linkerd pod's namespace", func() bool {
		return nft.New().Check(ctx, "/run/netns/"+nsName, want) == nil
	})
	eventually(t, "success counted", func() bool {
		return testutil.ToFloat64(m.Repairs.WithLabelValues(string(repair.InPlace), "success")) == 1
	})
}

// Without the namespace watch a Linkerd pod that needs its namespace's
// annotations is not repaired with guessed rules: it cannot be repaired.
func TestRepairPodLinkerdNeedsFacts(t *testing.T) {
	r := &Repairer{}
	pod := loadPod(t, "linkerd.yaml")
	m := podinfo.Mesh(pod)
	err := r.withLinkerd(m)
	if err == nil || !errors.Is(err, repair.ErrImpossible) {
		t.Fatalf("withLinkerd without facts: %v, want ErrImpossible", err)
	}
}
