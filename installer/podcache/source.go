// Package podcache answers the plugin's socket questions (agentsock) from
// the agent's node pod informer, only for the very UID asked about. A pod
// the informer has not seen yet is waited for on the watch, briefly, then
// read once from the API server; anything else is "unknown", which sends
// the plugin to its own lookup. The agent hands in the informer's store
// (shared with the repair controller: one watch per node), a sync check
// and a getter for the one read.
package podcache

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/nftmesh/nftmesh/podinfo"
	"github.com/nftmesh/nftmesh/podinfo/agentsock"
)

// Store is the informer's store (cache.Indexer satisfies it).
type Store interface {
	GetByKey(key string) (item any, exists bool, err error)
}

// GetFunc reads one pod from the API server with a consistent read.
type GetFunc func(ctx context.Context, namespace, name string) (*corev1.Pod, error)

// DefaultWait is how long a pod the informer has not seen is waited for
// before the one API read: kubelet learns of it from the same API server's
// watch, so the informer is normally milliseconds behind at most.
const DefaultWait = time.Second

// Source answers from an informer's store.
type Source struct {
	store  Store
	synced func() bool
	get    GetFunc
	Wait   time.Duration // bounds the wait for the watch to bring the pod
	// Linkerd, when set, gives Linkerd pods' answers their namespace's
	// annotations and the API server's ports (linkerd.go).
	Linkerd LinkerdFacts

	mu      sync.Mutex
	waiters map[string][]chan struct{}
}

var _ agentsock.Resolver = (*Source)(nil)

// New builds a source. synced reports whether the informer has listed its
// pods once (before that a miss means nothing); without get, a pod not in
// the store after the wait is unknown. Without a store, every request is
// one read through get.
func New(store Store, synced func() bool, get GetFunc) *Source {
	return &Source{store: store, synced: synced, get: get, Wait: DefaultWait, waiters: map[string][]chan struct{}{}}
}

// Handler is the informer's event handler that wakes waiting requests.
func (s *Source) Handler() cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { s.notify(obj) },
		UpdateFunc: func(_, obj any) { s.notify(obj) },
	}
}

func (s *Source) notify(obj any) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	key := pod.Namespace + "/" + pod.Name
	s.mu.Lock()
	ws := s.waiters[key]
	delete(s.waiters, key)
	s.mu.Unlock()
	for _, w := range ws {
		close(w)
	}
}

// subscribe returns a channel closed at the next event for key.
func (s *Source) subscribe(key string) chan struct{} {
	ch := make(chan struct{})
	s.mu.Lock()
	s.waiters[key] = append(s.waiters[key], ch)
	s.mu.Unlock()
	return ch
}

func (s *Source) unsubscribe(key string, ch chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ws := slices.DeleteFunc(s.waiters[key], func(w chan struct{}) bool { return w == ch })
	if len(ws) == 0 {
		delete(s.waiters, key)
	} else {
		s.waiters[key] = ws
	}
}

// lookup is the stored pod when it has the UID asked about, else why not.
func (s *Source) lookup(key, uid string) (*corev1.Pod, string) {
	obj, exists, err := s.store.GetByKey(key)
	if err != nil {
		return nil, "reading the pod cache: " + err.Error()
	}
	if !exists {
		return nil, "not in the pod cache"
	}
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return nil, fmt.Sprintf("pod cache holds a %T", obj)
	}
	if string(pod.UID) != uid {
		return nil, "pod cache has UID " + string(pod.UID)
	}
	return pod, ""
}

// ResolveNow answers from the cache alone when it holds the pod with the
// UID asked about (agentsock.QuickResolver).
func (s *Source) ResolveNow(req agentsock.Request) (agentsock.Answer, bool) {
	if s.store == nil || s.synced != nil && !s.synced() {
		return agentsock.Answer{}, false
	}
	if pod, _ := s.lookup(req.Namespace+"/"+req.Name, req.UID); pod != nil {
		return s.answer(pod), true
	}
	return agentsock.Answer{}, false
}

// Resolve answers one request (see the package doc). The answer is never
// about a pod with another UID.
func (s *Source) Resolve(ctx context.Context, req agentsock.Request) agentsock.Answer {
	key := req.Namespace + "/" + req.Name
	if s.store != nil && (s.synced == nil || s.synced()) {
		// The usual case, without the waiters' lock.
		if pod, _ := s.lookup(key, req.UID); pod != nil {
			return s.answer(pod)
		}
		// Subscribe before looking again, so an event between the look
		// and the wait is not missed.
		ch := s.subscribe(key)
		pod, why := s.lookup(key, req.UID)
		if pod == nil {
			wctx, cancel := context.WithTimeout(ctx, s.Wait)
			for pod == nil && wctx.Err() == nil {
				select {
				case <-ch:
					ch = s.subscribe(key)
					pod, why = s.lookup(key, req.UID)
				case <-wctx.Done():
				}
			}
			cancel()
		}
		s.unsubscribe(key, ch)
		if pod != nil {
			return s.answer(pod)
		}
		if s.get == nil {
			return agentsock.Unknown(why)
		}
	}
	return s.fetch(ctx, req)
}

// fetch is the one API read for a pod the cache cannot answer for.
func (s *Source) fetch(ctx context.Context, req agentsock.Request) agentsock.Answer {
	if s.get == nil {
		return agentsock.Unknown("pod cache not synced yet")
	}
	pod, err := s.get(ctx, req.Namespace, req.Name)
	switch {
	case apierrors.IsNotFound(err):
		return agentsock.Unknown("not found in the API")
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled):
		return agentsock.Unknown("no answer from the API in time")
	case err != nil:
		return agentsock.Unknown("reading the pod from the API: " + err.Error())
	case pod.Namespace != req.Namespace || pod.Name != req.Name:
		return agentsock.Unknown("the API answered with pod " + pod.Namespace + "/" + pod.Name)
	case string(pod.UID) != req.UID:
		return agentsock.Unknown("the API has UID " + string(pod.UID))
	}
	return s.answer(pod)
}

func (s *Source) answer(pod *corev1.Pod) agentsock.Answer {
	m := podinfo.Mesh(pod)
	s.withLinkerdFacts(m)
	return agentsock.Found(string(pod.UID), m)
}

// APIGetter is a GetFunc reading with client, consistently (the informer
// is the cached view already).
func APIGetter(client corev1client.CoreV1Interface) GetFunc {
	return func(ctx context.Context, namespace, name string) (*corev1.Pod, error) {
		return client.Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	}
}
