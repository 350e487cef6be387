package podevents

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"

	"github.com/nftmesh/nftmesh/installer/repair"
	"github.com/nftmesh/nftmesh/podinfo/agentsock"
	"github.com/nftmesh/nftmesh/testkit/kubetest"
)

func mkPod(t *testing.T, c kubernetes.Interface, name string) *corev1.Pod {
	t.Helper()
	p, err := c.CoreV1().Pods("shop").Create(context.Background(), &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       corev1.PodSpec{NodeName: "node-1", Containers: []corev1.Container{{Name: "app", Image: "registry.example/app:1"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// eventsFor waits until the pod's events (as kubectl describe finds them:
// by the pod's name and UID) satisfy ok, and returns them.
func eventsFor(t *testing.T, c kubernetes.Interface, p *corev1.Pod, ok func([]corev1.Event) bool) []corev1.Event {
	t.Helper()
	sel := fields.Set{"involvedObject.name": p.Name, "involvedObject.uid": string(p.UID)}.AsSelector().String()
	deadline := time.Now().Add(20 * time.Second)
	for {
		l, err := c.CoreV1().Events(p.Namespace).List(context.Background(), metav1.ListOptions{FieldSelector: sel})
		if err == nil && ok(l.Items) {
			return l.Items
		}
		if time.Now().After(deadline) {
			t.Fatalf("events for %s: %v %+v", p.Name, err, l)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

type fakeRepairer struct{ err error }

func (f fakeRepairer) RepairPod(context.Context, *corev1.Pod) (repair.Report, error) {
	return repair.Report{Backend: "nftables", Rules: 7}, f.err
}

// Through a real API server, as the agent's ServiceAccount with only the
// chart's events rights: a failed ADD, a repair, a failed repair and a
// drift each become an event on the pod (found by its UID, as kubectl
// describe finds them) with the agent on its node as the source; a storm
// of failures for one pod never blocks the caller and is aggregated and
// rate-limited to a bounded count.
func TestEventsOnPods(t *testing.T) {
	s := kubetest.Start(t)
	admin := s.Client()
	s.EnsureNamespace(t, "shop")
	token := s.ServiceAccount(t, "nftmesh-system", "nftmesh-agent")
	s.Grant(t, "nftmesh-system", "nftmesh-agent", true,
		rbacEvents)
	agent := kubernetes.NewForConfigOrDie(s.ConfigFor(token))
	web1, web2, web3 := mkPod(t, admin, "web-1"), mkPod(t, admin, "web-2"), mkPod(t, admin, "web-3")
	cache := map[string]*corev1.Pod{"shop/web-1": web1, "shop/web-2": web2, "shop/web-3": web3}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := New(ctx, agent.CoreV1(), "node-1", func(ns, name string) *corev1.Pod { return cache[ns+"/"+name] })
	defer r.Shutdown()

	r.Decision(agentsock.Decision{Command: "ADD", Decision: "error", Namespace: "shop", Pod: "web-1", RanBy: "agent", Error: "applying capture for pod shop/web-1: operation not permitted"})
	r.Decision(agentsock.Decision{Command: "ADD", Decision: "capture", Namespace: "shop", Pod: "web-2", RanBy: "agent", Error: ""}) // no event
	r.Decision(agentsock.Decision{Command: "CHECK", Decision: "error", Namespace: "shop", Pod: "web-3", RanBy: "standalone", Error: "nat chain ISTIO_OUTPUT: rule 3 missing"})
	if _, err := r.Repairer(fakeRepairer{}).RepairPod(ctx, web2); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Repairer(fakeRepairer{err: errors.New("no netns holds the pod's IPs")}).RepairPod(ctx, web3); err == nil {
		t.Fatal("the wrapper lost the error")
	}
	if _, err := r.Repairer(fakeRepairer{err: repair.ErrNotNeeded}).RepairPod(ctx, web1); !errors.Is(err, repair.ErrNotNeeded) {
		t.Fatal(err)
	}

	check := func(evs []corev1.Event, reason, typ, text string) bool {
		for _, e := range evs {
			if e.Reason == reason && e.Type == typ && strings.Contains(e.Message, text) {
				if e.Source.Component != "nftmesh-agent" || e.Source.Host != "node-1" {
					t.Errorf("event %s source %+v", reason, e.Source)
				}
				return true
			}
		}
		return false
	}
	eventsFor(t, admin, web1, func(evs []corev1.Event) bool {
		return check(evs, ReasonCaptureFailed, corev1.EventTypeWarning, "operation not permitted")
	})
	eventsFor(t, admin, web2, func(evs []corev1.Event) bool {
		return check(evs, ReasonCaptureRepaired, corev1.EventTypeNormal, "nftables backend, 7 rules")
	})
	evs := eventsFor(t, admin, web3, func(evs []corev1.Event) bool {
		return check(evs, ReasonCaptureDrift, corev1.EventTypeWarning, "rule 3 missing") &&
			check(evs, ReasonCaptureRepairFailed, corev1.EventTypeWarning, "no netns holds")
	})
	if len(evs) != 2 {
		t.Errorf("web-3 has %d events, want 2", len(evs))
	}
	// web-1: the ErrNotNeeded repair recorded nothing; the capture-ed
	// web-2 ADD recorded nothing.
	time.Sleep(500 * time.Millisecond)
	if evs := eventsFor(t, admin, web1, func([]corev1.Event) bool { return true }); len(evs) != 1 {
		t.Errorf("web-1 events %d, want 1: %+v", len(evs), evs)
	}
	if evs := eventsFor(t, admin, web2, func([]corev1.Event) bool { return true }); len(evs) != 1 {
		t.Errorf("web-2 events %d, want 1: %+v", len(evs), evs)
	}

	// A storm: 500 failed ADDs for one pod return at once, and the pod
	// ends with a bounded count (the correlator's per-object burst of 25).
	storm := mkPod(t, admin, "storm")
	cache["shop/storm"] = storm
	start := time.Now()
	for range 500 {
		r.Decision(agentsock.Decision{Command: "ADD", Decision: "error", Namespace: "shop", Pod: "storm", RanBy: "standalone", Error: "applying capture: EPERM"})
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("500 events took %v to record: recording blocks", took)
	}
	time.Sleep(2 * time.Second)
	evs = eventsFor(t, admin, storm, func(evs []corev1.Event) bool { return len(evs) > 0 })
	total := int32(0)
	for _, e := range evs {
		total += e.Count
	}
	if total < 1 || total > 30 {
		t.Errorf("storm pod: %d events counting %d, want a rate-limited count (<= 30)", len(evs), total)
	}
	t.Logf("storm: %d event objects, count %d", len(evs), total)

	// A pod the cache does not have is named without a UID.
	r.Decision(agentsock.Decision{Command: "ADD", Decision: "error", Namespace: "shop", Pod: "gone", RanBy: "agent", Error: "x"})
	deadline := time.Now().Add(20 * time.Second)
	for {
		l, err := admin.CoreV1().Events("shop").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=gone"})
		if err == nil && len(l.Items) == 1 && l.Items[0].InvolvedObject.UID == "" && l.Items[0].Reason == ReasonCaptureFailed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no event for an uncached pod: %v %+v", err, l)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// rbacEvents is the chart's events rule (ClusterRole nftmesh-agent-node).
var rbacEvents = rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}}
