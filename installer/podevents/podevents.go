// Package podevents records Kubernetes Events, from the agent (component
// nftmesh-agent, host: its node), on pods whose capture failed, was
// repaired in place, or drifted from its plan, so `kubectl describe pod`
// shows what the agent saw.
//
// It owns the agent's event broadcaster: client-go's record package, whose
// correlator aggregates repeats and rate-limits each pod's events (a burst
// of 25, then one per five minutes), and whose queue drops rather than
// blocks, so recording never delays a CNI call. It decides nothing.
package podevents

import (
	"context"
	"errors"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"

	"github.com/nftmesh/nftmesh/installer/repair"
	"github.com/nftmesh/nftmesh/podinfo/agentsock"
)

// Component is the events' source.
const Component = "nftmesh-agent"

// Event reasons.
const (
	ReasonCaptureFailed       = "CaptureFailed"
	ReasonCaptureRepaired     = "CaptureRepaired"
	ReasonCaptureRepairFailed = "CaptureRepairFailed"
	ReasonCaptureDrift        = "CaptureDrift"
)

// maxMessage bounds an event's message, which may come from the plugin's
// log file.
const maxMessage = 512

// Recorder records the agent's pod events.
type Recorder struct {
	b   record.EventBroadcaster
	rec record.EventRecorder
	// lookup finds a pod the plugin named in the agent's pod cache, for its
	// UID; without it, the event names the pod without one.
	lookup func(namespace, name string) *corev1.Pod
}

// New starts the broadcaster; Shutdown stops it.
func New(ctx context.Context, client typedcorev1.CoreV1Interface, node string, lookup func(namespace, name string) *corev1.Pod) *Recorder {
	b := record.NewBroadcaster(record.WithContext(ctx))
	b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.Events("")})
	return &Recorder{
		b:      b,
		rec:    b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: Component, Host: node}),
		lookup: lookup,
	}
}

// Shutdown stops the broadcaster (events still queued may be lost).
func (r *Recorder) Shutdown() { r.b.Shutdown() }

// object is the pod from the cache, else a reference by name.
func (r *Recorder) object(namespace, name string) runtime.Object {
	if r.lookup != nil {
		if p := r.lookup(namespace, name); p != nil {
			return p
		}
	}
	return &corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: namespace, Name: name}
}

func bound(s string) string {
	if len(s) <= maxMessage {
		return s
	}
	return s[:maxMessage] + "..."
}

// Repairer wraps a repair-in-place implementation so each outcome is also
// an event on the pod (a pod that needs no capture records none).
func (r *Recorder) Repairer(inner repair.PodRepairer) repair.PodRepairer {
	return repairer{inner: inner, r: r}
}

type repairer struct {
	inner repair.PodRepairer
	r     *Recorder
}

func (w repairer) RepairPod(ctx context.Context, pod *corev1.Pod) (repair.Report, error) {
	rep, err := w.inner.RepairPod(ctx, pod)
	switch {
	case err == nil:
		w.r.rec.Eventf(pod, corev1.EventTypeNormal, ReasonCaptureRepaired,
			"nftmesh-agent applied the pod's missing traffic capture in place (%s backend, %d rules); the pod recovers when its validation container restarts", rep.Backend, rep.Rules)
	case errors.Is(err, repair.ErrNotNeeded), ctx.Err() != nil:
	default:
		w.r.rec.Eventf(pod, corev1.EventTypeWarning, ReasonCaptureRepairFailed,
			"nftmesh-agent could not apply the pod's missing traffic capture in place: %s", bound(err.Error()))
	}
	return rep, err
}

// Decision turns one plugin run's decision into an event: a failed ADD
// (the runtime retries the sandbox) is CaptureFailed, a failed CHECK is
// drift from the pod's plan.
func (r *Recorder) Decision(d agentsock.Decision) {
	if d.Decision != "error" || d.Namespace == "" || d.Pod == "" {
		return
	}
	switch d.Command {
	case "ADD":
		r.rec.Eventf(r.object(d.Namespace, d.Pod), corev1.EventTypeWarning, ReasonCaptureFailed,
			"nftmesh-cni could not set up traffic capture (run by the %s): %s", d.RanBy, bound(d.Error))
	case "CHECK":
		r.rec.Eventf(r.object(d.Namespace, d.Pod), corev1.EventTypeWarning, ReasonCaptureDrift,
			"the pod's capture rules differ from its plan: %s", bound(d.Error))
	}
}
