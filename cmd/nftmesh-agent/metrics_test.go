package main

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftmesh/nftmesh/testkit/kubetest"
)

// waitMetrics scrapes /metrics until every line in want is in it.
func waitMetrics(t *testing.T, addr string, want ...string) string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, body := httpGet("http://" + addr + "/metrics")
		missing := ""
		for _, w := range want {
			if !strings.Contains(body, w+"\n") {
				missing = w
				break
			}
		}
		if missing == "" {
			return body
		}
		if time.Now().After(deadline) {
			t.Fatalf("/metrics never showed %q:\n%s", missing, grepLines(body, "nftmesh_", "istio_"))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func grepLines(body string, prefixes ...string) string {
	var out []string
	for _, l := range strings.Split(body, "\n") {
		for _, p := range prefixes {
			if strings.HasPrefix(l, p) {
				out = append(out, l)
				break
			}
		}
	}
	return strings.Join(out, "\n")
}

// The built agent, installed on a stand-in node and repairing (label mode)
// against a real API server, serves Istio's metric names next to ours on
// the one /metrics endpoint, with Istio's label values and the same counts:
// a dashboard or alert written for istio-cni keeps working.
func TestAgentServesIstioMetricNames(t *testing.T) {
	api := kubetest.Start(t)
	bin := buildAgent(t)
	h := newFakeHost(t)
	_ = os.WriteFile(filepath.Join(h.sa, "token"), []byte(api.AdminToken()), 0o600)
	ca, err := os.ReadFile(api.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	_ = os.WriteFile(filepath.Join(h.sa, "ca.crt"), ca, 0o644)
	src, err := os.ReadFile(filepath.Join("..", "..", "testdata", "conflists", "1-k8s.conflist"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(h.conf, "1-k8s.conflist"), src, 0o644); err != nil {
		t.Fatal(err)
	}
	// The node is born with the not-ready taint (both effects) and another.
	ctx := context.Background()
	c := api.Client()
	if _, err := c.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}, Spec: corev1.NodeSpec{Taints: []corev1.Taint{
		{Key: "cni.istio.io/not-ready", Effect: corev1.TaintEffectNoSchedule},
		{Key: "example.com/maintenance", Effect: corev1.TaintEffectNoSchedule},
		{Key: "cni.istio.io/not-ready", Effect: corev1.TaintEffectNoExecute},
	}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	health, metrics := freeAddr(t), freeAddr(t)
	var logs bytes.Buffer
	cmd := exec.Command(bin, append(h.args(health, metrics), "--kube-api-server", api.Host,
		"--repair-enabled", "--repair-label-pods", "--node-name", "node-1")...)
	cmd.Env = append(os.Environ(), "KUBERNETES_SERVICE_HOST=", "NODE_NAME=")
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("agent logs:\n%s", logs.String())
		}
	})
	deadline := time.Now().Add(20 * time.Second)
	for {
		if code, _ := httpGet("http://" + health + "/readyz"); code == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("agent never became ready")
		}
		time.Sleep(50 * time.Millisecond)
	}
	waitMetrics(t, metrics,
		`nftmesh_installs_total{result="success"} 1`,
		`istio_cni_installs_total{result="SUCCESS"} 1`,
		`nftmesh_install_ready 1`,
		`istio_cni_install_ready 1`,
		// Start-up, timed once: until ready, until the pod watch synced.
		`nftmesh_agent_ready_seconds_count 1`,
		`nftmesh_agent_pod_watch_sync_seconds_count 1`)
	// Ready: the agent took its taint off its node, and only its taint.
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		n, err := c.CoreV1().Nodes().Get(ctx, "node-1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		// The API server's TaintNodesByCondition admission adds
		// node.kubernetes.io/not-ready to a new node; that one is the
		// node lifecycle's, not ours.
		var left []string
		for _, tn := range n.Spec.Taints {
			if !strings.HasPrefix(tn.Key, "node.kubernetes.io/") {
				left = append(left, tn.Key)
			}
		}
		if len(left) == 1 && left[0] == "example.com/maintenance" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node-1 taints %+v: want only example.com/maintenance", n.Spec.Taints)
		}
	}
	if !strings.Contains(logs.String(), "removed the not-ready taint from this node") {
		t.Errorf("the agent did not log the taint's removal")
	}

	// A pod on this node whose validation container failed as Istio's
	// does when its traffic is not captured: the agent labels it.
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web-1", Namespace: "default",
			Annotations: map[string]string{"sidecar.istio.io/status": "{}"}},
		Spec: corev1.PodSpec{NodeName: "node-1", Containers: []corev1.Container{{Name: "app", Image: "app"}}},
	}
	created, err := c.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	st := corev1.ContainerStatus{Name: "istio-validation"}
	st.LastTerminationState.Terminated = &corev1.ContainerStateTerminated{ExitCode: 126, Reason: "Error"}
	created.Status.InitContainerStatuses = []corev1.ContainerStatus{st}
	if _, err := c.CoreV1().Pods("default").UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	body := waitMetrics(t, metrics,
		`nftmesh_repair_pods_total{mode="label",result="success"} 1`,
		`istio_cni_repair_pods_repaired_total{result="success",type="label"} 1`)
	got, err := c.CoreV1().Pods("default").Get(ctx, "web-1", metav1.GetOptions{})
	if err != nil || got.Labels["cni.istio.io/uninitialized"] != "true" {
		t.Errorf("pod not labelled: %v %v", got.Labels, err)
	}
	// Failures are counted under Istio's names only with Istio's values.
	for _, l := range strings.Split(grepLines(body, "istio_cni_installs_total{"), "\n") {
		if l != "" && !strings.Contains(l, `result="SUCCESS"`) {
			t.Errorf("unexpected install result: %s", l)
		}
	}
}
