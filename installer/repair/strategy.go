package repair

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/rs/zerolog"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
)

// Result is the outcome of handling one broken pod: the result label of
// the repair metrics, ours and Istio's.
type Result string

// Results.
const (
	Success Result = "success"
	Skip    Result = "skip"
	Fail    Result = "fail"
)

// Strategy is what one repair mode does to a pod the controller found
// broken; the controller decides which pods are broken, retries, counts and
// logs.
type Strategy interface {
	Mode() Mode
	// Repair handles one broken pod, logging what it did to log (which
	// names the pod). An error asks for a (bounded) retry; a result that
	// must not be retried comes with a nil error.
	Repair(ctx context.Context, pod *corev1.Pod, log zerolog.Logger) (Result, error)
}

// forgetter is a strategy that remembers pods until they are deleted.
type forgetter interface {
	forget(uid types.UID)
}

// PodRepairer re-applies a broken pod's capture rules inside its network
// namespace (repair in place; installer/inplace implements it).
type PodRepairer interface {
	// RepairPod programs the pod's capture. An error wrapping
	// ErrNotNeeded (not in the mesh, excluded, host network) is counted as
	// a skip, one wrapping ErrImpossible as a failure; neither is retried.
	RepairPod(ctx context.Context, pod *corev1.Pod) (Report, error)
}

// Report says what a repair in place did, for the agent's log.
type Report struct {
	Netns      string // the namespace path programmed (<host-proc>/<pid>/ns/net)
	PID        int    // the process found in it (the pause container)
	Candidates int    // namespaces that held one of the pod's IPs
	Match      string // why that one is the pod's (its cgroup, or its address alone)
	Backend    string
	Why        string // why that backend
	Rules      int
}

// Errors a PodRepairer wraps: the pod must not get capture rules, or
// retrying cannot help (its capture settings are invalid).
var (
	ErrNotNeeded  = errors.New("pod gets no capture")
	ErrImpossible = errors.New("pod cannot be repaired")
)

// ErrNoInPlaceRepair is returned when repair in place is configured but no
// PodRepairer is available.
var ErrNoInPlaceRepair = errors.New("repair in place (repair.repairPods, --repair-pods) needs a PodRepairer")

// NewStrategy returns the strategy for cfg's mode. client is what delete
// and label write to; repairer is needed for repair in place only.
func NewStrategy(cfg Config, client corev1client.CoreV1Interface, repairer PodRepairer) (Strategy, error) {
	switch cfg.Mode() {
	case InPlace:
		if repairer == nil {
			return nil, ErrNoInPlaceRepair
		}
		return &inPlace{repairer: repairer}, nil
	case Delete:
		return &deletePod{client: client, node: cfg.NodeName}, nil
	case Label:
		return &labelPod{client: client, node: cfg.NodeName, key: cfg.BrokenPodLabelKey, value: cfg.BrokenPodLabelValue}, nil
	}
	return nil, errors.New("repair controller: no repair mode is enabled")
}

// inPlace is Istio's repairPods mode: it reprograms the pod's capture in
// its network namespace. The pod keeps failing its validation until that
// container restarts, so a pod already repaired (or found to need no
// repair) is not touched again.
type inPlace struct {
	repairer PodRepairer
	repaired sync.Map // types.UID: UIDs are never reused; forgotten when the pod is deleted
}

func (s *inPlace) Mode() Mode { return InPlace }

func (s *inPlace) forget(uid types.UID) { s.repaired.Delete(uid) }

