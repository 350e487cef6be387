package repair

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/nftmesh/nftmesh/installer/metrics"
)

func TestBrokenPodDetection(t *testing.T) {
	rc := testConfig(Label, "n")
	term := func(code int32, reason, msg string) *corev1.ContainerStateTerminated {
		return &corev1.ContainerStateTerminated{ExitCode: code, Reason: reason, Message: msg}
	}
	pod := func(annotated bool, name string, cur, last *corev1.ContainerStateTerminated) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p"}}
		if annotated {
			p.Annotations = map[string]string{"sidecar.istio.io/status": "{}"}
		}
		st := corev1.ContainerStatus{Name: name}
		st.State.Terminated = cur
		st.LastTerminationState.Terminated = last
		p.Status.InitContainerStatuses = []corev1.ContainerStatus{st}
		return p
	}
	cases := []struct {
		name string
		pod  *corev1.Pod
		cfg  func(Config) Config
		want bool
	}{
		{"last exit 126", pod(true, "istio-validation", nil, term(126, "Error", "")), nil, true},
		{"no sidecar annotation", pod(false, "istio-validation", nil, term(126, "Error", "")), nil, false},
		{"other init container", pod(true, "init", nil, term(126, "Error", "")), nil, false},
		{"other exit code", pod(true, "istio-validation", nil, term(1, "Error", "")), nil, false},
		{"passed since", pod(true, "istio-validation", term(0, "Completed", ""), term(126, "Error", "")), nil, false},
		{"never terminated", pod(true, "istio-validation", nil, nil), nil, false},
		{"any exit code", pod(true, "istio-validation", nil, term(3, "Error", "")), func(c Config) Config { c.InitContainerExitCode = 0; return c }, true},
		{"message filter matches", pod(true, "istio-validation", nil, term(126, "Error", "iptables validation failed")), func(c Config) Config {
			c.InitContainerTerminationMessage = "validation failed"
			return c
		}, true},
		{"message filter misses", pod(true, "istio-validation", nil, term(126, "Error", "other")), func(c Config) Config {
			c.InitContainerTerminationMessage = "validation failed"
			return c
		}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := rc
			if c.cfg != nil {
				cfg = c.cfg(cfg)
			}
			if got := Broken(c.pod, cfg); got != c.want {
				t.Errorf("Broken = %v, want %v", got, c.want)
			}
		})
	}
}

func TestNewRepairControllerRefusesInPlaceWithoutRepairer(t *testing.T) {
	if _, err := New(nil, testConfig(InPlace, "n"), nil, testLogger(), nil); err != ErrNoInPlaceRepair {
		t.Errorf("err = %v, want ErrNoInPlaceRepair", err)
	}
}

func testLogger() zerolog.Logger { return zerolog.New(io.Discard) }

// testConfig is the agent's default repair configuration (Istio's) with
// mode enabled on node.
func testConfig(mode Mode, node string) Config {
	c := DefaultConfig()
	c.Enabled, c.NodeName = true, node
	switch mode {
	case InPlace:
		c.RepairPods = true
	case Delete:
		c.DeletePods = true
	case Label:
		c.LabelPods = true
	}
	return c
}

// fakeRepairer records calls and answers per pod name.
type fakeRepairer struct {
	mu    sync.Mutex
	calls map[string]int
	errs  map[string]error
}

func (f *fakeRepairer) RepairPod(_ context.Context, pod *corev1.Pod) (Report, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls[pod.Name]++
	return Report{Netns: "/proc/1/ns/net", PID: 1, Backend: "test"}, f.errs[pod.Name]
}

func (f *fakeRepairer) count(name string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[name]
}

// The in-place path of the controller (against client-go's fake
// clientset; the real API server and kernel version is in
// installer/inplace): a repaired pod is not repaired twice, a pod that
// needs no capture is a skip and one that cannot be repaired a failure,
// neither retried; a retryable error is retried; a deleted pod is
// forgotten.
func TestRepairControllerInPlaceBookkeeping(t *testing.T) {
	cfg := testConfig(InPlace, "n1")
	broken := func(name string) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "shop", UID: types.UID("uid-" + name),
			Annotations: map[string]string{"sidecar.istio.io/status": "{}"}}, Spec: corev1.PodSpec{NodeName: "n1"}}
		st := corev1.ContainerStatus{Name: "istio-validation"}
		st.LastTerminationState.Terminated = &corev1.ContainerStateTerminated{ExitCode: 126}
		p.Status.InitContainerStatuses = []corev1.ContainerStatus{st}
		return p
	}
	client := fake.NewSimpleClientset()
	fr := &fakeRepairer{calls: map[string]int{}, errs: map[string]error{
		"not-needed": fmt.Errorf("%w: no istio-proxy container", ErrNotNeeded),
		"impossible": fmt.Errorf("%w: bad annotation", ErrImpossible),
		"flaky":      errors.New("no network namespace holds the pod's IPs yet"),
	}}
	m := metrics.New()
	c, err := New(client.CoreV1(), cfg, fr, testLogger(), m)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	wait := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out: %s", what)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	counter := func(result string) float64 {
		return testutil.ToFloat64(m.Repairs.WithLabelValues(string(InPlace), result))
	}
	pods := client.CoreV1().Pods("shop")
	for _, n := range []string{"ok", "not-needed", "impossible", "flaky"} {
		if _, err := pods.Create(ctx, broken(n), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	wait("every pod handled", func() bool {
		return fr.count("ok") == 1 && fr.count("not-needed") == 1 && fr.count("impossible") == 1 && fr.count("flaky") >= 2
	})
	// Another status update of the repaired pod: skipped, not repaired again.
	p := broken("ok")
	p.Status.InitContainerStatuses[0].RestartCount = 3
	if _, err := pods.UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	wait("second sighting skipped", func() bool { return counter("skip") >= 2 })
	if fr.count("ok") != 1 || fr.count("not-needed") != 1 || fr.count("impossible") != 1 {
		t.Errorf("calls %v: a pod was repaired twice or a no-retry error retried", fr.calls)
	}
	if counter("success") != 1 || counter("fail") < 2 {
		t.Errorf("success %v fail %v", counter("success"), counter("fail"))
	}
	if err := pods.Delete(ctx, "ok", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	wait("deleted pod forgotten", func() bool {
		_, done := c.strategy.(*inPlace).repaired.Load(types.UID("uid-ok"))
		return !done
	})
}
