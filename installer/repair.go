package installer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
)

// PodRepairer re-applies a broken pod's capture rules inside its network
// namespace (repair in place). It needs a capture backend and the host's
// /proc, so the command supplies it (installer/inplace); the controller
// only decides which pods need it.
type PodRepairer interface {
	// RepairPod programs the pod's capture. An error wrapping
	// ErrRepairNotNeeded means the pod gets no capture at all (not in the
	// mesh, excluded, host network): counted as a skip, never retried; one
	// wrapping ErrRepairImpossible is a failure that is not retried.
	RepairPod(ctx context.Context, pod *corev1.Pod) (RepairReport, error)
}

// RepairReport says what a repair in place did, for the agent's log.
type RepairReport struct {
	Netns      string // the namespace path programmed (<host-proc>/<pid>/ns/net)
	PID        int    // the process found in it (the pause container)
	Candidates int    // namespaces that held one of the pod's IPs
	Match      string // why that one is the pod's (its cgroup, or its address alone)
	Backend    string
	Why        string // why that backend
	Rules      int
}

// ErrRepairNotNeeded is wrapped by a PodRepairer's error when the pod must
// not get capture rules.
var ErrRepairNotNeeded = errors.New("pod gets no capture")

// ErrRepairImpossible is wrapped by a PodRepairer's error when retrying
// cannot help (the pod's capture settings are invalid): counted as a
// failure, not retried.
var ErrRepairImpossible = errors.New("pod cannot be repaired")

// ErrNoInPlaceRepair is returned when repair in place is configured but no
// PodRepairer is available.
var ErrNoInPlaceRepair = errors.New("repair in place (repair.repairPods, --repair-pods) needs a PodRepairer")

// maxRepairAttempts bounds retries of one pod, as Istio's queue does.
const maxRepairAttempts = 5

// Repair results, as label values.
const (
	repairSuccess = "success"
	repairSkip    = "skip"
	repairFail    = "fail"
)

// BrokenPod reports whether pod started without capture: it carries the
// sidecar annotation and its validation init container last terminated with
// the configured exit code (and message), and has not since completed.
func BrokenPod(pod *corev1.Pod, cfg RepairConfig) bool {
	if _, ok := pod.Annotations[cfg.SidecarAnnotation]; !ok {
		return false
	}
	for _, st := range pod.Status.InitContainerStatuses {
		if st.Name != cfg.InitContainerName {
			continue
		}
		if t := st.State.Terminated; t != nil && (t.Reason == "Completed" || t.ExitCode == 0) {
			continue // it passed since: the pod has its rules
		}
		t := st.LastTerminationState.Terminated
		if t == nil {
			continue
		}
		if cfg.InitContainerTerminationMessage != "" && !strings.Contains(t.Message, cfg.InitContainerTerminationMessage) {
			continue
		}
		if cfg.InitContainerExitCode != 0 && int(t.ExitCode) != cfg.InitContainerExitCode {
			continue
		}
		return true
	}
	return false
}

// RepairController watches this node's pods and repairs the broken ones
// with the configured mode.
type RepairController struct {
	cfg      RepairConfig
	mode     RepairMode
	client   kubernetes.Interface
	repairer PodRepairer
	log      zerolog.Logger
	m        *Metrics
	queue    workqueue.TypedRateLimitingInterface[string]
	pods     cache.SharedIndexInformer

	mu       sync.Mutex
	repaired map[types.UID]bool // repaired in place already (the pod recovers on its next restart)
	api      apiHealth
}

// apiHealth tracks whether the controller's list/watch reaches the API
// server, so an outage is logged with its cause when it starts, again now
// and then while it lasts, and when it ends.
type apiHealth struct {
	down      bool
	since     time.Time // start of the outage
	lastLog   time.Time
	errs      int // errors in this outage
	lastError string
}

// apiOutageLogEvery bounds how often a continuing outage is logged (the
// reflector retries with a backoff starting under a second).
const apiOutageLogEvery = time.Minute

