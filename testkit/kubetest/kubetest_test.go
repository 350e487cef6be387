package kubetest

import (
	"context"
	"path/filepath"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// TestServer proves the helper gives a working API with real RBAC: a
// ServiceAccount without a Role is forbidden, with one it reads pods, and
// a kubeconfig written for it works.
func TestServer(t *testing.T) {
	s := Start(t)
	ctx := context.Background()

	v, err := s.Client().Discovery().ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	if v.GitVersion != Version {
		t.Errorf("server version %s, want %s", v.GitVersion, Version)
	}

	s.EnsureNamespace(t, "shop")
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web-1", Namespace: "shop"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "web", Image: "registry.example/web:1"}}},
	}
	if _, err := s.Client().CoreV1().Pods("shop").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	denied := s.ServiceAccount(t, "nftmesh", "nobody")
	dc, err := kubernetes.NewForConfig(s.ConfigFor(denied))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dc.CoreV1().Pods("shop").Get(ctx, "web-1", metav1.GetOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("GET without RBAC: err = %v, want forbidden", err)
	}

	token := s.ServiceAccount(t, "nftmesh", "reader")
	s.Grant(t, "nftmesh", "reader", true, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get"}})
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := s.WriteKubeconfig(path, token); err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		t.Fatal(err)
	}
	rc, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	got, err := rc.CoreV1().Pods("shop").Get(ctx, "web-1", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("GET with a ClusterRole granting get pods: %v", err)
	}
	if got.Name != "web-1" {
		t.Fatalf("got pod %s", got.Name)
	}
	if _, err := rc.CoreV1().Pods("shop").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("LIST with only get granted: err = %v, want forbidden", err)
	}

	s.Stop()
	if _, err := rc.CoreV1().Pods("shop").Get(ctx, "web-1", metav1.GetOptions{}); err == nil {
		t.Fatal("GET after Stop succeeded")
	}
}
