package cniplugin

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	corev1 "k8s.io/api/core/v1"

	"github.com/nftmesh/nftmesh/redirect"

	"github.com/nftmesh/nftmesh/testkit/nstest"

	"github.com/nftmesh/nftmesh/testkit/cnitest"
)

// The tests in this file play the API server with a local HTTP server, so
// they need neither root nor the kube-apiserver build: they stop before any
// rule would be programmed.

// fakeAPIRunDir is an agent run dir whose kubeconfig points at a local HTTP
// server answering every request with answer; it counts the requests.
func fakeAPIRunDir(t *testing.T, answer http.HandlerFunc) (string, *atomic.Int32) {
	t.Helper()
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		answer(w, r)
	}))
	t.Cleanup(srv.Close)
	dir := t.TempDir()
	kc := fmt.Sprintf(`{"apiVersion":"v1","kind":"Config","clusters":[{"name":"c","cluster":{"server":%q}}],`+
		`"users":[{"name":"u","user":{"token":"t"}}],"contexts":[{"name":"x","context":{"cluster":"c","user":"u"}}],"current-context":"x"}`, srv.URL)
	if err := os.WriteFile(filepath.Join(dir, "kubeconfig"), []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}
	return dir, &n
}

func servePod(t *testing.T, pod *corev1.Pod) http.HandlerFunc {
	body, err := json.Marshal(pod)
	if err != nil {
		t.Fatal(err)
	}
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
	}
}

// addVia runs ADD in-process against a fake API, with api_timeout long
// enough that a retry loop would show in the time taken.
func addVia(t *testing.T, runDir, cniArgs string) (stdout string, cerr *types.Error, took time.Duration) {
	t.Helper()
	conf := directConf(t, "1.0.0", runDir, prevResultV4("1.0.0", "198.51.100.20/24"), map[string]any{"api_timeout": "20s"})
	vars := cniVars("ADD", "/run/netns/nonexistent", "ctr-1", cniArgs)
	vars["CNI_NETNS_OVERRIDE"] = "1"
	start := time.Now()
	stdout, cerr = runSkel(t, vars, conf)
	return stdout, cerr, time.Since(start)
}

func injectedPod(t *testing.T) *corev1.Pod {
	pod := loadPod(t, "injected.yaml")
	pod.UID = "uid-1"
	return pod
}

// TestAddHugeAnnotationBounded: a 1 MiB invalid annotation fails ADD with
// a CNI error and a log line of a few KiB that name the annotation.
func TestAddHugeAnnotationBounded(t *testing.T) {
	pod := injectedPod(t)
	pod.Annotations[redirect.AnnotationExcludeOutboundIPRanges] = strings.Repeat("10.0.0.1,", 1<<20/9)
	runDir, _ := fakeAPIRunDir(t, servePod(t, pod))
	stdout, cerr, _ := addVia(t, runDir, cniArgsFor(pod, "ctr-1"))
	if cerr == nil || cerr.Code != CodeInvalidCapture {
		t.Fatalf("ADD = %v, want code %d", cerr, CodeInvalidCapture)
	}
	logged, err := os.ReadFile(filepath.Join(runDir, LogFileName))
	if err != nil {
		t.Fatal(err)
	}
	for what, text := range map[string]string{"CNI error": cerr.Error(), "stdout": stdout, "log": string(logged)} {
		if len(text) > 16<<10 {
			t.Errorf("%s is %d bytes: %.300s...", what, len(text), text)
		}
		for _, want := range []string{redirect.AnnotationExcludeOutboundIPRanges, "10.0.0.1", "116508 problems", "and 116488 more"} {
			if !strings.Contains(text, want) {
				t.Errorf("%s %.500q does not contain %q", what, text, want)
			}
		}
	}
}

