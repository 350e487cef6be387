package podget

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/nftmesh/nftmesh/testkit/kubetest"
)

// startWithPod starts an API server holding pod shop/web-1 and writes a
// kubeconfig (returned with its token) for a ServiceAccount that may get pods.
func startWithPod(t *testing.T) (api *kubetest.Server, kubeconfig, token string) {
	t.Helper()
	api = kubetest.Start(t)
	api.EnsureNamespace(t, "shop")
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web-1", Namespace: "shop"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "web", Image: "registry.example/web:1"}}},
	}
	if _, err := api.Client().CoreV1().Pods("shop").Create(context.Background(), pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	token = api.ServiceAccount(t, "nftmesh", "reader")
	api.Grant(t, "nftmesh", "reader", true, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get"}})
	kubeconfig = filepath.Join(t.TempDir(), "reader")
	if err := api.WriteKubeconfig(kubeconfig, token); err != nil {
		t.Fatal(err)
	}
	return api, kubeconfig, token
}

// TestGetPod runs the lookup against a real API server: found, not found
// and forbidden answer at once; an unreachable server is retried until the
// timeout.
func TestGetPod(t *testing.T) {
	api, reader, token := startWithPod(t)
	ctx := context.Background()
	dir := t.TempDir()
	denied := filepath.Join(dir, "denied")
	if err := api.WriteKubeconfig(denied, api.ServiceAccount(t, "nftmesh", "nobody")); err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	c, err := NewFromFile(reader)
	if err != nil {
		t.Fatal(err)
	}
	built := time.Since(start)
	got, err := c.GetPod(ctx, "shop", "web-1", "", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	first := time.Since(start) - built
	if got.Name != "web-1" || got.Namespace != "shop" || got.UID == "" || len(got.Containers) != 1 || got.Containers[0].Name != "web" {
		t.Fatalf("got %+v", got)
	}
	t.Logf("client built in %v, first GET (TLS handshake included) %v", built, first)

	start = time.Now()
	_, err = c.GetPod(ctx, "shop", "missing", "", 5*time.Second)
	if err == nil || Retryable(err) || !strings.Contains(err.Error(), "not found") || time.Since(start) > time.Second {
		t.Fatalf("missing pod: err = %v after %v, want not found at once", err, time.Since(start))
	}

	// The same kubeconfig in YAML, as kubectl writes it: before, every
	// lookup with it failed with "not a JSON kubeconfig".
	raw, err := clientcmd.LoadFromFile(reader)
	if err != nil {
		t.Fatal(err)
	}
	yamlPath := filepath.Join(dir, "reader.yaml")
	if err := clientcmd.WriteToFile(*raw, yamlPath); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(yamlPath); len(b) == 0 || b[0] == '{' {
		t.Fatalf("not a YAML kubeconfig:\n%s", b)
	}
	yc, err := NewFromFile(yamlPath)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := yc.GetPod(ctx, "shop", "web-1", "", 5*time.Second); err != nil || got.Name != "web-1" {
		t.Fatalf("with the YAML kubeconfig: %+v, %v", got, err)
	}

	dc, err := NewFromFile(denied)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dc.GetPod(ctx, "shop", "web-1", "", 5*time.Second); err == nil || Retryable(err) || !strings.Contains(err.Error(), "forbidden") {
		t.Fatalf("denied: err = %v, want forbidden", err)
	}

	// A port nothing listens on: refused, retried until the timeout.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	unreach := filepath.Join(dir, "unreachable")
	if err := api.WriteKubeconfigHost(unreach, "https://"+addr, token); err != nil {
		t.Fatal(err)
	}
	uc, err := NewFromFile(unreach)
	if err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	_, err = uc.GetPod(ctx, "shop", "web-1", "", 700*time.Millisecond)
	took := time.Since(start)
	if err == nil || !strings.Contains(err.Error(), "not reachable") || took < 700*time.Millisecond || took > 2*time.Second {
		t.Fatalf("unreachable: err = %v after %v, want not reachable after ~700ms", err, took)
	}

	if _, err := NewFromFile(filepath.Join(dir, "nonexistent")); err == nil {
		t.Fatal("missing kubeconfig: want an error")
	}
	bad := filepath.Join(dir, "bad")
	if err := os.WriteFile(bad, []byte("clusters: 3"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := NewFromFile(bad); err == nil || !strings.Contains(err.Error(), bad) {
		t.Fatalf("invalid kubeconfig: err = %v, want one naming the file", err)
	}
}
