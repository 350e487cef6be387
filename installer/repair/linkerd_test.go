package repair

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/nftmesh/nftmesh/installer/metrics"
	"github.com/nftmesh/nftmesh/testkit/kubetest"
)

// linkerdStatus is what the kubelet reports for a Linkerd pod whose
// validator ran: last exited code, crash-looping (or, passed, completed).
func linkerdStatus(code int32, passedSince bool) corev1.PodStatus {
	st := corev1.ContainerStatus{Name: LinkerdValidatorContainer, Image: "registry.example/linkerd/proxy:1", RestartCount: 1}
	st.LastTerminationState.Terminated = &corev1.ContainerStateTerminated{ExitCode: code, Reason: "Error"}
	st.State.Waiting = &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}
	if passedSince {
		st.State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed"}}
	}
	return corev1.PodStatus{Phase: corev1.PodPending, InitContainerStatuses: []corev1.ContainerStatus{st}}
}

func TestLinkerdBrokenPodDetection(t *testing.T) {
	pod := func(labelled bool, container string, code int32, passed bool) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p"}}
		if labelled {
			p.Labels = map[string]string{LinkerdPodLabel: "linkerd"}
		}
		p.Status = linkerdStatus(code, passed)
		p.Status.InitContainerStatuses[0].Name = container
		return p
	}
	on := testConfig(Delete, "n")
	on.Linkerd = true
	cases := []struct {
		name string
		pod  *corev1.Pod
		cfg  Config
		want bool
	}{
		{"validator exited 95", pod(true, LinkerdValidatorContainer, 95, false), on, true},
		{"without Linkerd support", pod(true, LinkerdValidatorContainer, 95, false), testConfig(Delete, "n"), false},
		{"no Linkerd label", pod(false, LinkerdValidatorContainer, 95, false), on, false},
		{"other exit code", pod(true, LinkerdValidatorContainer, 1, false), on, false},
		{"other init container", pod(true, "linkerd-init", 95, false), on, false},
		{"passed since", pod(true, LinkerdValidatorContainer, 95, true), on, false},
		// Istio's exit code setting does not apply to Linkerd's validator.
		{"Istio's any-code setting", pod(true, LinkerdValidatorContainer, 126, false), func() Config { c := on; c.InitContainerExitCode = 0; return c }(), false},
		// An Istio broken pod is still broken with Linkerd support on.
		{"Istio pod", meshPod("web", "n", true), on, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := Broken(c.pod, c.cfg); got != c.want {
				t.Errorf("Broken = %v, want %v", got, c.want)
			}
		})
	}
}

// createLinkerdPod creates, on a real API server, a Linkerd-injected pod
// (testdata/pods/linkerd.yaml, with the data plane label Linkerd's
// injector writes when labelled) on node with status st.
func createLinkerdPod(t *testing.T, c kubernetes.Interface, name, node string, labelled bool, st corev1.PodStatus) *corev1.Pod {
	t.Helper()
	ctx := context.Background()
	p, err := kubetest.ReadPodFile(filepath.Join("..", "..", "testdata", "pods", "linkerd.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	p.Name, p.Spec.NodeName = name, node
	if labelled {
		p.Labels = map[string]string{LinkerdPodLabel: "linkerd", "linkerd.io/workload-ns": p.Namespace}
	}
	if p, err = c.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	p.Status = st
	if p, err = c.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestRepairControllerLinkerdPods, against a real kube-apiserver, in each
// mode: with Linkerd support on, a Linkerd pod of this node whose
// linkerd-network-validator last exited 95 is deleted, labelled, or handed
// to repair in place; the same pod on another node, one whose validator
// exited otherwise or passed since, one without Linkerd's label, are not;
// an Istio broken pod is still handled beside it. Without Linkerd support
// the broken Linkerd pod is left alone.
func TestRepairControllerLinkerdPods(t *testing.T) {
	api := kubetest.Start(t)
	admin := api.Client()
	api.EnsureNamespace(t, "emojivoto")
	api.EnsureNamespace(t, "shop")
	for _, mode := range []Mode{InPlace, Delete, Label} {
		for _, linkerd := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s linkerd=%v", mode, linkerd), func(t *testing.T) {
				// Each run has its own node: the pods of earlier runs stay.
				prefix := fmt.Sprintf("%s-%v-", mode, linkerd)
				node := prefix + "node"
				broken := createLinkerdPod(t, admin, prefix+"broken", node, true, linkerdStatus(95, false))
				quiet := []*corev1.Pod{
					createLinkerdPod(t, admin, prefix+"other-node", "elsewhere", true, linkerdStatus(95, false)),
					createLinkerdPod(t, admin, prefix+"other-code", node, true, linkerdStatus(1, false)),
					createLinkerdPod(t, admin, prefix+"passed", node, true, linkerdStatus(95, true)),
					createLinkerdPod(t, admin, prefix+"unlabelled", node, false, linkerdStatus(95, false)),
				}
				istio := meshPod(prefix+"istio", node, true)
				istio.Namespace, istio.UID, istio.ResourceVersion = "shop", "", ""
				istio.Spec.Containers = []corev1.Container{{Name: "app", Image: "app"}}
				created, err := admin.CoreV1().Pods("shop").Create(context.Background(), istio, metav1.CreateOptions{})
				if err != nil {
					t.Fatal(err)
				}
				created.Status = istio.Status
				if _, err := admin.CoreV1().Pods("shop").UpdateStatus(context.Background(), created, metav1.UpdateOptions{}); err != nil {
					t.Fatal(err)
				}

				cfg := testConfig(mode, node)
				cfg.Linkerd = linkerd
				fr := &fakeRepairer{calls: map[string]int{}, errs: map[string]error{}}
				m := metrics.New()
				var log lockedBuf
				c, err := New(admin.CoreV1(), cfg, fr, zerolog.New(&log), m)
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
				want := 1.0
				if linkerd {
					want = 2
				}
				eventually(t, "the broken pods handled", 20*time.Second, func() bool {
					return testutil.ToFloat64(m.Repairs.WithLabelValues(string(mode), "success")) >= want
				})
				time.Sleep(500 * time.Millisecond) // anything else handled would be by now
				if got := testutil.ToFloat64(m.Repairs.WithLabelValues(string(mode), "success")); got != want {
					t.Errorf("%v pods handled, want %v:\n%s", got, want, log.String())
				}
				checkLinkerdHandled(t, admin, mode, broken, linkerd, fr)
				for _, p := range quiet {
					checkLinkerdHandled(t, admin, mode, p, false, fr)
				}
			})
		}
	}
}

// checkLinkerdHandled checks that mode did (handled) or did not do its
// work on pod.
func checkLinkerdHandled(t *testing.T, c kubernetes.Interface, mode Mode, pod *corev1.Pod, handled bool, fr *fakeRepairer) {
	t.Helper()
	got, err := c.CoreV1().Pods(pod.Namespace).Get(context.Background(), pod.Name, metav1.GetOptions{})
	var did bool
	switch mode {
	case InPlace:
		did = fr.count(pod.Name) > 0
	case Delete:
		// A pod bound to a node is deleted gracefully: with no kubelet
		// to confirm, it stays, marked.
		did = apierrors.IsNotFound(err) || (err == nil && got.DeletionTimestamp != nil)
		err = nil
	case Label:
		did = err == nil && got.Labels["cni.istio.io/uninitialized"] == "true"
	}
	if err != nil {
		t.Fatal(err)
	}
	if did != handled {
		t.Errorf("%s: pod %s handled = %v, want %v", mode, pod.Name, did, handled)
	}
}
