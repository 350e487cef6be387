package podcache

import (
	"context"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/intstr"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/nftmesh/nftmesh/podinfo/meshpod"
)

// LinkerdFacts is what a Linkerd pod's decision reads beyond the pod, from
// the agent's watches, so that its ADD makes no API request either.
type LinkerdFacts interface {
	// NamespaceAnnotations are a namespace's Linkerd override annotations,
	// false while unknown.
	NamespaceAnnotations(name string) (map[string]string, bool)
	// APIServerPorts are the default/kubernetes Service's ports and
	// numeric target ports, false while unknown.
	APIServerPorts() ([]string, bool)
}

// withLinkerdFacts fills in what m's Linkerd decision needs and the facts
// hold; what they do not hold stays unknown (the plugin then declines).
func (s *Source) withLinkerdFacts(m *meshpod.Pod) {
	if s.Linkerd == nil {
		return
	}
	if meshpod.LinkerdNeedsNamespace(m) {
		if ann, ok := s.Linkerd.NamespaceAnnotations(m.Namespace); ok {
			m.NamespaceAnnotations = ann
		}
	}
	if meshpod.LinkerdNeedsAPIServerPorts(m) {
		if ports, ok := s.Linkerd.APIServerPorts(); ok {
			m.APIServerPorts = ports
		}
	}
}

// Watches are LinkerdFacts from two informers: every namespace (one watch
// for the cluster, whatever the node; each stored as its name and its
// Linkerd override annotations only, so the cache stays small) and the
// default/kubernetes Service.
type Watches struct {
	namespaces, services cache.SharedIndexInformer
}

// NewWatches sets up the informers; Run starts them.
func NewWatches(client corev1client.CoreV1Interface) *Watches {
	nsLW := cache.NewListWatchFromClient(client.RESTClient(), "namespaces", "", fields.Everything())
	ns := cache.NewSharedIndexInformer(nsLW, &corev1.Namespace{}, 0, cache.Indexers{})
	_ = ns.SetTransform(slimNamespace)
	svcLW := cache.NewListWatchFromClient(client.RESTClient(), "services", "default",
		fields.OneTermEqualSelector("metadata.name", "kubernetes"))
	svc := cache.NewSharedIndexInformer(svcLW, &corev1.Service{}, 0, cache.Indexers{})
	return &Watches{namespaces: ns, services: svc}
}

// Run runs both informers until ctx ends.
func (w *Watches) Run(ctx context.Context) {
	go w.namespaces.RunWithContext(ctx)
	w.services.RunWithContext(ctx)
}

// slimNamespace keeps a namespace's name and Linkerd override annotations.
func slimNamespace(obj any) (any, error) {
	ns, ok := obj.(*corev1.Namespace)
	if !ok {
		return obj, nil
	}
	out := &corev1.Namespace{}
	out.Name, out.ResourceVersion = ns.Name, ns.ResourceVersion
	for _, k := range meshpod.LinkerdOverrides {
		if v, ok := ns.Annotations[k]; ok {
			if out.Annotations == nil {
				out.Annotations = map[string]string{}
			}
			out.Annotations[k] = v
		}
	}
	return out, nil
}

// NamespaceAnnotations implements LinkerdFacts.
func (w *Watches) NamespaceAnnotations(name string) (map[string]string, bool) {
	if !w.namespaces.HasSynced() {
		return nil, false
	}
	obj, ok, err := w.namespaces.GetStore().GetByKey(name)
	if err != nil || !ok {
		return nil, false
	}
	ns, ok := obj.(*corev1.Namespace)
	if !ok {
		return nil, false
	}
	if ns.Annotations == nil {
		return map[string]string{}, true
	}
	return ns.Annotations, true
}

// APIServerPorts implements LinkerdFacts.
func (w *Watches) APIServerPorts() ([]string, bool) {
	if !w.services.HasSynced() {
		return nil, false
	}
	obj, ok, err := w.services.GetStore().GetByKey("default/kubernetes")
	if err != nil || !ok {
		return nil, false
	}
	svc, ok := obj.(*corev1.Service)
	if !ok {
		return nil, false
	}
	ports := []string{}
	for _, p := range svc.Spec.Ports {
		ports = append(ports, strconv.Itoa(int(p.Port)))
		if p.TargetPort.Type == intstr.Int {
			ports = append(ports, strconv.Itoa(p.TargetPort.IntValue()))
		}
	}
	return ports, true
}