// NewRepairController builds the controller; repairer may be nil unless
// the mode is repair in place.
func NewRepairController(client kubernetes.Interface, cfg RepairConfig, repairer PodRepairer, log zerolog.Logger, m *Metrics) (*RepairController, error) {
	mode := cfg.Mode()
	if mode == RepairNone {
		return nil, errors.New("repair controller: no repair mode is enabled")
	}
	if mode == RepairInPlace && repairer == nil {
		return nil, ErrNoInPlaceRepair
	}
	if cfg.NodeName == "" {
		return nil, errors.New("repair controller: no node name")
	}
	if m == nil {
		m = NewMetrics()
	}
	sel := fields.OneTermEqualSelector("spec.nodeName", cfg.NodeName)
	if cfg.FieldSelectors != "" {
		extra, err := fields.ParseSelector(cfg.FieldSelectors)
		if err != nil {
			return nil, fmt.Errorf("parsing repair field selectors %q: %w", cfg.FieldSelectors, err)
		}
		sel = fields.AndSelectors(sel, extra)
	}
	c := &RepairController{
		cfg: cfg, mode: mode, client: client, repairer: repairer, log: log.With().Str("subsystem", "repair").Str("mode", string(mode)).Logger(), m: m,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "nftmesh-repair"}),
		repaired: map[types.UID]bool{},
	}
	tweak := func(o *metav1.ListOptions) {
		o.FieldSelector = sel.String()
		o.LabelSelector = cfg.LabelSelectors
	}
	// Every list and watch call reports its outcome, which says whether
	// the API is reachable. (The informer's watch error handler would miss
	// most failures: its streaming list retries them inside the reflector.)
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			tweak(&o)
			l, err := ListSlimPods(ctx, func(ctx context.Context, o metav1.ListOptions) (*corev1.PodList, error) {
				l, err := client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, o)
				c.apiCalled(ctx, err)
				return l, err
			}, o)
			if err != nil {
				return nil, err
			}
			return l, nil
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			tweak(&o)
			w, err := client.CoreV1().Pods(metav1.NamespaceAll).Watch(ctx, o)
			c.apiCalled(ctx, err)
			return w, err
		},
	}
	// As the generated informers do: a client without streaming lists
	// (client-go's fake clientset) gets a plain list first.
	c.pods = cache.NewSharedIndexInformer(cache.ToListWatcherWithWatchListSemantics(lw, client), &corev1.Pod{}, 0, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	// Only what the agent reads is cached (see SlimPod).
	if err := c.pods.SetTransform(SlimPod); err != nil {
		return nil, fmt.Errorf("setting the pod informer's transform: %w", err)
	}
	m.RepairAPIReachable.Set(0)
	enqueue := func(obj any) {
		pod, ok := obj.(*corev1.Pod)
		if !ok || !BrokenPod(pod, cfg) {
			return
		}
		if key, err := cache.MetaNamespaceKeyFunc(pod); err == nil {
			c.queue.Add(key)
		}
	}
	forget := func(obj any) {
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		if pod, ok := obj.(*corev1.Pod); ok {
			c.mu.Lock()
			delete(c.repaired, pod.UID) // UIDs are never reused: keep the set small
			c.mu.Unlock()
		}
	}
	if _, err := c.pods.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, obj any) { enqueue(obj) },
		DeleteFunc: forget,
	}); err != nil {
		return nil, fmt.Errorf("registering pod handler: %w", err)
	}
	return c, nil
}

// PodInformer is the controller's informer of its node's pods, for other
// readers of the same watch (the agent's socket); Run runs it. nodeOnly
// reports whether it holds every pod of the node, that is, no extra label
// or field selector narrows it.
func (c *RepairController) PodInformer() (pods cache.SharedIndexInformer, nodeOnly bool) {
	return c.pods, c.cfg.LabelSelectors == "" && c.cfg.FieldSelectors == ""
}

