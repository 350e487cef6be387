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

	"github.com/nftmesh/nftmesh/podinfo/agentsock"
	"github.com/nftmesh/nftmesh/testkit/kubetest"
)

// TestAgentBinaryPodSocket: the built agent, against a real API server,
// answers the plugin's question on its socket from the repair controller's
// pod watch (one watch for both), in each repair set-up: a pod of its node
// is found by its UID, a wrong UID and another node's pod are unknown, and
// the answers are counted in /metrics. Without repair the agent has no
// watch (the chart grants it "get pods" only) and answers with one read.
func TestAgentBinaryPodSocket(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("skipping: needs root (the socket answers root only)")
	}
	api := kubetest.Start(t)
	bin := buildAgent(t)
	ctx := context.Background()
	api.EnsureNamespace(t, "shop")
	mk := func(name, node string) *corev1.Pod {
		p, err := api.Client().CoreV1().Pods("shop").Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{"sidecar.istio.io/status": "{}"}},
			Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "istio-proxy", Image: "x"}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	mine, other := mk("web-1", "node-a"), mk("web-2", "node-b")

	for _, tc := range []struct {
		name string
		args []string
		from string
	}{
		{"label repair shares its watch", []string{"--repair-enabled", "--repair-label-pods"}, "the repair controller's pod watch"},
		{"narrowed repair watch", []string{"--repair-enabled", "--repair-label-pods", "--repair-label-selectors", "app=x"}, "its own watch of the node's pods"},
		{"no repair", []string{"--repair-enabled=false"}, "one API read per pod"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newFakeHost(t)
			ca, err := os.ReadFile(api.CAFile)
			if err != nil {
				t.Fatal(err)
			}
			_ = os.WriteFile(filepath.Join(h.sa, "token"), []byte(api.AdminToken()), 0o600)
			_ = os.WriteFile(filepath.Join(h.sa, "ca.crt"), ca, 0o644)
			health, metrics := freeAddr(t), freeAddr(t)
			var logs bytes.Buffer
			cmd := exec.Command(bin, append(h.args(health, metrics), append([]string{"--kube-api-server", api.Host, "--node-name", "node-a"}, tc.args...)...)...)
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
			ask := func(p *corev1.Pod, uid string) (agentsock.Answer, error) {
				actx, cancel := context.WithTimeout(ctx, agentsock.ClientTimeout)
				defer cancel()
				return agentsock.Ask(actx, agentsock.Path(h.run), agentsock.Request{V: agentsock.Version, Namespace: p.Namespace, Name: p.Name, UID: uid})
			}
			var a agentsock.Answer
			for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
				if a, err = ask(mine, string(mine.UID)); err == nil || time.Now().After(deadline) {
					break
				}
			}
			if err != nil || a.Status != agentsock.StatusFound || a.Pod.Annotations["sidecar.istio.io/status"] != "{}" {
				t.Fatalf("own node's pod: %+v, %v", a, err)
			}
			if !strings.Contains(logs.String(), tc.from) {
				t.Errorf("the agent's log does not say it answers from %s", tc.from)
			}
			start := time.Now()
			if a, err := ask(mine, "00000000-0000-0000-0000-000000000000"); err != nil || a.Status != agentsock.StatusUnknown {
				t.Fatalf("wrong UID: %+v, %v; want unknown", a, err)
			}
			if took := time.Since(start); took > agentsock.ResolveTimeout+time.Second {
				t.Fatalf("wrong UID answered after %v", took)
			}
			// Another node's pod is not in the node's watch; the one read
			// finds it, but its UID is never the one a sandbox here asks
			// about unless the pod is real: the answer is found only for it.
			if a, err := ask(other, "11111111-0000-0000-0000-000000000000"); err != nil || a.Status != agentsock.StatusUnknown {
				t.Fatalf("another node's pod with a wrong UID: %+v, %v; want unknown", a, err)
			}
			// An answer is counted just after it is sent: poll.
			for _, want := range []string{`nftmesh_agent_socket_requests_total{outcome="found"} 1`, `nftmesh_agent_socket_requests_total{outcome="unknown"} 2`} {
				for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
					_, body := httpGet("http://" + metrics + "/metrics")
					if strings.Contains(body, want) {
						break
					}
					if time.Now().After(deadline) {
						t.Errorf("/metrics lacks %s", want)
						break
					}
				}
			}
			if code, _ := httpGet("http://" + health + "/healthz"); code != http.StatusOK {
				t.Errorf("/healthz %d", code)
			}
		})
	}
}
