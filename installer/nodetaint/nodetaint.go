// Package nodetaint removes the "CNI not ready" taint
// (cni.istio.io/not-ready) from the agent's own node once the agent can
// program pods, so a node born with it takes pods as soon as their capture
// is certain, without istiod's untaint controller.
//
// It only removes the taints with its key from the node it is given (the
// agent's own); the chart's admission policy refuses the agent any other
// node or change. The agent tells it when it is ready.
package nodetaint

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/util/retry"
)

// DefaultKey is the taint Istio's untaint controller removes by default.
const DefaultKey = "cni.istio.io/not-ready"

// Untainter removes every taint with Key (all effects) from Node.
type Untainter struct {
	Client corev1client.CoreV1Interface
	Node   string
	Key    string
	// Backoff paces RemoveWhenReady's retries: zero is a second, doubling
	// to a minute. Past its Steps or Cap every retry waits the last delay.
	Backoff wait.Backoff
}

// Remove takes the key's taints off the node and reports how many it
// removed. The patch carries a JSON-patch test of the taints it read, so a
// concurrent change to them fails it instead of being overwritten, and it
// is read and tried again.
func (u *Untainter) Remove(ctx context.Context) (removed int, err error) {
	if u.Node == "" || u.Key == "" {
		return 0, errors.New("removing the node taint: no node name or taint key")
	}
	err = retry.OnError(retry.DefaultRetry, lostRace, func() error {
		node, err := u.Client.Nodes().Get(ctx, u.Node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		keep := slices.DeleteFunc(slices.Clone(node.Spec.Taints), func(t corev1.Taint) bool { return t.Key == u.Key })
		removed = len(node.Spec.Taints) - len(keep)
		if removed == 0 {
			return nil
		}
		patch, err := taintPatch(node.Spec.Taints, keep)
		if err != nil {
			return err
		}
		_, err = u.Client.Nodes().Patch(ctx, u.Node, types.JSONPatchType, patch, metav1.PatchOptions{FieldManager: "nftmesh-agent"})
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("removing taint %s from node %s: %w", u.Key, u.Node, err)
	}
	return removed, nil
}

// lostRace: the node changed between read and patch (a failed JSON-patch
// test is a 422, Invalid).
func lostRace(err error) bool {
	return apierrors.IsConflict(err) || apierrors.IsInvalid(err)
}

// taintPatch replaces the taints only if they are still exactly old.
func taintPatch(old, keep []corev1.Taint) ([]byte, error) {
	type op struct {
		Op    string         `json:"op"`
		Path  string         `json:"path"`
		Value []corev1.Taint `json:"value"`
	}
	ops := []op{{Op: "test", Path: "/spec/taints", Value: old}}
	if len(keep) == 0 {
		ops = append(ops, op{Op: "remove", Path: "/spec/taints"})
	} else {
		ops = append(ops, op{Op: "replace", Path: "/spec/taints", Value: keep})
	}
	b, err := json.Marshal(ops)
	if err != nil {
		return nil, fmt.Errorf("encoding the taint patch: %w", err)
	}
	return b, nil
}

// Result is what RemoveWhenReady did, for the agent to log.
type Result struct {
	Removed int
	Waited  time.Duration // until ready() first passed
}

// RemoveWhenReady polls ready every interval until it returns nil, then
// removes the taint, retrying failures (RBAC not there yet, API down) with
// a backoff up to a minute, for as long as they last; onErr hears each
// failure. It returns when the taint is gone or ctx ends.
func (u *Untainter) RemoveWhenReady(ctx context.Context, ready func() error, interval time.Duration, onErr func(error)) (Result, error) {
	start := time.Now()
	var res Result
	if err := wait.PollUntilContextCancel(ctx, interval, true, func(context.Context) (bool, error) {
		return ready() == nil, nil
	}); err != nil {
		return res, fmt.Errorf("waiting to be ready before removing taint %s: %w", u.Key, err)
	}
	res.Waited = time.Since(start)
	backoff := u.Backoff
	if backoff.Duration == 0 {
		backoff = wait.Backoff{Duration: time.Second, Factor: 2, Jitter: 0.1, Steps: 1 << 30, Cap: time.Minute}
	}
	// Not wait.ExponentialBackoff: it stops once the delay reaches Cap
	// (its Steps drop to 0 there), and the taint must go however late.
	delay := backoff.DelayFunc()
	for {
		n, err := u.Remove(ctx)
		if err == nil {
			res.Removed = n
			return res, nil
		}
		if ctx.Err() != nil {
			return res, ctx.Err()
		}
		if onErr != nil {
			onErr(err)
		}
		select {
		case <-ctx.Done():
			return res, ctx.Err()
		case <-time.After(delay()):
		}
	}
}
