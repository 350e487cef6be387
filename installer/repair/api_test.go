package repair

import (
	"context"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/nftmesh/nftmesh/installer/metrics"
	"github.com/nftmesh/nftmesh/testkit/kubetest"
	"github.com/nftmesh/nftmesh/testkit/syncbuf"
)

// switchProxy forwards a fixed loopback port to the API server and can be
// cut (listener and every open connection closed, as when the API server
// or the path to it goes away) and restored on the same port.
type switchProxy struct {
	addr, target string
	mu           sync.Mutex
	ln           net.Listener
	conns        map[net.Conn]bool
}

func newSwitchProxy(t *testing.T, target string) *switchProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &switchProxy{addr: ln.Addr().String(), target: target, conns: map[net.Conn]bool{}}
	p.serve(ln)
	t.Cleanup(p.down)
	return p
}

func (p *switchProxy) serve(ln net.Listener) {
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", p.target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns[c], p.conns[u] = true, true
			p.mu.Unlock()
			go func() { _, _ = io.Copy(u, c); u.Close() }()
			go func() { _, _ = io.Copy(c, u); c.Close() }()
		}
	}()
}

func (p *switchProxy) down() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		c.Close()
	}
	p.conns = map[net.Conn]bool{}
}

func (p *switchProxy) up(t *testing.T) {
	t.Helper()
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		t.Fatal(err)
	}
	p.serve(ln)
}

func labelRepairConfig(t *testing.T) Config {
	t.Helper()
	return testConfig(Label, "node-1")
}

func runController(t *testing.T, client kubernetes.Interface, m *metrics.Metrics, log *lockedBuf) {
	t.Helper()
	c, err := New(client.CoreV1(), labelRepairConfig(t), nil, zerolog.New(log), m)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Error(err)
			}
		case <-time.After(10 * time.Second):
			t.Error("repair controller did not stop")
		}
	})
}

func eventually(t *testing.T, what string, within time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

type lockedBuf struct{ syncbuf.Buffer }

func (l *lockedBuf) has(s string) bool {
	return strings.Contains(l.String(), s)
}

// A repair controller whose API server is a closed port says so from the
// start: reachable 0, errors counted, and an error line with the cause.
// Before, it waited for its cache in silence.
func TestRepairControllerAPIUnreachableAtStart(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	client, err := kubernetes.NewForConfig(&rest.Config{Host: "https://" + addr, TLSClientConfig: rest.TLSClientConfig{Insecure: true}})
	if err != nil {
		t.Fatal(err)
	}
	m := metrics.New()
	var log lockedBuf
	runController(t, client, m, &log)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("controller log:\n%s", log.String())
		}
	})
	eventually(t, "an error line with the cause", 10*time.Second, func() bool {
		return log.has("cannot list or watch pods") && log.has("connection refused") && log.has(addr)
	})
	if got := testutil.ToFloat64(m.RepairAPIReachable); got != 0 {
		t.Errorf("nftmesh_repair_api_reachable = %v, want 0", got)
	}
	if got := testutil.ToFloat64(m.RepairAPIErrors); got < 1 {
		t.Errorf("nftmesh_repair_api_errors_total = %v, want >= 1", got)
	}
	// One line per outage start, not one per retry.
	time.Sleep(3 * time.Second)
	if n := strings.Count(log.String(), "cannot list or watch pods"); n != 1 {
		t.Errorf("%d outage lines in 3s of retries, want 1", n)
	}
}

// Against a real API server whose connection is cut and restored: the
// gauge follows (1, 0, 1), the outage is logged with its cause and its end,
// and a broken pod created after the return is repaired.
func TestRepairControllerAPIGoesAwayAndReturns(t *testing.T) {
	api := kubetest.Start(t)
	target := strings.TrimPrefix(api.Host, "https://")
	px := newSwitchProxy(t, target)
	cfg := api.AdminConfig()
	cfg.Host = "https://" + px.addr
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	m := metrics.New()
	var log lockedBuf
	runController(t, client, m, &log)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("controller log:\n%s", log.String())
		}
	})
	reachable := func() float64 { return testutil.ToFloat64(m.RepairAPIReachable) }
	eventually(t, "reachable", 20*time.Second, func() bool { return reachable() == 1 && log.has("repair controller started") })

	px.down()
	eventually(t, "the outage noticed", 30*time.Second, func() bool {
		return reachable() == 0 && log.has("cannot list or watch pods") && log.has("connection refused")
	})
	if testutil.ToFloat64(m.RepairAPIErrors) < 1 {
		t.Error("no API error counted")
	}
	px.up(t)
	eventually(t, "the API reached again", 60*time.Second, func() bool {
		return reachable() == 1 && log.has("reaches the API server again")
	})

	ctx := context.Background()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web-1", Namespace: "default", Annotations: map[string]string{"sidecar.istio.io/status": "{}"}},
		Spec:       corev1.PodSpec{NodeName: "node-1", Containers: []corev1.Container{{Name: "app", Image: "app"}}},
	}
	pods := api.Client().CoreV1().Pods("default")
	created, err := pods.Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	st := corev1.ContainerStatus{Name: "istio-validation"}
	st.LastTerminationState.Terminated = &corev1.ContainerStateTerminated{ExitCode: 126}
	created.Status.InitContainerStatuses = []corev1.ContainerStatus{st}
	if _, err := pods.UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the pod labelled after the outage", 20*time.Second, func() bool {
		return testutil.ToFloat64(m.Repairs.WithLabelValues("label", "success")) == 1
	})
}
