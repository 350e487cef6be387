package nodetaint

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"

	"github.com/nftmesh/nftmesh/testkit/kubetest"
)

func newNode(t *testing.T, c kubernetes.Interface, name string, taints ...corev1.Taint) {
	t.Helper()
	_, err := c.CoreV1().Nodes().Create(context.Background(), &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       corev1.NodeSpec{Taints: taints},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
}

func taintsOf(t *testing.T, c kubernetes.Interface, name string) []string {
	t.Helper()
	n, err := c.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, x := range n.Spec.Taints {
		// The API server's TaintNodesByCondition admission puts the node
		// lifecycle's node.kubernetes.io/not-ready on a new node: not ours.
		if strings.HasPrefix(x.Key, "node.kubernetes.io/") {
			continue
		}
		out = append(out, x.Key+":"+string(x.Effect))
	}
	return out
}

var (
	oursNoSchedule = corev1.Taint{Key: DefaultKey, Value: "true", Effect: corev1.TaintEffectNoSchedule}
	oursNoExecute  = corev1.Taint{Key: DefaultKey, Effect: corev1.TaintEffectNoExecute}
	maintenance    = corev1.Taint{Key: "example.com/maintenance", Value: "yes", Effect: corev1.TaintEffectNoSchedule}
	gpu            = corev1.Taint{Key: "example.com/gpu", Effect: corev1.TaintEffectPreferNoSchedule}
)

// A node born with our taint (two effects) and others: the agent's removal
// takes off every effect of our key and nothing else; a node without it is
// left alone; a node with only ours ends with no taints.
func TestRemoveOnlyOurs(t *testing.T) {
	s := kubetest.Start(t)
	c := s.Client()
	ctx := context.Background()
	newNode(t, c, "node-1", maintenance, oursNoSchedule, gpu, oursNoExecute)
	newNode(t, c, "node-2", maintenance)
	newNode(t, c, "node-3", oursNoSchedule)

	u := &Untainter{Client: c.CoreV1(), Node: "node-1", Key: DefaultKey}
	n, err := u.Remove(ctx)
	if err != nil || n != 2 {
		t.Fatalf("Remove = %d, %v; want 2 removed", n, err)
	}
	if got, want := taintsOf(t, c, "node-1"), []string{"example.com/maintenance:NoSchedule", "example.com/gpu:PreferNoSchedule"}; !slices.Equal(got, want) {
		t.Errorf("node-1 taints %v, want %v", got, want)
	}
	// Again: nothing left to do.
	if n, err := u.Remove(ctx); err != nil || n != 0 {
		t.Errorf("second Remove = %d, %v; want 0, nil", n, err)
	}
	if n, err := (&Untainter{Client: c.CoreV1(), Node: "node-2", Key: DefaultKey}).Remove(ctx); err != nil || n != 0 {
		t.Errorf("Remove on a node without the taint = %d, %v", n, err)
	}
	if got := taintsOf(t, c, "node-2"); !slices.Equal(got, []string{"example.com/maintenance:NoSchedule"}) {
		t.Errorf("node-2 taints %v", got)
	}
	if n, err := (&Untainter{Client: c.CoreV1(), Node: "node-3", Key: DefaultKey}).Remove(ctx); err != nil || n != 1 {
		t.Errorf("Remove on a node with only ours = %d, %v", n, err)
	}
	if got := taintsOf(t, c, "node-3"); len(got) != 0 {
		t.Errorf("node-3 taints %v, want none", got)
	}
	// A custom key (Istio 1.31's configurable name) leaves the default one.
	newNode(t, c, "node-4", oursNoSchedule, corev1.Taint{Key: "example.com/cni-not-ready", Effect: corev1.TaintEffectNoSchedule})
	if n, err := (&Untainter{Client: c.CoreV1(), Node: "node-4", Key: "example.com/cni-not-ready"}).Remove(ctx); err != nil || n != 1 {
		t.Errorf("Remove with a custom key = %d, %v", n, err)
	}
	if got := taintsOf(t, c, "node-4"); !slices.Equal(got, []string{DefaultKey + ":NoSchedule"}) {
		t.Errorf("node-4 taints %v", got)
	}
}

// Another controller adds a taint between the agent's read and its patch:
// the patch's test of the taints fails, the agent reads again, and the
// other controller's taint survives.
func TestRemoveKeepsConcurrentEdit(t *testing.T) {
	s := kubetest.Start(t)
	c := s.Client()
	ctx := context.Background()
	newNode(t, c, "node-1", oursNoSchedule, maintenance)
	races := 0
	u := &Untainter{Client: racingClient{c.CoreV1(), func() {
		races++
		if races > 1 {
			return
		}
		n, err := c.CoreV1().Nodes().Get(ctx, "node-1", metav1.GetOptions{})
		if err != nil {
			t.Error(err)
			return
		}
		n.Spec.Taints = append(n.Spec.Taints, gpu)
		if _, err := c.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Error(err)
		}
	}}, Node: "node-1", Key: DefaultKey}
	if n, err := u.Remove(ctx); err != nil || n != 1 {
		t.Fatalf("Remove = %d, %v", n, err)
	}
	if races != 2 {
		t.Errorf("patched %d times, want 2 (the first lost the race)", races)
	}
	if got, want := taintsOf(t, c, "node-1"), []string{"example.com/maintenance:NoSchedule", "example.com/gpu:PreferNoSchedule"}; !slices.Equal(got, want) {
		t.Errorf("taints %v, want %v (the concurrent edit kept)", got, want)
	}
}

