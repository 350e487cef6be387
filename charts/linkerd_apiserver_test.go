package charts

import (
	"context"
	"path/filepath"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/nftmesh/nftmesh/installer/podcache"
	"github.com/nftmesh/nftmesh/podinfo/meshpod"
	"github.com/nftmesh/nftmesh/testkit/kubetest"
)

// linkerd2-cni's values file installs the chart into a real API server, and
// the RBAC it renders is what a Linkerd pod's capture reads, with the
// chart's ServiceAccount token: the agent's namespace and Service watches
// (podcache.Watches, as the agent runs them) sync and see a namespace's
// override annotation and the API server's ports, and the plugin's own
// reads (GET of the namespace and of default/kubernetes) pass. Nothing
// more: no other Service, no Service list without the name, no write.
func TestLinkerdChartOnRealAPIServer(t *testing.T) {
	helm(t)
	file := linkerdValuesFile(t)
	s := kubetest.Start(t)
	ctx := context.Background()
	admin := s.Client()
	kc := filepath.Join(t.TempDir(), "admin.kubeconfig")
	if err := s.WriteKubeconfig(kc, s.AdminToken()); err != nil {
		t.Fatal(err)
	}
	if out, err := runHelm(t, "install", "nftmesh", chartDir, "--kubeconfig", kc, "--namespace", agentNS, "--create-namespace", "-f", file); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	waitChartRBAC(t, s)
	s.WaitAllowed(t, agentNS, "nftmesh-agent", "default", rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"services"}, ResourceNames: []string{"kubernetes"}, Verbs: []string{"get", "list", "watch"}})

	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "emojivoto", Annotations: map[string]string{meshpod.AnnotationLinkerdSkipOutboundPorts: "443", "other": "x"}}}
	if _, err := admin.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	sa := kubernetes.NewForConfigOrDie(s.ConfigFor(s.TokenFor(t, agentNS, "nftmesh-agent")))

	w := podcache.NewWatches(sa.CoreV1())
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { w.Run(wctx); close(done) }()
	defer func() { cancel(); <-done }()
	var ann map[string]string
	var ports []string
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		var okNS, okAPI bool
		ann, okNS = w.NamespaceAnnotations("emojivoto")
		ports, okAPI = w.APIServerPorts()
		if okNS && okAPI {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the agent's Linkerd watches did not sync with the chart's RBAC (namespace %v, service %v)", okNS, okAPI)
		}
	}
	if ann[meshpod.AnnotationLinkerdSkipOutboundPorts] != "443" || len(ann) != 1 || len(ports) == 0 || !slices.Contains(ports, "443") {
		t.Errorf("watches: namespace annotations %v, API server ports %v", ann, ports)
	}

	// The plugin's reads when the agent cannot answer.
	if _, err := sa.CoreV1().Namespaces().Get(ctx, "emojivoto", metav1.GetOptions{}); err != nil {
		t.Errorf("GET namespace: %v", err)
	}
	if _, err := sa.CoreV1().Services("default").Get(ctx, "kubernetes", metav1.GetOptions{}); err != nil {
		t.Errorf("GET default/kubernetes: %v", err)
	}
	forbidden := map[string]error{}
	_, forbidden["get another service"] = sa.CoreV1().Services("default").Get(ctx, "other", metav1.GetOptions{})
	_, forbidden["list services"] = sa.CoreV1().Services("default").List(ctx, metav1.ListOptions{})
	_, forbidden["get a service elsewhere"] = sa.CoreV1().Services("kube-system").Get(ctx, "kubernetes", metav1.GetOptions{})
	_, forbidden["patch a namespace"] = sa.CoreV1().Namespaces().Patch(ctx, "emojivoto", types.MergePatchType, []byte(`{"metadata":{"labels":{"x":"y"}}}`), metav1.PatchOptions{})
	forbidden["delete a namespace"] = sa.CoreV1().Namespaces().Delete(ctx, "emojivoto", metav1.DeleteOptions{})
	_, forbidden["update the kubernetes service"] = sa.CoreV1().Services("default").Patch(ctx, "kubernetes", types.MergePatchType, []byte(`{"metadata":{"labels":{"x":"y"}}}`), metav1.PatchOptions{})
	for what, err := range forbidden {
		if !apierrors.IsForbidden(err) {
			t.Errorf("%s with the chart's RBAC: %v, want forbidden", what, err)
		}
	}

	if _, err := runHelm(t, "uninstall", "nftmesh", "--kubeconfig", kc, "--namespace", agentNS); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().Roles("default").Get(ctx, "nftmesh-agent-linkerd", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the Linkerd Role is left after uninstall: %v", err)
	}
}
