package repair

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/nftmesh/nftmesh/installer/metrics"
	"github.com/nftmesh/nftmesh/testkit/nonroot"
)

// The tests named TestRootFree* need no privileges: client-go's fake
// clientset stands in for the API server, and repair in place's kernel is
// capturetest's (installer/inplace). This test runs them again as nobody.
func TestUnprivileged(t *testing.T) { nonroot.Rerun(t, "^TestRootFree") }

// meshPod is a pod on node whose validation container exited 126: broken
// when annotated with the sidecar status (what the injector writes).
func meshPod(name, node string, annotated bool) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "shop", UID: types.UID("uid-" + name), ResourceVersion: "1"},
		Spec: corev1.PodSpec{NodeName: node}}
	if annotated {
		p.Annotations = map[string]string{"sidecar.istio.io/status": "{}"}
	}
	st := corev1.ContainerStatus{Name: "istio-validation"}
	st.LastTerminationState.Terminated = &corev1.ContainerStateTerminated{ExitCode: 126}
	p.Status.InitContainerStatuses = []corev1.ContainerStatus{st}
	return p
}

// healthyPod is annotated but its validation passed since.
func healthyPod(name, node string) *corev1.Pod {
	p := meshPod(name, node, true)
	p.Status.InitContainerStatuses[0].State.Terminated = &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed"}
	return p
}

// startController runs a controller with strategy s over client until the
// test ends; its log goes to log.
func startController(t *testing.T, client *fake.Clientset, cfg Config, s Strategy, m *metrics.Metrics, log *lockedBuf) *Controller {
	t.Helper()
	c, err := NewController(client.CoreV1(), cfg, s, zerolog.New(log), m)
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
	return c
}

// writes lists the pods the clientset was asked to delete or patch.
func writes(client *fake.Clientset) []string {
	var out []string
	for _, a := range client.Actions() {
		switch a := a.(type) {
		case k8stesting.DeleteAction:
			if a.GetResource().Resource == "pods" {
				out = append(out, "delete "+a.GetName())
			}
		case k8stesting.PatchAction:
			out = append(out, "patch "+a.GetName()+"/"+a.GetSubresource())
		}
	}
	return out
}

// Delete and label mode: the broken mesh pod is deleted (with UID and
// resource version preconditions) or labelled through pods/status, an event
// names why, success is counted under both metric names; a pod without the
// sidecar annotation and a healthy mesh pod get nothing. (The fake clientset
// ignores field selectors: that only this node's pods are watched is
// proven against the real API server in charts.)
func TestRootFreeDeleteAndLabelStrategies(t *testing.T) {
	for _, mode := range []Mode{Delete, Label} {
		t.Run(string(mode), func(t *testing.T) {
			client := fake.NewSimpleClientset(meshPod("web", "n1", true), meshPod("plain", "n1", false),
				healthyPod("healthy", "n1"))
			cfg := testConfig(mode, "n1")
			s, err := NewStrategy(cfg, client.CoreV1(), nil)
			if err != nil {
				t.Fatal(err)
			}
			if s.Mode() != mode {
				t.Fatalf("strategy for %s is %s", mode, s.Mode())
			}
			m := metrics.New()
			var log lockedBuf
			startController(t, client, cfg, s, m, &log)
			eventually(t, "web handled", 10*time.Second, func() bool {
				return testutil.ToFloat64(m.Repairs.WithLabelValues(string(mode), "success")) == 1
			})
			if got := testutil.ToFloat64(m.IstioRepairs.WithLabelValues(string(mode), "success")); got != 1 {
				t.Errorf("istio_cni_repair_pods_repaired_total{type=%s,result=success} = %v", mode, got)
			}
			web, err := client.CoreV1().Pods("shop").Get(context.Background(), "web", metav1.GetOptions{})
			switch mode {
			case Delete:
				if !apierrors.IsNotFound(err) {
					t.Errorf("web not deleted: %v", err)
				}
				if !log.has("deleted a pod that started without capture") {
					t.Errorf("no deletion line:\n%s", log.String())
				}
			case Label:
				if err != nil || web.Labels["cni.istio.io/uninitialized"] != "true" {
					t.Errorf("web not labelled: %v %v", err, web)
				}
				if !log.has("labelled a pod that started without capture") {
					t.Errorf("no label line:\n%s", log.String())
				}
			}
			want := map[Mode]string{Delete: "delete web", Label: "patch web/status"}[mode]
			if got := writes(client); len(got) != 1 || got[0] != want {
				t.Errorf("writes %v, want only %q", got, want)
			}
			evs, err := client.CoreV1().Events("shop").List(context.Background(), metav1.ListOptions{})
			if err != nil || len(evs.Items) != 1 || evs.Items[0].InvolvedObject.Name != "web" || evs.Items[0].Source.Host != "n1" {
				t.Errorf("events %v %+v", err, evs)
			}
			for _, n := range []string{"plain", "healthy"} {
				p, err := client.CoreV1().Pods("shop").Get(context.Background(), n, metav1.GetOptions{})
				if err != nil || len(p.Labels) != 0 {
					t.Errorf("pod %s touched: %v %v", n, err, p)
				}
			}
		})
	}
}

