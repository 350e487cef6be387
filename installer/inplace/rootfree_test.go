package inplace

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/nftmesh/nftmesh/capture"
	"github.com/nftmesh/nftmesh/installer/metrics"
	"github.com/nftmesh/nftmesh/installer/repair"
	"github.com/nftmesh/nftmesh/podinfo"
	"github.com/nftmesh/nftmesh/podinfo/meshpod"
	"github.com/nftmesh/nftmesh/redirect"
	"github.com/nftmesh/nftmesh/testkit/capturetest"
	"github.com/nftmesh/nftmesh/testkit/nonroot"
	"github.com/nftmesh/nftmesh/testkit/syncbuf"
)

// The tests named TestRootFree* drive the repair controller's in-place
// strategy through this package's Repairer over capturetest's in-memory
// kernel and client-go's fake clientset: no root, no namespaces, no API
// server. This test runs them again as nobody to prove it.
func TestUnprivileged(t *testing.T) { nonroot.Rerun(t, "^TestRootFree") }

// fakeNode is a node's pods in the in-memory kernel: one namespace per pod,
// found by the pod's IPs as FindNetns finds them in /proc.
type fakeNode struct {
	k    *capturetest.Fake
	byIP map[netip.Addr]string
}

func newFakeNode() *fakeNode {
	return &fakeNode{k: capturetest.New(), byIP: map[netip.Addr]string{}}
}

// addPod creates the namespace of a pod holding ips.
func (n *fakeNode) addPod(name string, ips ...netip.Addr) string {
	path := "/fake/netns/" + name
	n.k.AddNetns(path, ips...)
	for _, ip := range ips {
		n.byIP[ip] = path
	}
	return path
}

func (n *fakeNode) find(_ string, ips []netip.Addr) (Netns, error) {
	for _, ip := range ips {
		path, ok := n.byIP[ip]
		if !ok {
			continue
		}
		ns, err := n.k.Pipeline().OpenForReading(path)
		if err != nil {
			return Netns{}, err
		}
		defer ns.Close()
		return Netns{Path: path, PID: 4242, Dev: ns.ID.Dev, Inode: ns.ID.Ino, Candidates: 1, Match: MatchAddress}, nil
	}
	return Netns{}, ErrNotFound
}

