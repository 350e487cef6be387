package main

import (
	"cmp"
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/nftmesh/nftmesh/installer"
	"github.com/nftmesh/nftmesh/installer/metrics"
	"github.com/nftmesh/nftmesh/installer/podevents"
	"github.com/nftmesh/nftmesh/podinfo/agentsock"
)

// podEvents is the agent's event recorder, or nil when turned off or
// without an API client. Pods are looked up in the node's pod watch, once
// setUp hands it over.
type podEvents struct {
	*podevents.Recorder
	pods cache.Indexer
}

func newPodEvents(cfg *installer.Config, client corev1client.CoreV1Interface) *podEvents {
	if !cfg.PodEvents || client == nil {
		return nil
	}
	e := &podEvents{}
	e.Recorder = podevents.New(context.Background(), client, cmp.Or(cfg.NodeName, cfg.Repair.NodeName), e.lookup)
	return e
}

func (e *podEvents) lookup(namespace, name string) *corev1.Pod {
	if e.pods == nil {
		return nil
	}
	obj, ok, err := e.pods.GetByKey(namespace + "/" + name)
	if err != nil || !ok {
		return nil
	}
	p, _ := obj.(*corev1.Pod)
	return p
}

// decided counts a plugin run's decision and records an Event for a failed
// ADD or CHECK: the calls the agent runs hand it over in process, the
// standalone plugin's are read back from its log file.
func (a *agent) decided(d agentsock.Decision) {
	a.m.Decided(d)
	if a.events != nil {
		a.events.Decision(d)
	}
}

func (e *podEvents) shutdown() {
	if e != nil {
		e.Shutdown()
	}
}

// observeStart times the agent's start: until the pod watch has listed the
// node's pods, and until the agent can program pods (then it removes the
// node's not-ready taint). It returns when both are done or ctx ends.
func observeStart(ctx context.Context, start time.Time, m *metrics.Metrics, sock *podSocket, ready func() error, then func()) {
	if sock != nil {
		go func() {
			if cache.WaitForCacheSync(ctx.Done(), sock.pods.HasSynced) {
				m.PodWatchSync.Observe(time.Since(start).Seconds())
			}
		}()
	}
	if err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(context.Context) (bool, error) {
		return ready() == nil, nil
	}); err != nil {
		return
	}
	m.AgentReady.Observe(time.Since(start).Seconds())
	then()
}
