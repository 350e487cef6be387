package cluster

import (
	"context"
	"fmt"
	"math"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
)

// plainPod is a pod outside any mesh running the pause image.
func plainPod(name string) *corev1.Pod {
	grace := int64(1)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Labels: map[string]string{"e2e": "plain"}},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{
				Name: "pause", Image: pauseImage, ImagePullPolicy: corev1.PullNever, Command: []string{"/pause"},
			}},
		},
	}
}

// createAndWait creates pod and returns how long it took from the create
// call to phase Running, seen through a watch (no polling delay).
func (c *Cluster) createAndWait(ctx context.Context, pod *corev1.Pod, timeout time.Duration) (*corev1.Pod, time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	pods := c.Client.CoreV1().Pods(pod.Namespace)
	t0 := time.Now()
	created, err := pods.Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		return nil, 0, fmt.Errorf("creating pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	p, err := c.waitPod(ctx, created, func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
	if err != nil {
		return p, 0, err
	}
	return p, time.Since(t0), nil
}

// waitPod watches pod until cond holds, or fails naming the pod's last
// state. A pod that failed is an error at once.
func (c *Cluster) waitPod(ctx context.Context, pod *corev1.Pod, cond func(*corev1.Pod) bool) (*corev1.Pod, error) {
	last := pod
	if cond(last) {
		return last, nil
	}
	w, err := c.Client.CoreV1().Pods(pod.Namespace).Watch(ctx, metav1.ListOptions{
		FieldSelector:   fields.OneTermEqualSelector("metadata.name", pod.Name).String(),
		ResourceVersion: pod.ResourceVersion,
	})
	if err != nil {
		return last, fmt.Errorf("watching pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	defer w.Stop()
	for {
		select {
		case <-ctx.Done():
			return last, fmt.Errorf("waiting for pod %s/%s: %w; last status: %s", pod.Namespace, pod.Name, ctx.Err(), podState(last))
		case ev, ok := <-w.ResultChan():
			if !ok {
				// The watch can end early (apiserver timeout); resume from here.
				return c.waitPod(ctx, last, cond)
			}
			p, isPod := ev.Object.(*corev1.Pod)
			if !isPod || ev.Type == watch.Error {
				continue
			}
			last = p
			if ev.Type == watch.Deleted {
				return last, fmt.Errorf("pod %s/%s was deleted while waiting; last status: %s", pod.Namespace, pod.Name, podState(last))
			}
			if cond(p) {
				return p, nil
			}
			if p.Status.Phase == corev1.PodFailed {
				return p, fmt.Errorf("pod %s/%s failed: %s", pod.Namespace, pod.Name, podState(p))
			}
		}
	}
}

// podState is a one-line summary of a pod's status for error messages.
func podState(p *corev1.Pod) string {
	if p == nil {
		return "none"
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "phase=%s", p.Status.Phase)
	for _, cond := range p.Status.Conditions {
		if cond.Status != corev1.ConditionTrue && cond.Message != "" {
			fmt.Fprintf(&sb, " %s=%s(%s)", cond.Type, cond.Status, cond.Message)
		}
	}
	for _, list := range [][]corev1.ContainerStatus{p.Status.InitContainerStatuses, p.Status.ContainerStatuses} {
		for _, s := range list {
			switch {
			case s.State.Waiting != nil:
				fmt.Fprintf(&sb, " %s:waiting(%s %s)", s.Name, s.State.Waiting.Reason, s.State.Waiting.Message)
			case s.State.Terminated != nil:
				fmt.Fprintf(&sb, " %s:exited(%d %s)", s.Name, s.State.Terminated.ExitCode, s.State.Terminated.Reason)
			case s.State.Running != nil:
				fmt.Fprintf(&sb, " %s:running", s.Name)
			}
		}
	}
	return sb.String()
}

// deletePods deletes the pods matching selector in ns and waits until they
// are gone (their CNI DEL has run by then).
func (c *Cluster) deletePods(ctx context.Context, ns, selector string) error {
	return c.deletePodsWithin(ctx, ns, selector, 60*time.Second)
}

// deletePodsWithin is deletePods waiting up to timeout.
func (c *Cluster) deletePodsWithin(ctx context.Context, ns, selector string, timeout time.Duration) error {
	pods := c.Client.CoreV1().Pods(ns)
	if err := pods.DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: selector}); err != nil {
		return fmt.Errorf("deleting pods %s in %s: %w", selector, ns, err)
	}
	return c.poll(ctx, timeout, "pods "+selector+" gone", func() (bool, error) {
		l, err := pods.List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			return false, nil
		}
		return len(l.Items) == 0, nil
	})
}

// podStartTimes starts n plain pods one after the other and returns each
// one's create → Running time; the pods are deleted afterwards.
func (c *Cluster) podStartTimes(ctx context.Context, t *testing.T, prefix string, n int) []time.Duration {
	t.Helper()
	var ds []time.Duration
	for i := 0; i < n; i++ {
		pod := plainPod(fmt.Sprintf("%s-%d", prefix, i))
		pod.Labels["e2e-run"] = prefix
		p, d, err := c.createAndWait(ctx, pod, 60*time.Second)
		if err != nil {
			t.Fatalf("%v (%s)", err, podState(p))
		}
		ds = append(ds, d)
	}
	if err := c.deletePods(ctx, "default", "e2e-run="+prefix); err != nil {
		t.Fatal(err)
	}
	return ds
}

// percentiles returns p50 and p95 (nearest rank).
func percentiles(ds []time.Duration) (p50, p95 time.Duration) {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	rank := func(p float64) time.Duration {
		i := int(math.Ceil(p*float64(len(s)))) - 1
		return s[max(i, 0)]
	}
	return rank(0.50), rank(0.95)
}