// A write the API refuses is a failure, counted and retried a bounded
// number of times; a pod already gone or changed is a skip, not retried.
func TestRootFreeStrategyFailuresCounted(t *testing.T) {
	for _, tc := range []struct {
		mode       Mode
		verb       string
		err        error
		result     string
		minCalls   int
		retryNoted bool
	}{
		{Delete, "delete", apierrors.NewInternalError(errors.New("etcd is down")), "fail", maxRepairAttempts, true},
		{Label, "patch", apierrors.NewServiceUnavailable("try later"), "fail", maxRepairAttempts, true},
		{Delete, "delete", apierrors.NewConflict(schema.GroupResource{Resource: "pods"}, "web", errors.New("resource version")), "skip", 1, false},
		{Label, "patch", apierrors.NewNotFound(schema.GroupResource{Resource: "pods"}, "web"), "skip", 1, false},
	} {
		t.Run(fmt.Sprintf("%s %s", tc.mode, tc.result), func(t *testing.T) {
			client := fake.NewSimpleClientset(meshPod("web", "n1", true))
			calls := make(chan struct{}, 100)
			client.PrependReactor(tc.verb, "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
				calls <- struct{}{}
				return true, nil, tc.err
			})
			cfg := testConfig(tc.mode, "n1")
			m := metrics.New()
			var log lockedBuf
			c, err := New(client.CoreV1(), cfg, nil, zerolog.New(&log), m)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- c.Run(ctx) }()
			defer func() {
				cancel()
				<-done
			}()
			counter := func() float64 { return testutil.ToFloat64(m.Repairs.WithLabelValues(string(tc.mode), tc.result)) }
			eventually(t, "attempts counted", 20*time.Second, func() bool { return counter() >= float64(tc.minCalls) })
			if tc.retryNoted {
				eventually(t, "giving up logged", 10*time.Second, func() bool { return log.has("repairing pod; giving up") })
				if !log.has("repairing pod; will retry") {
					t.Errorf("no retry line:\n%s", log.String())
				}
			}
			time.Sleep(100 * time.Millisecond) // any further attempt would come within the rate limiter's first steps
			if got := len(calls); got != tc.minCalls {
				t.Errorf("%d %s calls, want %d", got, tc.verb, tc.minCalls)
			}
			if got := counter(); got != float64(tc.minCalls) {
				t.Errorf("%s counted %v times, want %d", tc.result, got, tc.minCalls)
			}
			evs, err := client.CoreV1().Events("shop").List(context.Background(), metav1.ListOptions{})
			if err != nil || len(evs.Items) != 0 || testutil.ToFloat64(m.Repairs.WithLabelValues(string(tc.mode), "success")) != 0 {
				t.Errorf("counted or recorded a success: %v %+v\n%s", err, evs, log.String())
			}
		})
	}
}