// TestAddAPIAnswerNotAPod: an answer that is not the pod fails ADD at once
// with its cause and the lookup error code (not "try again later").
func TestAddAPIAnswerNotAPod(t *testing.T) {
	pod := injectedPod(t)
	other := pod.DeepCopy()
	other.Name = "someone-else"
	for _, tc := range []struct {
		name    string
		cniArgs string
		answer  http.HandlerFunc
		want    []string
	}{
		{"garbage JSON", cniArgsFor(pod, "ctr-1"), func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, `{"kind":"Pod","metadata":`)
		}, []string{pod.Name, "unexpected end of JSON input"}},
		{"another kind", cniArgsFor(pod, "ctr-1"), func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, `{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"x"}}`)
		}, []string{pod.Name, `"ConfigMap"`}},
		// Without K8S_POD_UID only the name and namespace can tell the
		// answer is for this pod.
		{"another pod, no UID", fmt.Sprintf("K8S_POD_NAMESPACE=%s;K8S_POD_NAME=%s", pod.Namespace, pod.Name), servePod(t, other),
			[]string{pod.Namespace + "/" + pod.Name, pod.Namespace + "/someone-else"}},
		{"invalid pod name", fmt.Sprintf("K8S_POD_NAMESPACE=%s;K8S_POD_NAME=a/b", pod.Namespace), servePod(t, pod),
			[]string{"invalid resource name"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			runDir, n := fakeAPIRunDir(t, tc.answer)
			_, cerr, took := addVia(t, runDir, tc.cniArgs)
			if cerr == nil {
				t.Fatal("ADD succeeded")
			}
			if cerr.Code != CodePodLookup {
				t.Errorf("code %d, want %d (%v)", cerr.Code, CodePodLookup, cerr)
			}
			for _, w := range tc.want {
				if !strings.Contains(cerr.Error(), w) {
					t.Errorf("ADD error %q does not say %s", cerr, w)
				}
			}
			if strings.Contains(cerr.Error(), "not reachable") {
				t.Errorf("ADD error %q blames the connection", cerr)
			}
			if took > 3*time.Second || n.Load() > 1 {
				t.Errorf("ADD failed after %v and %d requests, want at once", took, n.Load())
			}
		})
	}
}

// TestStderrLinesAreJSON: a lookup that meets a connection the API server
// closed mid-answer (which client-go used to log through klog as plain
// text) is retried, and stderr and the log file carry JSON lines of this
// run only.
func TestStderrLinesAreJSON(t *testing.T) {
	pod := injectedPod(t)
	good := servePod(t, pod)
	var n atomic.Int32
	runDir, _ := fakeAPIRunDir(t, func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) > 1 {
			good(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", "1000")
		w.WriteHeader(200)
		fmt.Fprint(w, `{"kind":"Pod",`)
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			conn.Close()
		}
	})
	stderr := captureStderr(t, func() { _, _, _ = addVia(t, runDir, cniArgsFor(pod, "ctr-1")) })
	logged, err := os.ReadFile(filepath.Join(runDir, LogFileName))
	if err != nil {
		t.Fatal(err)
	}
	if n.Load() != 2 {
		t.Errorf("%d requests, want the closed answer asked again once", n.Load())
	}
	for what, text := range map[string]string{"stderr": stderr, "log file": string(logged)} {
		lines := strings.Split(strings.TrimSpace(text), "\n")
		for _, line := range lines {
			var m map[string]any
			if err := json.Unmarshal([]byte(line), &m); err != nil {
				t.Errorf("%s: not a JSON line: %q", what, line)
				continue
			}
			if m["command"] != "ADD" || m["plugin"] != "nftmesh-cni" {
				t.Errorf("%s: a line without the run's fields: %q", what, line)
			}
		}
		if len(lines) != 1 {
			t.Errorf("%s: %d lines, want the one decision line:\n%s", what, len(lines), text)
		}
	}
}

// captureStderr runs fn with os.Stderr redirected to a pipe and returns
// what was written there.
func captureStderr(t *testing.T, fn func()) string {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan string)
	go func() { b, _ := io.ReadAll(r); done <- string(b) }()
	old := os.Stderr
	os.Stderr = w
	func() {
		defer func() { os.Stderr = old; w.Close() }()
		fn()
	}()
	return <-done
}