// racingClient runs before ahead of every node patch: a concurrent edit
// between the untainter's read and its patch.
type racingClient struct {
	corev1client.CoreV1Interface
	before func()
}

func (c racingClient) Nodes() corev1client.NodeInterface {
	return racingNodes{c.CoreV1Interface.Nodes(), c.before}
}

type racingNodes struct {
	corev1client.NodeInterface
	before func()
}

func (n racingNodes) Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, sub ...string) (*corev1.Node, error) {
	n.before()
	return n.NodeInterface.Patch(ctx, name, pt, data, opts, sub...)
}

// RemoveWhenReady does nothing while the agent is not ready, then removes
// the taint; a node that is not there yet (a failed attempt) is retried.
func TestRemoveWhenReady(t *testing.T) {
	s := kubetest.Start(t)
	c := s.Client()
	checks := 0
	readyFn := func() error {
		checks++
		if checks < 3 {
			return errors.New("not yet")
		}
		return nil
	}
	u := &Untainter{Client: c.CoreV1(), Node: "node-late", Key: DefaultKey}
	var errs []error
	created := make(chan error, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := u.RemoveWhenReady(ctx, readyFn, 10*time.Millisecond, func(err error) {
		errs = append(errs, err)
		if len(errs) == 1 {
			if checks != 3 {
				t.Errorf("tried after %d readiness checks, want 3", checks)
			}
			_, cerr := c.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-late"},
				Spec: corev1.NodeSpec{Taints: []corev1.Taint{oursNoExecute, maintenance}}}, metav1.CreateOptions{})
			created <- cerr
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := <-created; err != nil {
		t.Fatal(err)
	}
	if res.Removed != 1 || len(errs) != 1 {
		t.Errorf("result %+v, errors %v; want 1 removed after 1 failure", res, errs)
	}
	if got := taintsOf(t, c, "node-late"); !slices.Equal(got, []string{"example.com/maintenance:NoSchedule"}) {
		t.Errorf("taints %v", got)
	}
}

// RemoveWhenReady keeps retrying at its cap, however long removal fails:
// here 15 failures (no node yet) with the backoff at its cap from the
// third, then the node appears and the taint goes.
func TestRemoveWhenReadyRetriesPastTheCap(t *testing.T) {
	s := kubetest.Start(t)
	c := s.Client()
	u := &Untainter{Client: c.CoreV1(), Node: "node-later", Key: DefaultKey,
		Backoff: wait.Backoff{Duration: 2 * time.Millisecond, Factor: 2, Steps: 1 << 30, Cap: 8 * time.Millisecond}}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	failures := 0
	res, err := u.RemoveWhenReady(ctx, func() error { return nil }, time.Millisecond, func(error) {
		if failures++; failures == 15 {
			newNode(t, c, "node-later", oursNoSchedule)
		}
	})
	if err != nil || res.Removed != 1 || failures != 15 {
		t.Fatalf("RemoveWhenReady = %+v, %v after %d failures; want 1 removed after 15", res, err, failures)
	}
}