func (n *fakeNode) repairer(t *testing.T, backend string) *Repairer {
	t.Helper()
	r, err := New(Options{ProcDir: "/proc", Backend: backend, ExcludeNamespaces: []string{"kube-system"}, PodNamespace: "nftmesh-system",
		RunDir: t.TempDir(), Pipeline: n.k.Pipeline(), Find: n.find})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// brokenPod is the pod in file, on node n1, whose validation container last
// exited 126; healthy pods' validation passed since.
func brokenPod(t *testing.T, file, name string, healthy bool, ips ...netip.Addr) *corev1.Pod {
	t.Helper()
	p := loadPod(t, file)
	p.Name, p.Namespace, p.UID, p.ResourceVersion = name, "shop", types.UID("uid-"+name), "1"
	p.Spec.NodeName = "n1"
	p.Status = brokenStatus(ips, 1)
	if healthy {
		p.Status.InitContainerStatuses[0].State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed"}}
	}
	return p
}

type lockedLog struct{ syncbuf.Buffer }

// runInPlace runs the repair controller in place over client and node
// until the test ends.
func runInPlace(t *testing.T, client *fake.Clientset, node *fakeNode, backend string) (*metrics.Metrics, *lockedLog) {
	t.Helper()
	cfg := repair.DefaultConfig()
	cfg.Enabled, cfg.RepairPods, cfg.NodeName = true, true, "n1"
	m := metrics.New()
	var log lockedLog
	c, err := repair.New(client.CoreV1(), cfg, node.repairer(t, backend), zerolog.New(&log), m)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return m, &log
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// expectedDump is what the plugin would have installed for pod in a
// namespace holding addrs, as the in-memory kernel dumps it.
func expectedDump(t *testing.T, pod *corev1.Pod, addrs ...netip.Addr) string {
	t.Helper()
	inMesh, _, spec, err := podinfo.FromPod(pod)
	if err != nil || !inMesh {
		t.Fatalf("pod %s: in mesh %v, %v", pod.Name, inMesh, err)
	}
	spec.IPv6 = meshpod.IPv6Capture(addrs, spec.DualStack)
	plan, err := redirect.Build(spec)
	if err != nil {
		t.Fatal(err)
	}
	k := capturetest.New()
	k.AddNetns("/want", addrs...)
	k.Install("/want", capture.NFTables, plan)
	return k.Dump("/want")
}

// A broken mesh pod gets in place exactly the rules the plugin would have
// given it, through the backend auto selects, and success is counted; a
// broken pod outside the mesh (no sidecar; interception NONE) is a skip
// with its namespace untouched; a mesh pod whose validation passed is not
// looked at.
func TestRootFreeRepairInPlace(t *testing.T) {
	node := newFakeNode()
	web4, web6 := netip.MustParseAddr("192.0.2.10"), netip.MustParseAddr("2001:db8::10")
	plain4 := netip.MustParseAddr("192.0.2.11")
	none4 := netip.MustParseAddr("192.0.2.12")
	ok4 := netip.MustParseAddr("192.0.2.13")
	webNS := node.addPod("web", web4, web6)
	plainNS := node.addPod("plain", plain4)
	noneNS := node.addPod("none", none4)
	okNS := node.addPod("ok", ok4)

	web := brokenPod(t, "injected.yaml", "web", false, web4, web6)
	plain := brokenPod(t, "no-sidecar.yaml", "plain", false, plain4)
	plain.Annotations = map[string]string{"sidecar.istio.io/status": "{}"} // looks broken to the controller
	none := brokenPod(t, "interception-none.yaml", "none", false, none4)
	ok := brokenPod(t, "injected.yaml", "ok", true, ok4)
	client := fake.NewSimpleClientset(web, plain, none, ok)

	m, log := runInPlace(t, client, node, capture.Auto)
	count := func(result string) float64 {
		return testutil.ToFloat64(m.Repairs.WithLabelValues(string(repair.InPlace), result))
	}
	waitFor(t, "every broken pod handled", func() bool { return count("success") == 1 && count("skip") == 2 })

	if got, want := node.k.Dump(webNS), expectedDump(t, web, web4, web6); got != want {
		t.Errorf("web's namespace holds\n%s\nwant\n%s", got, want)
	}
	if got := node.k.Backends(webNS); !slices.Equal(got, []string{capture.NFTables}) {
		t.Errorf("web's rules are in %v, want nftables only", got)
	}
	for name, ns := range map[string]string{"plain": plainNS, "none": noneNS, "ok": okNS} {
		if d := node.k.Dump(ns); d != "" {
			t.Errorf("%s's namespace was programmed:\n%s", name, d)
		}
	}
	for _, c := range node.k.Calls() {
		if strings.HasPrefix(c, capturetest.OpApply) && !strings.HasSuffix(c, webNS) {
			t.Errorf("call %q: only web's namespace may be written", c)
		}
	}
	if count("fail") != 0 || testutil.ToFloat64(m.IstioRepairs.WithLabelValues("repair", "success")) != 1 {
		t.Errorf("fail %v, istio success %v", count("fail"), testutil.ToFloat64(m.IstioRepairs.WithLabelValues("repair", "success")))
	}
	for _, want := range []string{
		`"pod":"web"`, `"netns":"` + webNS + `"`, `"backend":"nftables"`, "repaired the pod's capture in place",
		`"pod":"plain"`, "broken pod needs no capture; not repairing it",
	} {
		if !strings.Contains(log.String(), want) {
			t.Errorf("agent log lacks %s:\n%s", want, log.String())
		}
	}
	if strings.Contains(log.String(), `"pod":"ok"`) {
		t.Errorf("the healthy pod was handled:\n%s", log.String())
	}

	// Another sighting of the repaired pod (its validation restarts) does
	// not program it again.
	applies := len(node.k.Calls())
	web.Status.InitContainerStatuses[0].RestartCount = 2
	if _, err := client.CoreV1().Pods("shop").UpdateStatus(context.Background(), web, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "second sighting skipped", func() bool { return count("skip") == 3 })
	if n := len(node.k.Calls()); n != applies {
		t.Errorf("the repaired pod was programmed again: %v", node.k.Calls()[applies:])
	}
}

// A kernel that refuses the write: the failure is counted on every
// attempt, retried a bounded number of times, and the half-written rules
// are removed each time; a pod the configured backend can never program
// (user-namespaced with iptables-legacy) fails once, not retried.
func TestRootFreeRepairInPlaceFailures(t *testing.T) {
	t.Run("apply fails", func(t *testing.T) {
		node := newFakeNode()
		ip := netip.MustParseAddr("192.0.2.20")
		ns := node.addPod("web", ip)
		node.k.FailApply("", errors.New("netlink receive: device or resource busy"), true)
		client := fake.NewSimpleClientset(brokenPod(t, "injected.yaml", "web", false, ip))
		m, log := runInPlace(t, client, node, capture.Auto)
		waitFor(t, "giving up", func() bool { return strings.Contains(log.String(), "repairing pod; giving up") })
		if got := testutil.ToFloat64(m.Repairs.WithLabelValues("repair", "fail")); got != 5 {
			t.Errorf("fail counted %v times, want 5 (every attempt)", got)
		}
		if !strings.Contains(log.String(), "repairing pod; will retry") || !strings.Contains(log.String(), "device or resource busy") {
			t.Errorf("agent log:\n%s", log.String())
		}
		if d := node.k.Dump(ns); d != "" {
			t.Errorf("a failed repair left rules behind:\n%s", d)
		}
		if testutil.ToFloat64(m.Repairs.WithLabelValues("repair", "success")) != 0 {
			t.Error("success counted")
		}
	})
	t.Run("user-namespaced with iptables-legacy", func(t *testing.T) {
		node := newFakeNode()
		ip := netip.MustParseAddr("192.0.2.21")
		ns := node.addPod("web", ip)
		node.k.SetForeign(ns, capturetest.Foreign{UserNamespaced: true})
		client := fake.NewSimpleClientset(brokenPod(t, "injected.yaml", "web", false, ip))
		m, log := runInPlace(t, client, node, capture.Legacy)
		waitFor(t, "failure counted", func() bool { return testutil.ToFloat64(m.Repairs.WithLabelValues("repair", "fail")) == 1 })
		time.Sleep(200 * time.Millisecond) // a retry would come within the rate limiter's first steps
		if got := testutil.ToFloat64(m.Repairs.WithLabelValues("repair", "fail")); got != 1 {
			t.Errorf("fail counted %v times, want 1 (not retried)", got)
		}
		if !strings.Contains(log.String(), "it needs to be fixed and recreated") || strings.Contains(log.String(), "will retry") {
			t.Errorf("agent log:\n%s", log.String())
		}
		if d := node.k.Dump(ns); d != "" {
			t.Errorf("rules written:\n%s", d)
		}
	})
}
