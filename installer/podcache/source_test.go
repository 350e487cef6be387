package podcache

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/nftmesh/nftmesh/podinfo/agentsock"
)

// The informer's store and its events are played by a real cache.Store and
// the source's own handler, called as the informer would call it.

func pod(uid string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web-1", UID: types.UID(uid),
		Annotations: map[string]string{"sidecar.istio.io/status": "{}"}}}
}

func request(uid string) agentsock.Request {
	return agentsock.Request{V: agentsock.Version, Namespace: "shop", Name: "web-1", UID: uid}
}

type getter struct {
	n   atomic.Int32
	pod *corev1.Pod
	err error
}

func (g *getter) get(ctx context.Context, ns, name string) (*corev1.Pod, error) {
	g.n.Add(1)
	return g.pod, g.err
}

func newSource(store cache.Store, g *getter) *Source {
	var get GetFunc
	if g != nil {
		get = g.get
	}
	s := New(store, func() bool { return true }, get)
	s.Wait = 300 * time.Millisecond
	return s
}

// TestFromCache: a pod in the cache with the UID asked about is answered
// at once, without an API read.
func TestFromCache(t *testing.T) {
	store := cache.NewStore(cache.MetaNamespaceKeyFunc)
	_ = store.Add(pod("uid-1"))
	g := &getter{}
	s := newSource(store, g)
	start := time.Now()
	a := s.Resolve(context.Background(), request("uid-1"))
	if a.Status != agentsock.StatusFound || a.UID != "uid-1" || a.Pod.Annotations["sidecar.istio.io/status"] != "{}" {
		t.Fatalf("answer %+v", a)
	}
	if g.n.Load() != 0 || time.Since(start) > 50*time.Millisecond {
		t.Fatalf("answered from the cache with %d API reads in %v", g.n.Load(), time.Since(start))
	}
}

// TestWaitsForTheWatch: a pod the informer has not seen yet is answered
// when the watch brings it, before the wait ends, without an API read.
func TestWaitsForTheWatch(t *testing.T) {
	store := cache.NewStore(cache.MetaNamespaceKeyFunc)
	g := &getter{}
	s := newSource(store, g)
	s.Wait = 5 * time.Second
	h := s.Handler()
	go func() {
		time.Sleep(50 * time.Millisecond)
		p := pod("uid-1")
		_ = store.Add(p)
		h.OnAdd(p, false)
	}()
	start := time.Now()
	a := s.Resolve(context.Background(), request("uid-1"))
	if a.Status != agentsock.StatusFound || a.UID != "uid-1" {
		t.Fatalf("answer %+v", a)
	}
	if took := time.Since(start); took > time.Second || g.n.Load() != 0 {
		t.Fatalf("took %v and %d API reads; want the watch event, no read", took, g.n.Load())
	}
}

// TestStaleUID: the cache holds an older pod of the same name (deleted and
// created again, the watch behind). Its fields are never answered for the
// new UID: after the wait the agent reads the API once; if the API has the
// new pod that is the answer, else unknown.
func TestStaleUID(t *testing.T) {
	for _, tc := range []struct {
		name   string
		api    *getter
		status string
		reason string
	}{
		{"API has the new pod", &getter{pod: pod("uid-new")}, agentsock.StatusFound, ""},
		{"API has the old pod too", &getter{pod: pod("uid-old")}, agentsock.StatusUnknown, "the API has UID uid-old"},
		{"API says not found", &getter{err: apierrors.NewNotFound(corev1.Resource("pods"), "web-1")}, agentsock.StatusUnknown, "not found"},
		{"API down", &getter{err: errors.New("connection refused")}, agentsock.StatusUnknown, "connection refused"},
		{"no API reads", nil, agentsock.StatusUnknown, "pod cache has UID uid-old"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := cache.NewStore(cache.MetaNamespaceKeyFunc)
			_ = store.Add(pod("uid-old"))
			s := newSource(store, tc.api)
			a := s.Resolve(context.Background(), request("uid-new"))
			if a.Status != tc.status || !strings.Contains(a.Reason, tc.reason) {
				t.Fatalf("answer %+v, want %s (%s)", a, tc.status, tc.reason)
			}
			if a.Status == agentsock.StatusFound && (a.UID != "uid-new" || agentsock.CheckAnswer(request("uid-new"), a) != nil) {
				t.Fatalf("answered for another UID: %+v", a)
			}
			if tc.api != nil && tc.api.n.Load() != 1 {
				t.Fatalf("%d API reads, want exactly one", tc.api.n.Load())
			}
		})
	}
}

