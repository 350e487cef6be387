package podcache

import (
	"context"
	"slices"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nftmesh/nftmesh/podinfo/meshpod"
	"github.com/nftmesh/nftmesh/testkit/kubetest"
)

// TestLinkerdWatches: against a real kube-apiserver, a Linkerd pod's answer
// carries its namespace's override annotations (only those: the cache is
// slimmed) and the API server's ports, from the watches, so the plugin run
// by the agent needs no API read; before the watches know, the answer says
// nothing (the plugin then declines to its own process).
func TestLinkerdWatches(t *testing.T) {
	s := kubetest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	_, err := s.Client().CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "emojivoto",
		Annotations: map[string]string{meshpod.AnnotationLinkerdSkipOutboundPorts: "5432", "unrelated": "x"}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w := NewWatches(s.Client().CoreV1())
	src := New(nil, nil, nil)
	src.Linkerd = w
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "emojivoto", Name: "web", UID: types.UID("u1"),
		Labels: map[string]string{meshpod.LabelLinkerdControlPlane: "destination"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "web"}, {Name: meshpod.LinkerdProxyContainer}}}}
	if a := src.answer(pod); a.Pod.NamespaceAnnotations != nil || a.Pod.APIServerPorts != nil {
		t.Fatalf("answer before the watches synced: %+v", a.Pod)
	}
	go w.Run(ctx)
	deadline := time.Now().Add(30 * time.Second)
	var a = src.answer(pod)
	for (a.Pod.NamespaceAnnotations == nil || a.Pod.APIServerPorts == nil) && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
		a = src.answer(pod)
	}
	if got := a.Pod.NamespaceAnnotations; len(got) != 1 || got[meshpod.AnnotationLinkerdSkipOutboundPorts] != "5432" {
		t.Fatalf("namespace annotations %v, want only the Linkerd override", got)
	}
	svc, err := s.Client().CoreV1().Services("default").Get(ctx, "kubernetes", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{strconv.Itoa(int(svc.Spec.Ports[0].Port)), strconv.Itoa(svc.Spec.Ports[0].TargetPort.IntValue())}
	if !slices.Equal(a.Pod.APIServerPorts, want) {
		t.Fatalf("API server ports %v, want %v", a.Pod.APIServerPorts, want)
	}
	// An Istio pod's answer gets neither.
	pod.Spec.Containers[1].Name = meshpod.ProxyContainer
	if a := src.answer(pod); a.Pod.NamespaceAnnotations != nil || a.Pod.APIServerPorts != nil {
		t.Fatalf("an Istio pod's answer carries Linkerd facts: %+v", a.Pod)
	}
}
