package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/nftmesh/nftmesh/installer"
	"github.com/nftmesh/nftmesh/installer/nodetaint"
	"github.com/nftmesh/nftmesh/testkit/kubetest"
)

// lockedBuffer is a log sink read while the untainter writes to it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// lines are the log's lines, decoded.
func (l *lockedBuffer) lines(t *testing.T) []map[string]any {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	for _, s := range strings.Split(strings.TrimSpace(l.b.String()), "\n") {
		if s == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(s), &m); err != nil {
			t.Fatalf("log line %q: %v", s, err)
		}
		out = append(out, m)
	}
	return out
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// An agent whose ServiceAccount has no rights on nodes (the chart grants
// none before Kubernetes 1.30, or rendered by helm template without
// --kube-version) says so once, with the way out, over 25 refused attempts
// (not once per ten failures); it keeps trying quietly, so rights granted
// later take the taint off, which it says too.
func TestUntaintWithoutNodeRightsSaysSoOnce(t *testing.T) {
	s := kubetest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	admin := s.Client()
	taint := corev1.Taint{Key: nodetaint.DefaultKey, Effect: corev1.TaintEffectNoSchedule}
	if _, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"},
		Spec: corev1.NodeSpec{Taints: []corev1.Taint{taint}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The agent's account, bound to nothing: every node read is forbidden.
	cfg := s.ConfigFor(s.ServiceAccount(t, "nftmesh-system", "nftmesh-agent"))
	var attempts atomic.Int32
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			if r.Method == http.MethodGet && r.URL.Path == "/api/v1/nodes/node-1" {
				attempts.Add(1)
			}
			return rt.RoundTrip(r)
		})
	})
	client := kubernetes.NewForConfigOrDie(cfg)

	defer func(b wait.Backoff) { untaintBackoff = b }(untaintBackoff)
	untaintBackoff = wait.Backoff{Duration: 5 * time.Millisecond, Factor: 2, Steps: 1 << 30, Cap: 20 * time.Millisecond}
	var logs lockedBuffer
	agentCfg := &installer.Config{RemoveNodeTaint: true, NodeName: "node-1", NodeTaintKey: nodetaint.DefaultKey}
	done := make(chan struct{})
	go func() {
		defer close(done)
		untaintNode(ctx, agentCfg, client.CoreV1(), func() error { return nil }, zerolog.New(&logs).Level(zerolog.InfoLevel))
	}()

	for attempts.Load() < 25 {
		select {
		case <-done:
			t.Fatalf("the agent stopped trying after %d refused attempts; log:\n%v", attempts.Load(), logs.lines(t))
		case <-ctx.Done():
			t.Fatalf("%d attempts in 60 s", attempts.Load())
		case <-time.After(5 * time.Millisecond):
		}
	}
	lines := logs.lines(t)
	if len(lines) != 1 {
		t.Fatalf("%d log lines over %d refused attempts, want 1:\n%v", len(lines), attempts.Load(), lines)
	}
	said := lines[0]["message"].(string) + " " + lines[0]["hint"].(string)
	for _, w := range []string{"no rights on its node", "Kubernetes 1.30", "--kube-version", "pilot.taint.enabled", "nodeTaint.enabled=false", "forbidden"} {
		if !strings.Contains(said+" "+lines[0]["error"].(string), w) {
			t.Errorf("the line does not say %q: %v", w, lines[0])
		}
	}
	if lines[0]["level"] != "warn" {
		t.Errorf("level %v, want warn", lines[0]["level"])
	}

	// Rights granted later (a helm upgrade with --kube-version): the
	// taint goes at the next attempt.
	s.Grant(t, "nftmesh-system", "nftmesh-agent", true, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "patch"}})
	select {
	case <-done:
	case <-ctx.Done():
		t.Fatal("the taint was not removed after the rights were granted")
	}
	n, err := admin.CoreV1().Nodes().Get(ctx, "node-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range n.Spec.Taints {
		if x.Key == nodetaint.DefaultKey {
			t.Errorf("taint still there: %v", n.Spec.Taints)
		}
	}
	lines = logs.lines(t)
	if len(lines) != 2 || !strings.HasPrefix(lines[1]["message"].(string), "removed the not-ready taint") {
		t.Errorf("log after the rights came, want the warning and the removal:\n%v", lines)
	}
}