func (s *inPlace) Repair(ctx context.Context, pod *corev1.Pod, log zerolog.Logger) (Result, error) {
	if _, done := s.repaired.Load(pod.UID); done {
		return Skip, nil
	}
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	rep, err := s.repairer.RepairPod(rctx, pod)
	switch {
	case errors.Is(err, ErrNotNeeded):
		s.repaired.Store(pod.UID, true) // its spec cannot change that: never look again
		log.Info().Err(err).Msg("broken pod needs no capture; not repairing it")
		return Skip, nil
	case errors.Is(err, ErrImpossible):
		s.repaired.Store(pod.UID, true)
		log.Error().Err(err).Msg("repairing pod in place; it needs to be fixed and recreated")
		return Fail, nil
	case err != nil:
		return Fail, fmt.Errorf("repairing pod %s/%s in place: %w", pod.Namespace, pod.Name, err)
	}
	s.repaired.Store(pod.UID, true)
	log.Info().Str("netns", rep.Netns).Int("pid", rep.PID).Int("candidates", rep.Candidates).Str("match", rep.Match).
		Str("backend", rep.Backend).Str("why", rep.Why).Int("rules", rep.Rules).
		Msg("repaired the pod's capture in place; it recovers when its validation container restarts")
	return Success, nil
}

// deletePod is Istio's deletePods mode: it deletes the pod so its
// controller recreates it, now with the plugin in place.
type deletePod struct {
	client corev1client.CoreV1Interface
	node   string // names this node in the events it records
}

func (s *deletePod) Mode() Mode { return Delete }

func (s *deletePod) Repair(ctx context.Context, pod *corev1.Pod, log zerolog.Logger) (Result, error) {
	uid, rv := pod.UID, pod.ResourceVersion
	err := s.client.Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
		Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &rv},
	})
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return Skip, nil // gone or changed since we looked: the informer brings the new state
	}
	if err != nil {
		return Fail, fmt.Errorf("deleting broken pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	log.Info().Msg("deleted a pod that started without capture; its controller recreates it")
	recordEvent(ctx, s.client, s.node, pod, "DeleteBrokenPod", "Deleted by nftmesh-agent: the pod started before nftmesh-cni was in place and has no traffic capture", log)
	return Success, nil
}

// labelPod is Istio's labelPods mode: it sets key=value on the pod, for an
// operator or another controller to act on.
type labelPod struct {
	client     corev1client.CoreV1Interface
	node       string
	key, value string
}

func (s *labelPod) Mode() Mode { return Label }

func (s *labelPod) Repair(ctx context.Context, pod *corev1.Pod, log zerolog.Logger) (Result, error) {
	if v, ok := pod.Labels[s.key]; ok && v == s.value {
		return Skip, nil
	}
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]string{s.key: s.value}}})
	// Through pods/status: the lower privilege Istio uses for this.
	_, err := s.client.Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType, patch, metav1.PatchOptions{}, "status")
	if apierrors.IsNotFound(err) {
		return Skip, nil
	}
	if err != nil {
		return Fail, fmt.Errorf("labelling broken pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	log.Info().Str("label", s.key).Msg("labelled a pod that started without capture")
	recordEvent(ctx, s.client, s.node, pod, "LabelBrokenPod", "Labelled by nftmesh-agent: the pod started before nftmesh-cni was in place and has no traffic capture", log)
	return Success, nil
}

// recordEvent records a Warning on the pod; failing to record it does not
// fail the repair.
func recordEvent(ctx context.Context, client corev1client.CoreV1Interface, node string, pod *corev1.Pod, reason, msg string, log zerolog.Logger) {
	now := metav1.NewTime(time.Now())
	ev := &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{GenerateName: pod.Name + ".", Namespace: pod.Namespace},
		InvolvedObject: corev1.ObjectReference{
			Kind: "Pod", APIVersion: "v1", Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID, ResourceVersion: pod.ResourceVersion,
		},
		Reason: reason, Message: msg, Type: corev1.EventTypeWarning, Count: 1,
		FirstTimestamp: now, LastTimestamp: now,
		Source: corev1.EventSource{Component: "nftmesh-agent", Host: node},
	}
	if _, err := client.Events(pod.Namespace).Create(ctx, ev, metav1.CreateOptions{}); err != nil {
		log.Warn().Err(err).Msg("recording event")
	}
}
