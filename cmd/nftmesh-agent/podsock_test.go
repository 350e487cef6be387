package main

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftmesh/nftmesh/podinfo/agentsock"
	"github.com/nftmesh/nftmesh/testkit/kubetest"
)

// TestAgentBinaryPodSocket: the built agent, against a real API server
// (through a proxy that counts its requests), answers the plugin's question
// on its socket from a watch of its node's pods in each repair set-up: a
// pod of its node is found by its UID, a wrong UID and another node's pod
// are unknown, and the answers are counted in /metrics. Once the watch has
// listed the node's pods, answers cost no pod GET at the API server, also
// without repair (the agent's own watch; before, it read every pod once),
// and the node has one pod watch when repair's sees every pod (two only
// when repair narrows its own with selectors).
func TestAgentBinaryPodSocket(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("skipping: needs root (the socket answers root only)")
	}
	api := kubetest.Start(t)
	bin := buildAgent(t)
	ctx := context.Background()
	api.EnsureNamespace(t, "shop")
	mk := func(t *testing.T, name, node string) *corev1.Pod {
		p, err := api.Client().CoreV1().Pods("shop").Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{"sidecar.istio.io/status": "{}"}},
			Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "istio-proxy", Image: "x"}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	mine, other := mk(t, "web-1", "node-a"), mk(t, "web-2", "node-b")

	for i, tc := range []struct {
		name    string
		args    []string
		from    string
		watches int32 // pod watches the agent keeps open at once
	}{
		{"label repair shares its watch", []string{"--repair-enabled", "--repair-label-pods"}, "the repair controller's pod watch", 1},
		{"narrowed repair watch", []string{"--repair-enabled", "--repair-label-pods", "--repair-label-selectors", "app=x"}, "its own watch of the node's pods", 2},
		{"no repair", []string{"--repair-enabled=false"}, "its own watch of the node's pods", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newFakeHost(t)
			api := countAPI(t, api)
			_ = os.WriteFile(filepath.Join(h.sa, "token"), []byte(api.token), 0o600)
			_ = os.WriteFile(filepath.Join(h.sa, "ca.crt"), api.ca, 0o644)
			health, metrics := freeAddr(t), freeAddr(t)
			var logs bytes.Buffer
			cmd := exec.Command(bin, append(h.args(health, metrics), append([]string{"--kube-api-server", api.url, "--node-name", "node-a"}, tc.args...)...)...)
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
			var (
				a   agentsock.Answer
				err error
			)
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

			// Once the watch has listed the node's pods, an answer costs no
			// pod GET (before the list, the agent reads the pod once).
			for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
				before := api.podGets.Load()
				if a, err := ask(mine, string(mine.UID)); err != nil || a.Status != agentsock.StatusFound {
					t.Fatalf("own node's pod: %+v, %v", a, err)
				}
				if api.podGets.Load() == before {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("every answer still costs a pod GET at the API server (%d so far)", api.podGets.Load())
				}
			}
			// A pod created now comes through the watch within the wait.
			before := api.podGets.Load()
			fresh := mk(t, fmt.Sprintf("fresh-%d", i), "node-a")
			for range 5 {
				for _, p := range []*corev1.Pod{fresh, mine} {
					if a, err := ask(p, string(p.UID)); err != nil || a.Status != agentsock.StatusFound || a.UID != string(p.UID) {
						t.Fatalf("pod %s: %+v, %v", p.Name, a, err)
					}
				}
			}
			if n := api.podGets.Load() - before; n != 0 {
				t.Errorf("10 answers from the watch cost %d pod GETs at the API server, want 0", n)
			}
			if n := api.maxWatches.Load(); n != tc.watches {
				t.Errorf("the agent kept %d pod watches open at once, want %d", n, tc.watches)
			}
			if bad := api.unscoped(); bad != "" {
				t.Errorf("a pod list or watch not scoped to the node: %s", bad)
			}
		})
	}
}

// countedAPI is the API server behind a proxy that counts what the agent
// asks about pods.
type countedAPI struct {
	url, token string
	ca         []byte
	// podGets counts reads of one pod; maxWatches is the most pod
	// watches open at once.
	podGets, watches, maxWatches atomic.Int32

	mu     sync.Mutex
	others []string // pod lists and watches without the node's field selector
}

func countAPI(t *testing.T, api *kubetest.Server) *countedAPI {
	c := &countedAPI{token: api.AdminToken()}
	c.url, c.ca = api.Proxy(t, func(r *http.Request) func() {
		ns, rest, inNS := strings.Cut(strings.TrimPrefix(r.URL.Path, "/api/v1/namespaces/"), "/pods/")
		switch {
		case r.Method == http.MethodGet && inNS && ns != "" && rest != "" && !strings.Contains(rest, "/"):
			c.podGets.Add(1)
		case r.URL.Path == "/api/v1/pods":
			if r.URL.Query().Get("fieldSelector") != "spec.nodeName=node-a" {
				c.mu.Lock()
				c.others = append(c.others, r.URL.RawQuery)
				c.mu.Unlock()
			}
			if r.URL.Query().Get("watch") == "true" {
				n := c.watches.Add(1)
				for m := c.maxWatches.Load(); n > m && !c.maxWatches.CompareAndSwap(m, n); m = c.maxWatches.Load() {
				}
				return func() { c.watches.Add(-1) }
			}
		}
		return nil
	})
	return c
}

func (c *countedAPI) unscoped() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return strings.Join(c.others, "; ")
}

// TestMissingCapsNamesWhatTheContainerLacks: the agent runs CNI calls only
// holding what they need; run with SYS_ADMIN dropped from its bounding set
// (as the chart's delete and label repair modes leave it), it names it.
func TestMissingCapsNamesWhatTheContainerLacks(t *testing.T) {
	if os.Getenv("NFTMESH_TEST_CAPS_CHILD") != "" {
		fmt.Println(strings.Join(missingCaps(), ","))
		return
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root: drops a capability from a child's bounding set")
	}
	if _, err := exec.LookPath("setpriv"); err != nil {
		t.Skip("setpriv (util-linux) not installed")
	}
	for _, tt := range []struct {
		drop []string
		want string
	}{
		{nil, ""},
		{[]string{"-sys_admin"}, "SYS_ADMIN"},
		{[]string{"-sys_admin", "-net_admin"}, "SYS_ADMIN,NET_ADMIN"},
		{[]string{"-net_raw"}, ""},
	} {
		args := []string{"--bounding-set=" + strings.Join(append([]string{"+all"}, tt.drop...), ","), os.Args[0], "-test.run=^TestMissingCapsNamesWhatTheContainerLacks$"}
		c := exec.Command("setpriv", args...)
		c.Env = append(os.Environ(), "NFTMESH_TEST_CAPS_CHILD=1")
		out, err := c.CombinedOutput()
		if err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
		got, _, _ := strings.Cut(string(out), "\n")
		if got != tt.want {
			t.Errorf("dropping %v: missingCaps = %q, want %q", tt.drop, got, tt.want)
		}
	}
}