// Run processes broken pods until ctx ends.
func (c *RepairController) Run(ctx context.Context) error {
	defer c.queue.ShutDown()
	ictx, stopInformer := context.WithCancel(ctx)
	informerDone := make(chan struct{})
	go func() {
		defer close(informerDone)
		c.pods.RunWithContext(ictx)
	}()
	defer func() {
		stopInformer()
		<-informerDone
	}()
	if !cache.WaitForCacheSync(ctx.Done(), c.pods.HasSynced) {
		if ctx.Err() != nil {
			return nil
		}
		return errors.New("repair controller: pod cache did not sync")
	}
	c.log.Info().Str("node", c.cfg.NodeName).Msg("repair controller started")
	go func() {
		<-ctx.Done()
		c.queue.ShutDown()
	}()
	for c.next(ctx) {
	}
	return nil
}

// apiCalled records the outcome of a list or watch call. A call cut short
// by the controller's own shutdown says nothing about the API.
func (c *RepairController) apiCalled(ctx context.Context, err error) {
	switch {
	case err == nil:
		c.apiReached()
	case ctx.Err() == nil:
		c.apiFailed(err)
	}
}

// apiReached records a successful list or watch call; it ends an outage.
func (c *RepairController) apiReached() {
	c.m.RepairAPIReachable.Set(1)
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.api.down {
		return
	}
	c.log.Info().Dur("outage", time.Since(c.api.since)).Int("errors", c.api.errs).
		Msg("repair controller reaches the API server again; broken pods are repaired again")
	c.api = apiHealth{}
}

// apiFailed records a failed list or watch call. An expired resource
// version is routine (the reflector lists again), not an outage.
func (c *RepairController) apiFailed(err error) {
	if apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
		return
	}
	c.m.RepairAPIErrors.Inc()
	c.m.RepairAPIReachable.Set(0)
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	if !c.api.down {
		c.api = apiHealth{down: true, since: now}
	}
	c.api.errs++
	c.api.lastError = err.Error()
	if c.api.errs == 1 {
		c.api.lastLog = now
		c.log.Error().Err(err).
			Msg("repair controller cannot list or watch pods; broken pods are not repaired until it can")
		return
	}
	if now.Sub(c.api.lastLog) >= apiOutageLogEvery {
		c.api.lastLog = now
		c.log.Error().Err(err).Dur("outage", now.Sub(c.api.since)).Int("errors", c.api.errs).
			Msg("repair controller still cannot list or watch pods")
	}
}

func (c *RepairController) next(ctx context.Context) bool {
	key, quit := c.queue.Get()
	if quit {
		return false
	}
	defer c.queue.Done(key)
	err := c.handle(ctx, key)
	switch {
	case err == nil:
		c.queue.Forget(key)
	case c.queue.NumRequeues(key) < maxRepairAttempts-1:
		c.log.Warn().Err(err).Str("pod", key).Msg("repairing pod; will retry")
		c.queue.AddRateLimited(key)
	default:
		c.log.Error().Err(err).Str("pod", key).Msg("repairing pod; giving up")
		c.queue.Forget(key)
	}
	return true
}

func (c *RepairController) count(result string) {
	c.m.repaired(c.mode, result)
}

