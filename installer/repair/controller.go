package repair

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/nftmesh/nftmesh/installer/metrics"
)

// maxRepairAttempts bounds retries of one pod, as Istio's queue does.
const maxRepairAttempts = 5

// Broken reports whether pod started without capture: it carries the
// sidecar annotation and its validation init container last terminated
// with the configured exit code (and message), and has not passed since;
// or, with cfg.Linkerd, LinkerdBroken.
func Broken(pod *corev1.Pod, cfg Config) bool {
	if cfg.Linkerd && LinkerdBroken(pod) {
		return true
	}
	if _, ok := pod.Annotations[cfg.SidecarAnnotation]; !ok {
		return false
	}
	return validationFailed(pod, cfg.InitContainerName, cfg.InitContainerExitCode, cfg.InitContainerTerminationMessage)
}

// LinkerdBroken reports whether pod is a Linkerd pod that started without
// capture, as Linkerd's repair controller decides: it carries Linkerd's
// data plane label and its linkerd-network-validator last exited 95 (and
// has not passed since, which Linkerd's does not check: a pod that
// recovered is left alone).
func LinkerdBroken(pod *corev1.Pod) bool {
	if _, ok := pod.Labels[LinkerdPodLabel]; !ok {
		return false
	}
	return validationFailed(pod, LinkerdValidatorContainer, LinkerdValidatorExitCode, "")
}

// validationFailed reports whether pod's init container name last
// terminated with code (0: any) and a message containing msg, and has not
// passed since.
func validationFailed(pod *corev1.Pod, name string, code int, msg string) bool {
	for _, st := range pod.Status.InitContainerStatuses {
		if st.Name != name {
			continue
		}
		if t := st.State.Terminated; t != nil && (t.Reason == "Completed" || t.ExitCode == 0) {
			continue // it passed since: the pod has its rules
		}
		t := st.LastTerminationState.Terminated
		if t == nil {
			continue
		}
		if msg != "" && !strings.Contains(t.Message, msg) {
			continue
		}
		if code != 0 && int(t.ExitCode) != code {
			continue
		}
		return true
	}
	return false
}

// Controller hands this node's broken pods to its strategy.
type Controller struct {
	cfg      Config
	strategy Strategy
	log      zerolog.Logger
	m        *metrics.Metrics
	queue    workqueue.TypedRateLimitingInterface[string]
	pods     cache.SharedIndexInformer

	mu  sync.Mutex
	api apiHealth
}

// apiHealth tracks whether the controller's list/watch reaches the API
// server, so an outage is logged with its cause when it starts, now and
// then while it lasts, and when it ends.
type apiHealth struct {
	down    bool
	since   time.Time // start of the outage
	lastLog time.Time
	errs    int // errors in this outage
}

// apiOutageLogEvery bounds how often a continuing outage is logged (the
// reflector retries from under a second).
const apiOutageLogEvery = time.Minute

// New builds the controller with the strategy of cfg's mode (NewStrategy).
func New(client corev1client.CoreV1Interface, cfg Config, repairer PodRepairer, log zerolog.Logger, m *metrics.Metrics) (*Controller, error) {
	s, err := NewStrategy(cfg, client, repairer)
	if err != nil {
		return nil, err
	}
	return NewController(client, cfg, s, log, m)
}

// NewController builds a controller that hands cfg.NodeName's broken pods
// to s. m may be nil.
func NewController(client corev1client.CoreV1Interface, cfg Config, s Strategy, log zerolog.Logger, m *metrics.Metrics) (*Controller, error) {
	if s == nil || s.Mode() == None {
		return nil, errors.New("repair controller: no repair mode is enabled")
	}
	if cfg.NodeName == "" {
		return nil, errors.New("repair controller: no node name")
	}
	if m == nil {
		m = metrics.New()
	}
	c := &Controller{
		cfg: cfg, strategy: s, log: log.With().Str("subsystem", "repair").Str("mode", string(s.Mode())).Logger(), m: m,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "nftmesh-repair"}),
	}
	pods, err := NodePods{Node: cfg.NodeName, FieldSelectors: cfg.FieldSelectors, LabelSelectors: cfg.LabelSelectors, Called: c.apiCalled}.Informer(client)
	if err != nil {
		return nil, fmt.Errorf("repair controller: %w", err)
	}
	c.pods = pods
	m.RepairAPIReachable.Set(0)
	enqueue := func(obj any) {
		pod, ok := obj.(*corev1.Pod)
		if !ok || !Broken(pod, cfg) {
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
			if f, ok := s.(forgetter); ok {
				f.forget(pod.UID) // UIDs are never reused: keep its memory small
			}
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

// Run processes broken pods until ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	defer c.queue.ShutDown()
	ictx, stopInformer := context.WithCancel(ctx)
	var informer sync.WaitGroup
	informer.Go(func() { c.pods.RunWithContext(ictx) })
	defer func() {
		stopInformer()
		informer.Wait()
	}()
	if !cache.WaitForCacheSync(ctx.Done(), c.pods.HasSynced) {
		if ctx.Err() != nil {
			return nil
		}
		return errors.New("repair controller: pod cache did not sync")
	}
	c.log.Info().Str("node", c.cfg.NodeName).Msg("repair controller started")
	stop := context.AfterFunc(ctx, c.queue.ShutDown)
	defer stop()
	for c.next(ctx) {
	}
	return nil
}

// apiCalled records the outcome of a list or watch call; one cut short by
// the controller's own shutdown says nothing about the API.
func (c *Controller) apiCalled(ctx context.Context, err error) {
	switch {
	case err == nil:
		c.apiReached()
	case ctx.Err() == nil:
		c.apiFailed(err)
	}
}

func (c *Controller) apiReached() {
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

// apiFailed records a failed call. An expired resource version is routine
// (the reflector lists again), not an outage.
func (c *Controller) apiFailed(err error) {
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

func (c *Controller) next(ctx context.Context) bool {
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

// PodInformer is the controller's informer, for other readers of the same
// watch (the agent's socket); Run runs it. nodeOnly: no extra label or
// field selector narrows it to fewer than all the node's pods.
func (c *Controller) PodInformer() (pods cache.SharedIndexInformer, nodeOnly bool) {
	return c.pods, c.cfg.LabelSelectors == "" && c.cfg.FieldSelectors == ""
}

func (c *Controller) handle(ctx context.Context, key string) error {
	obj, exists, err := c.pods.GetIndexer().GetByKey(key)
	if err != nil || !exists {
		return err
	}
	pod := obj.(*corev1.Pod)
	if !Broken(pod, c.cfg) || pod.DeletionTimestamp != nil {
		return nil
	}
	log := c.log.With().Str("pod", pod.Name).Str("namespace", pod.Namespace).Logger()
	result, err := c.strategy.Repair(ctx, pod, log)
	c.m.Repaired(string(c.strategy.Mode()), string(result))
	return err
}