// TestChainHugeAnnotation: through libcni, the real API server (which
// stores up to 256 KiB of annotations) and the real binary, a pod whose
// capture annotation is 200 KiB of bad CIDRs fails ADD with an error of a
// few KiB naming the annotation, and the log line is as short; no rules.
func TestChainHugeAnnotation(t *testing.T) {
	needEnv(t)
	h := newHost(t, env.api, env.token)
	pod := loadPod(t, "injected.yaml")
	pod.Annotations[redirect.AnnotationExcludeOutboundIPRanges] = strings.Repeat("10.0.0.1,", 200<<10/9)
	pod = createPod(t, env.api, pod)
	_, nsPath := nstest.New(t, "cni-pod-")
	cl := h.conflist(t, "1.0.0", nil)
	rt := cnitest.RuntimeConf(pod, nsPath, "ctr-")
	_, err := h.add(cl, rt)
	if err == nil {
		t.Fatal("ADD succeeded for a pod with an invalid annotation")
	}
	if msg := err.Error(); len(msg) > 16<<10 || !strings.Contains(msg, redirect.AnnotationExcludeOutboundIPRanges) || !strings.Contains(msg, fmt.Sprintf("%d problems", 200<<10/9)) {
		t.Errorf("ADD error of %d bytes: %.400s", len(msg), msg)
	}
	logged, rerr := os.ReadFile(filepath.Join(h.runDir, LogFileName))
	if rerr != nil {
		t.Fatal(rerr)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(logged)), "\n") {
		if len(line) > 16<<10 {
			t.Errorf("log line of %d bytes: %.300s", len(line), line)
		}
	}
	assertNoRules(t, nsPath)
	_ = h.del(cl, rt)
}

// TestAddNeverShowsTheToken: an API server (or a proxy) that echoes the
// request, Authorization header included, in a non-JSON error page fails
// ADD without the token in the CNI error, on stderr or in the log file. The
// kubeconfig is YAML, as kubectl writes it (before, any YAML kubeconfig
// failed every ADD with "not a JSON kubeconfig", and the echoed token was
// in the CNI error).
func TestAddNeverShowsTheToken(t *testing.T) {
	const token = "eyJhbGciOiJSUzI1NiJ9.dG9wLXNlY3JldA.c2lnbmF0dXJl"
	pod := injectedPod(t)
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		w.Header().Set("Content-Type", "text/html")
		w.WriteHeader(http.StatusForbidden)
		fmt.Fprintf(w, "<html>proxy says no to %s with Authorization: %s</html>", r.URL.Path, r.Header.Get("Authorization"))
	}))
	t.Cleanup(srv.Close)
	runDir := t.TempDir()
	kc := fmt.Sprintf("apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: %s\nusers:\n- name: u\n  user:\n    token: %s\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n", srv.URL, token)
	if err := os.WriteFile(filepath.Join(runDir, "kubeconfig"), []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}
	var stdout string
	var cerr *types.Error
	stderr := captureStderr(t, func() { stdout, cerr, _ = addVia(t, runDir, cniArgsFor(pod, "ctr-1")) })
	if cerr == nil || cerr.Code != CodePodLookup || !strings.Contains(cerr.Error(), "proxy says no") || !strings.Contains(cerr.Error(), "Forbidden, HTTP 403") {
		t.Fatalf("ADD error %v, want the lookup's code and the page (redacted)", cerr)
	}
	if n.Load() == 0 {
		t.Fatal("no request reached the API server: the YAML kubeconfig was not read")
	}
	logged, err := os.ReadFile(filepath.Join(runDir, LogFileName))
	if err != nil {
		t.Fatal(err)
	}
	for what, text := range map[string]string{"CNI error": cerr.Error(), "stdout": stdout, "stderr": stderr, "log file": string(logged)} {
		if strings.Contains(text, token) || strings.Contains(text, "dG9wLXNlY3JldA") {
			t.Errorf("%s holds the token:\n%s", what, text)
		}
	}
}
