package repair

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// NodePods describes a watch of one node's pods as the agent caches them:
// listed a page at a time and slimmed (ListSlimPods, SlimPod). The repair
// controller runs one; without it, the agent runs one for the plugin's lookups.
type NodePods struct {
	Node                           string // spec.nodeName; required
	FieldSelectors, LabelSelectors string // narrow the watch further
	// Called, when set, is told the outcome of every list and watch call.
	Called func(ctx context.Context, err error)
}

// Informer builds the informer (not started) of w's pods through client.
func (w NodePods) Informer(client corev1client.CoreV1Interface) (cache.SharedIndexInformer, error) {
	lw, err := w.listWatch(client)
	if err != nil {
		return nil, err
	}
	// As the generated informers do: a client without streaming lists
	// (client-go's fake) gets a plain list first.
	var semantics any = client
	if !canStream(client) {
		semantics = noWatchList{}
	}
	inf := cache.NewSharedIndexInformer(cache.ToListWatcherWithWatchListSemantics(lw, semantics), &corev1.Pod{}, 0, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	// A watch event carries the whole pod.
	if err := inf.SetTransform(SlimPod); err != nil {
		return nil, fmt.Errorf("setting the pod informer's transform: %w", err)
	}
	return inf, nil
}

// listWatch is the informer's list and watch of w's pods through client.
func (w NodePods) listWatch(client corev1client.CoreV1Interface) (*cache.ListWatch, error) {
	if w.Node == "" {
		return nil, fmt.Errorf("watching a node's pods: no node name")
	}
	sel := fields.OneTermEqualSelector("spec.nodeName", w.Node)
	if w.FieldSelectors != "" {
		extra, err := fields.ParseSelector(w.FieldSelectors)
		if err != nil {
			return nil, fmt.Errorf("parsing pod field selectors %q: %w", w.FieldSelectors, err)
		}
		sel = fields.AndSelectors(sel, extra)
	}
	tweak := func(o *metav1.ListOptions) {
		o.FieldSelector = sel.String()
		o.LabelSelector = w.LabelSelectors
	}
	called := w.Called
	if called == nil {
		called = func(context.Context, error) {}
	}
	// Every list and watch call reports its outcome: the informer's watch
	// error handler would miss most failures, which its streaming list
	// retries inside the reflector.
	list := func(ctx context.Context, o metav1.ListOptions) (*corev1.PodList, error) {
		return client.Pods(metav1.NamespaceAll).List(ctx, o)
	}
	if canStream(client) {
		list = StreamedPodLister(client.RESTClient())
	}
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			tweak(&o)
			l, err := ListSlimPods(ctx, func(ctx context.Context, o metav1.ListOptions) (*corev1.PodList, error) {
				l, err := list(ctx, o)
				called(ctx, err)
				return l, err
			}, o)
			if err != nil {
				return nil, err
			}
			return l, nil
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			tweak(&o)
			wi, err := client.Pods(metav1.NamespaceAll).Watch(ctx, o)
			called(ctx, err)
			return wi, err
		},
	}
	return lw, nil
}

// canStream says whether client talks to an API server (client-go's fake
// has no REST client).
func canStream(client corev1client.CoreV1Interface) bool {
	rc, ok := client.RESTClient().(*rest.RESTClient)
	return ok && rc != nil
}

// noWatchList tells the reflector (client-go's util/watchlist) that its
// client serves no streaming lists.
type noWatchList struct{}

func (noWatchList) IsWatchListSemanticsUnSupported() bool { return true }