func (c *RepairController) handle(ctx context.Context, key string) error {
	obj, exists, err := c.pods.GetIndexer().GetByKey(key)
	if err != nil || !exists {
		return err
	}
	pod := obj.(*corev1.Pod)
	if !BrokenPod(pod, c.cfg) || pod.DeletionTimestamp != nil {
		return nil
	}
	log := c.log.With().Str("pod", pod.Name).Str("namespace", pod.Namespace).Logger()
	switch c.mode {
	case RepairInPlace:
		c.mu.Lock()
		done := c.repaired[pod.UID]
		c.mu.Unlock()
		if done {
			c.count(repairSkip)
			return nil
		}
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		rep, err := c.repairer.RepairPod(rctx, pod)
		if errors.Is(err, ErrRepairNotNeeded) {
			c.mu.Lock()
			c.repaired[pod.UID] = true // its spec cannot change that: never look again
			c.mu.Unlock()
			log.Info().Err(err).Msg("broken pod needs no capture; not repairing it")
			c.count(repairSkip)
			return nil
		}
		if errors.Is(err, ErrRepairImpossible) {
			c.mu.Lock()
			c.repaired[pod.UID] = true
			c.mu.Unlock()
			log.Error().Err(err).Msg("repairing pod in place; it needs to be fixed and recreated")
			c.count(repairFail)
			return nil
		}
		if err != nil {
			c.count(repairFail)
			return fmt.Errorf("repairing pod %s in place: %w", key, err)
		}
		c.mu.Lock()
		c.repaired[pod.UID] = true
		c.mu.Unlock()
		log.Info().Str("netns", rep.Netns).Int("pid", rep.PID).Int("candidates", rep.Candidates).Str("match", rep.Match).
			Str("backend", rep.Backend).Str("why", rep.Why).Int("rules", rep.Rules).
			Msg("repaired the pod's capture in place; it recovers when its validation container restarts")
	case RepairDelete:
		uid, rv := pod.UID, pod.ResourceVersion
		err := c.client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
			Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &rv},
		})
		if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
			c.count(repairSkip) // gone or changed since we looked: the informer brings the new state
			return nil
		}
		if err != nil {
			c.count(repairFail)
			return fmt.Errorf("deleting broken pod %s: %w", key, err)
		}
		log.Info().Msg("deleted a pod that started without capture; its controller recreates it")
		c.event(ctx, pod, "DeleteBrokenPod", "Deleted by nftmesh-agent: the pod started before nftmesh-cni was in place and has no traffic capture")
	case RepairLabel:
		if v, ok := pod.Labels[c.cfg.BrokenPodLabelKey]; ok && v == c.cfg.BrokenPodLabelValue {
			c.count(repairSkip)
			return nil
		}
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]string{c.cfg.BrokenPodLabelKey: c.cfg.BrokenPodLabelValue}}})
		// Through pods/status: the lower privilege Istio uses for this.
		_, err := c.client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType, patch, metav1.PatchOptions{}, "status")
		if apierrors.IsNotFound(err) {
			c.count(repairSkip)
			return nil
		}
		if err != nil {
			c.count(repairFail)
			return fmt.Errorf("labelling broken pod %s: %w", key, err)
		}
		log.Info().Str("label", c.cfg.BrokenPodLabelKey).Msg("labelled a pod that started without capture")
		c.event(ctx, pod, "LabelBrokenPod", "Labelled by nftmesh-agent: the pod started before nftmesh-cni was in place and has no traffic capture")
	}
	c.count(repairSuccess)
	return nil
}

// event records a Warning on the pod; failing to record it does not fail
// the repair.
func (c *RepairController) event(ctx context.Context, pod *corev1.Pod, reason, msg string) {
	now := metav1.NewTime(time.Now())
	ev := &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{GenerateName: pod.Name + ".", Namespace: pod.Namespace},
		InvolvedObject: corev1.ObjectReference{
			Kind: "Pod", APIVersion: "v1", Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID, ResourceVersion: pod.ResourceVersion,
		},
		Reason: reason, Message: msg, Type: corev1.EventTypeWarning, Count: 1,
		FirstTimestamp: now, LastTimestamp: now,
		Source: corev1.EventSource{Component: "nftmesh-agent", Host: c.cfg.NodeName},
	}
	if _, err := c.client.CoreV1().Events(pod.Namespace).Create(ctx, ev, metav1.CreateOptions{}); err != nil {
		c.log.Warn().Err(err).Str("pod", pod.Name).Str("namespace", pod.Namespace).Msg("recording event")
	}
}