// TestStaleThenUpdated: an update event bringing the new UID ends the
// wait with the new pod.
func TestStaleThenUpdated(t *testing.T) {
	store := cache.NewStore(cache.MetaNamespaceKeyFunc)
	old := pod("uid-old")
	_ = store.Add(old)
	g := &getter{}
	s := newSource(store, g)
	s.Wait = 5 * time.Second
	h := s.Handler()
	go func() {
		// An unrelated update first (same old UID): the wait goes on.
		time.Sleep(20 * time.Millisecond)
		h.OnUpdate(old, old)
		time.Sleep(20 * time.Millisecond)
		p := pod("uid-new")
		_ = store.Update(p)
		h.OnUpdate(old, p)
	}()
	a := s.Resolve(context.Background(), request("uid-new"))
	if a.Status != agentsock.StatusFound || a.UID != "uid-new" || g.n.Load() != 0 {
		t.Fatalf("answer %+v after %d reads", a, g.n.Load())
	}
}

// TestNotSynced: before the informer has listed once, the cache proves
// nothing: the agent reads the API at once.
func TestNotSynced(t *testing.T) {
	g := &getter{pod: pod("uid-1")}
	s := New(cache.NewStore(cache.MetaNamespaceKeyFunc), func() bool { return false }, g.get)
	start := time.Now()
	a := s.Resolve(context.Background(), request("uid-1"))
	if a.Status != agentsock.StatusFound || g.n.Load() != 1 || time.Since(start) > 100*time.Millisecond {
		t.Fatalf("answer %+v, %d reads, %v", a, g.n.Load(), time.Since(start))
	}
}

// TestWaitBoundedByCaller: the caller's deadline ends the wait and the
// read; waiters are not left behind.
func TestWaitBoundedByCaller(t *testing.T) {
	s := newSource(cache.NewStore(cache.MetaNamespaceKeyFunc), nil)
	s.Wait = time.Minute
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	a := s.Resolve(ctx, request("uid-1"))
	if a.Status != agentsock.StatusUnknown || time.Since(start) > time.Second {
		t.Fatalf("answer %+v after %v", a, time.Since(start))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.waiters) != 0 {
		t.Fatalf("waiters left: %v", s.waiters)
	}
}

// TestResolveNow: the server's fast path answers only a cached pod with
// the UID asked about; anything else (another UID, not cached, the cache
// not synced, no cache) is left to Resolve, and reads nothing.
func TestResolveNow(t *testing.T) {
	store := cache.NewStore(cache.MetaNamespaceKeyFunc)
	_ = store.Add(pod("uid-1"))
	g := &getter{pod: pod("uid-1")}
	s := newSource(store, g)
	if a, ok := s.ResolveNow(request("uid-1")); !ok || a.Status != agentsock.StatusFound || a.UID != "uid-1" || a.Pod.Name != "web-1" {
		t.Fatalf("cached pod: %+v, %v", a, ok)
	}
	for name, tc := range map[string]struct {
		s   *Source
		req agentsock.Request
	}{
		"other uid":  {s, request("uid-2")},
		"not cached": {s, agentsock.Request{V: agentsock.Version, Namespace: "shop", Name: "web-2", UID: "uid-1"}},
		"not synced": {New(store, func() bool { return false }, g.get), request("uid-1")},
		"no cache":   {New(nil, nil, g.get), request("uid-1")},
	} {
		if a, ok := tc.s.ResolveNow(tc.req); ok || a.Status != "" {
			t.Errorf("%s: %+v, %v; want nothing", name, a, ok)
		}
	}
	if g.n.Load() != 0 {
		t.Fatalf("ResolveNow read the API %d times", g.n.Load())
	}
}
