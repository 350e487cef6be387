package bench

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nftmesh/nftmesh/testkit/kubetest"
)

// The binaries under comparison, built or found once for the package.
var env struct {
	skip     string // why no benchmark of the package can run here
	noIstio  string // why the side-by-side with Istio's plugin cannot
	dir      string
	ours     string // nftmesh-cni, built as `make build` builds it
	agent    string // nftmesh-agent, likewise
	istioCNI string // Istio's istio-cni from .cache/ (make istio-cni)
	spawn    string // the spawner that measures a child's peak RSS
	// profileDir (NFTMESH_BENCH_AGENT_PROFILE) gets the agent's heap
	// profile; the agent is then built with its profiles served (the
	// nftmesh_pprof build tag), which the shipped binary is not.
	profileDir string
}

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	flag.Parse()
	switch {
	case testing.Short():
		env.skip = "-short: whole-process benchmarks need root and Istio's plugin"
		return m.Run()
	case os.Geteuid() != 0:
		env.skip = "needs root (network namespaces, nftables)"
		return m.Run()
	}
	if os.Getenv(ownNetnsEnv) != "1" {
		return inOwnNetns()
	}
	if err := exec.Command("ip", "link", "set", "lo", "up").Run(); err != nil {
		fmt.Fprintf(os.Stderr, "bringing up lo in the benchmark's own netns: %v\n", err)
		return 1
	}
	for _, bin := range []string{"ip", "nft"} {
		if _, err := exec.LookPath(bin); err != nil {
			env.skip = fmt.Sprintf("%s not installed (apt-get install iproute2 nftables)", bin)
			return m.Run()
		}
	}
	env.istioCNI = os.Getenv("NFTMESH_ISTIO_CNI")
	if env.istioCNI == "" {
		env.istioCNI, _ = filepath.Abs(filepath.Join("..", "..", ".cache", "istio-cni"))
	}
	if _, err := os.Stat(env.istioCNI); err != nil {
		env.noIstio = fmt.Sprintf("Istio's plugin not built (make istio-cni, or NFTMESH_ISTIO_CNI=path): %v", err)
	}
	dir, err := os.MkdirTemp("", "nftmesh-bench-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	env.dir = dir
	env.ours = filepath.Join(dir, "bin", "nftmesh-cni")
	env.agent = filepath.Join(dir, "bin", "nftmesh-agent")
	if d := os.Getenv("NFTMESH_BENCH_AGENT_PROFILE"); d != "" {
		env.profileDir, _ = filepath.Abs(d)
	}
	return m.Run()
}

// ownNetnsEnv marks the benchmark process that runs in its own network
// namespace.
const ownNetnsEnv = "NFTMESH_BENCH_OWN_NETNS"

// inOwnNetns runs this benchmark binary again in a network namespace of its
// own (everything: etcd, the API server, the agent, both plugins, on its
// loopback) and returns its exit code. On a node the agent learns the host's
// namespace from PID 1 in the host's /proc; where /proc/1/ns/net cannot be
// read (this project's CI-class sandboxes) it takes the nearest ancestor
// outside its own namespace, and with none it rightly serves no CNI call at
// all, so every ADD would go to the standalone plugin and AgentUp would not
// measure the agent path. Here the process that started the benchmark
// stands for the host. The machine's own namespace is not touched.
func inOwnNetns() int {
	cmd := exec.Command("unshare", append([]string{"--net", "--", os.Args[0]}, os.Args[1:]...)...)
	cmd.Env = append(os.Environ(), ownNetnsEnv+"=1")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode()
		}
		fmt.Fprintf(os.Stderr, "running the benchmark in its own network namespace: %v\n", err)
		return 1
	}
	return 0
}

// buildOnce builds the binaries the first time a benchmark needs them (a
// plain go test of the package runs none and builds nothing).
var buildOnce = sync.OnceValue(func() error {
	// Built as `make build` builds them (static, stripped), so the figures
	// are the shipped binaries'. The plugin's companion goes next to it,
	// where the agent takes it from (and the front finds it).
	args := []string{"build", "-trimpath", "-buildvcs=false", "-ldflags=-s -w -buildid="}
	if env.profileDir != "" {
		args = append(args, "-tags=nftmesh_pprof")
	}
	build := exec.Command("go", append(args, "-o", filepath.Join(env.dir, "bin")+"/", "../../cmd/nftmesh-cni", "../../cmd/nftmesh-cni-standalone", "../../cmd/nftmesh-agent", "./kubefloor")...)
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("building the binaries: %v\n%s", err, out)
	}
	src := filepath.Join(env.dir, "spawn.go")
	if err := os.WriteFile(src, []byte(spawnSource), 0o644); err != nil {
		return err
	}
	env.spawn = filepath.Join(env.dir, "bin", "spawn")
	build = exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", env.spawn, src)
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GO111MODULE=off")
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("building the spawner: %v\n%s", err, out)
	}
	return nil
})

// spawnSource is a small program that runs its arguments as a child and
// writes the child's peak RSS (KiB, wait4's ru_maxrss) to the file named by
// SPAWN_MAXRSS_FILE. A child's ru_maxrss counts the memory of the process
// that started it as well (Go starts children with vfork, and the kernel
// keeps the larger of the parent's image and the child's own across exec),
// so measured from the benchmark's own big process every child would look
// as large as the benchmark; from this one, the floor is a few MiB.
const spawnSource = `package main

import (
	"os"
	"os/exec"
	"strconv"
	"syscall"
)

func main() {
	c := exec.Command(os.Args[1], os.Args[2:]...)
	c.Stdin, c.Stdout, c.Stderr = os.Stdin, os.Stdout, os.Stderr
	err := c.Run()
	if c.ProcessState == nil {
		os.Exit(127)
	}
	ru := c.ProcessState.SysUsage().(*syscall.Rusage)
	_ = os.WriteFile(os.Getenv("SPAWN_MAXRSS_FILE"), []byte(strconv.FormatInt(ru.Maxrss, 10)), 0o644)
	if err != nil {
		os.Exit(c.ProcessState.ExitCode())
	}
}
`

// needEnv skips the benchmark unless our binaries can be built and run
// here, and Istio's plugin is there to compare with.
func needEnv(t testing.TB) {
	t.Helper()
	if env.noIstio != "" {
		t.Skipf("skipping: %s", env.noIstio)
	}
	needOurs(t)
}

// needOurs skips the benchmark unless our binaries can be built and run here.
func needOurs(t testing.TB) {
	t.Helper()
	if env.skip != "" {
		t.Skipf("skipping: %s", env.skip)
	}
	if err := buildOnce(); err != nil {
		t.Fatal(err)
	}
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// The pod's addresses: both families, so both plugins capture IPv4 and IPv6.
const (
	podIPv4 = "10.244.0.5"
	podIPv6 = "fd00:10:244::5"
)

// newPodNetns creates a named netns as a runtime leaves it for the chained
// plugins: lo up and an eth0 (one end of a veth pair here, the primary plugin's veth on
// a node) holding the pod's IPv4 and IPv6 addresses. It is deleted when the
// benchmark ends. Not timed.
func newPodNetns(t testing.TB) (name, path string) {
	t.Helper()
	name = "bench-" + randHex(5)
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v %s", name, err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	script := strings.Join([]string{
		"link set lo up",
		"link add eth0 type veth peer name peer0",
		"link set peer0 up",
		"addr add " + podIPv4 + "/24 dev eth0",
		"addr add " + podIPv6 + "/64 dev eth0 nodad",
		"link set eth0 up",
	}, "\n") + "\n"
	c := exec.Command("ip", "-n", name, "-batch", "-")
	c.Stdin = strings.NewReader(script)
	if out, err := c.CombinedOutput(); err != nil {
		t.Fatalf("setting up netns %s: %v %s", name, err, out)
	}
	return name, "/run/netns/" + name
}

// benchPod is the injected pod both plugins are asked about: Istio's
// injector output with the CNI enabled (istio-validation, istio-proxy as
// 1337, the status annotation) and ISTIO_DUAL_STACK=true on the proxy, so
// both capture both families. Each gets its own name and UID.
func benchPod(t testing.TB) *corev1.Pod {
	t.Helper()
	pod, err := kubetest.ReadPodFile(filepath.Join("..", "..", "testdata", "pods", "injected.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	pod.APIVersion, pod.Kind = "v1", "Pod"
	pod.Name = "web-" + randHex(4)
	pod.UID = types.UID(fmt.Sprintf("%s-%s-%s-%s-%s", randHex(4), randHex(2), randHex(2), randHex(2), randHex(6)))
	for i := range pod.Spec.Containers {
		if pod.Spec.Containers[i].Name == "istio-proxy" {
			pod.Spec.Containers[i].Env = append(pod.Spec.Containers[i].Env, corev1.EnvVar{Name: "ISTIO_DUAL_STACK", Value: "true"})
		}
	}
	pod.Status = corev1.PodStatus{
		Phase:  corev1.PodPending,
		PodIPs: []corev1.PodIP{{IP: podIPv4}, {IP: podIPv6}},
	}
	return pod
}

// fakeAPI is the smallest API server both plugins can look a pod up in:
// plain HTTP on 127.0.0.1, GET of a pod by namespace and name, JSON. It
// counts every request it receives, whatever it is, so requests per ADD are
// measured where they land.
type fakeAPI struct {
	url      string
	requests atomic.Int64
	mu       sync.Mutex
	pods     map[string][]byte // "ns/name" → the pod's JSON
}

var podPath = regexp.MustCompile(`^/api/v1/namespaces/([^/]+)/pods/([^/]+)$`)

func newFakeAPI(t testing.TB) *fakeAPI {
	t.Helper()
	a := &fakeAPI{pods: map[string][]byte{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(a.serve), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	a.url = "http://" + ln.Addr().String()
	return a
}

func (a *fakeAPI) add(t testing.TB, pod *corev1.Pod) {
	t.Helper()
	data, err := json.Marshal(pod)
	if err != nil {
		t.Fatal(err)
	}
	a.mu.Lock()
	a.pods[pod.Namespace+"/"+pod.Name] = data
	a.mu.Unlock()
}

func (a *fakeAPI) serve(w http.ResponseWriter, r *http.Request) {
	a.requests.Add(1)
	m := podPath.FindStringSubmatch(r.URL.Path)
	var data []byte
	if m != nil && r.Method == http.MethodGet {
		a.mu.Lock()
		data = a.pods[m[1]+"/"+m[2]]
		a.mu.Unlock()
	}
	w.Header().Set("Content-Type", "application/json")
	if data == nil {
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprintf(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404,"message":%q}`, "not found: "+r.URL.Path)
		return
	}
	_, _ = w.Write(data)
}

// writeKubeconfig writes a kubeconfig reaching server with a bearer token.
func writeKubeconfig(t testing.TB, path, server string) {
	t.Helper()
	// JSON, as the agent writes the plugin's (both plugins read it).
	text := fmt.Sprintf(`{"apiVersion": "v1", "kind": "Config",
  "clusters": [{"name": "bench", "cluster": {"server": %q}}],
  "contexts": [{"name": "bench", "context": {"cluster": "bench", "user": "bench"}}],
  "current-context": "bench",
  "users": [{"name": "bench", "user": {"token": "bench-token"}}]}
`, server)
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
}

// plugin is one contender: its binary and the config a runtime hands it.
type plugin struct {
	name   string
	bin    string
	runDir string // where its kubeconfig and log are
	conf   func(prev map[string]any) []byte
}

const agentNS = "nftmesh"

// oursPlugin is nftmesh-cni as the agent configures it (backend auto, as
// installed), its run dir holding the kubeconfig that reaches server.
func oursPlugin(t testing.TB, server string) plugin {
	t.Helper()
	runDir := filepath.Join(t.TempDir(), "nftmesh")
	if err := os.MkdirAll(runDir, 0o700); err != nil {
		t.Fatal(err)
	}
	writeKubeconfig(t, filepath.Join(runDir, "kubeconfig"), server)
	return plugin{name: "nftmesh", bin: env.ours, runDir: runDir, conf: func(prev map[string]any) []byte {
		return mustJSON(t, map[string]any{
			"cniVersion":         "1.0.0",
			"name":               "k8s-pod-network",
			"type":               "nftmesh-cni",
			"log_level":          "info",
			"exclude_namespaces": []string{"kube-system"},
			"pod_namespace":      agentNS,
			"agent_run_dir":      runDir,
			"backend":            "auto",
			"api_timeout":        "30s",
			"prevResult":         prev,
		})
	}}
}

// istioPlugin is Istio's istio-cni with what its ADD reads: its run dir
// holding istio-cni-kubeconfig (the file its install-cni writes there),
// sidecar mode (ambient off), iptables rules (not its native nftables
// mode), log level info as its chart's default.
func istioPlugin(t testing.TB, server string) plugin {
	t.Helper()
	runDir := filepath.Join(t.TempDir(), "istio-cni")
	if err := os.MkdirAll(runDir, 0o700); err != nil {
		t.Fatal(err)
	}
	writeKubeconfig(t, filepath.Join(runDir, "istio-cni-kubeconfig"), server)
	return plugin{name: "istio", bin: env.istioCNI, runDir: runDir, conf: func(prev map[string]any) []byte {
		return mustJSON(t, map[string]any{
			"cniVersion":         "1.0.0",
			"name":               "k8s-pod-network",
			"type":               "istio-cni",
			"plugin_log_level":   "info",
			"cni_agent_run_dir":  runDir,
			"ambient_enabled":    false,
			"exclude_namespaces": []string{"kube-system"},
			"pod_namespace":      "istio-system",
			"native_nftables":    false,
			"prevResult":         prev,
		})
	}}
}

func mustJSON(t testing.TB, v any) []byte {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// prevResult is what the primary plugin (bridge + host-local, say) passed on.
func prevResult(netnsPath string) map[string]any {
	return map[string]any{
		"cniVersion": "1.0.0",
		"interfaces": []any{map[string]any{"name": "eth0", "sandbox": netnsPath}},
		"ips": []any{
			map[string]any{"address": podIPv4 + "/24", "gateway": "10.244.0.1", "interface": 0},
			map[string]any{"address": podIPv6 + "/64", "gateway": "fd00:10:244::1", "interface": 0},
		},
	}
}

// run is one whole process as a runtime starts it.
type runResult struct {
	id     string    // CNI_CONTAINERID
	start  time.Time // just before the process was started
	wall   time.Duration
	maxRSS int64         // KiB, wait4's ru_maxrss: includes the benchmark's own size (see spawnSource)
	cpu    time.Duration // user + system CPU time of the plugin process
	stdout []byte
	stderr []byte
	err    error
}

// execCNI runs a plugin binary the way containerd does: CNI_* variables,
// a PATH (Istio's plugin looks its iptables binaries up in it), the config
// on stdin, the result on stdout.
func execCNI(bin, command, netnsPath, containerID, cniArgs string, stdin []byte) runResult {
	c := exec.Command(bin)
	c.Env = []string{
		"CNI_COMMAND=" + command,
		"CNI_CONTAINERID=" + containerID,
		"CNI_NETNS=" + netnsPath,
		"CNI_IFNAME=eth0",
		"CNI_ARGS=" + cniArgs,
		"CNI_PATH=" + filepath.Dir(bin),
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
	}
	c.Stdin = bytes.NewReader(stdin)
	var out, errb bytes.Buffer
	c.Stdout, c.Stderr = &out, &errb
	start := time.Now()
	err := c.Run()
	r := runResult{id: containerID, start: start, wall: time.Since(start), stdout: out.Bytes(), stderr: errb.Bytes(), err: err}
	if c.ProcessState != nil {
		if ru, ok := c.ProcessState.SysUsage().(*syscall.Rusage); ok {
			r.maxRSS = ru.Maxrss
			r.cpu = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
		}
	}
	return r
}

// peakRSS runs a CNI VERSION of bin through the spawner and returns the
// child's peak RSS in KiB.
func peakRSS(t testing.TB, bin string, stdin []byte) int64 {
	t.Helper()
	f := filepath.Join(t.TempDir(), "maxrss")
	c := exec.Command(env.spawn, bin)
	c.Env = []string{"CNI_COMMAND=VERSION", "CNI_PATH=" + filepath.Dir(bin), "PATH=/usr/sbin:/usr/bin:/sbin:/bin", "SPAWN_MAXRSS_FILE=" + f}
	c.Stdin = bytes.NewReader(stdin)
	if out, err := c.CombinedOutput(); err != nil {
		t.Fatalf("%s VERSION through the spawner: %v %s", bin, err, out)
	}
	data, err := os.ReadFile(f)
	if err != nil {
		t.Fatal(err)
	}
	v, err := strconv.ParseInt(string(data), 10, 64)
	if err != nil {
		t.Fatalf("spawner wrote %q", data)
	}
	return v
}

func cniArgs(pod *corev1.Pod, id string) string {
	return fmt.Sprintf("IgnoreUnknown=1;K8S_POD_NAMESPACE=%s;K8S_POD_NAME=%s;K8S_POD_INFRA_CONTAINER_ID=%s;K8S_POD_UID=%s",
		pod.Namespace, pod.Name, id, pod.UID)
}

// addPod runs one ADD of pod into the netns at path and fails unless the
// plugin succeeded.
func addPod(t testing.TB, p plugin, pod *corev1.Pod, netnsPath string) runResult {
	id := randHex(32)
	r := execCNI(p.bin, "ADD", netnsPath, id, cniArgs(pod, id), p.conf(prevResult(netnsPath)))
	if r.err != nil {
		t.Errorf("%s ADD of %s: %v\nstdout: %s\nstderr: %s", p.name, pod.Name, r.err, r.stdout, tail(r.stderr))
	}
	return r
}

func tail(b []byte) []byte {
	if len(b) > 4096 {
		return b[len(b)-4096:]
	}
	return b
}

// checkCaptured reads the netns's ruleset with the nft binary, a reader
// independent of both plugins, and fails unless p's capture of both
// families is there: our inet nftmesh table with the IPv4 and IPv6 rules,
// or Istio's ISTIO_* chains in the ip and ip6 nat tables (Istio's plugin
// writes through iptables-nft on this host).
func checkCaptured(t testing.TB, p plugin, netnsName string) {
	t.Helper()
	out, err := exec.Command("ip", "netns", "exec", netnsName, "nft", "list", "ruleset").CombinedOutput()
	if err != nil {
		t.Fatalf("nft list ruleset in %s: %v %s", netnsName, err, out)
	}
	rs := string(out)
	var missing []string
	want := []string{"table inet nftmesh", "redirect to :15001", "redirect to :15006", "ip6 saddr ::6", "ip saddr 127.0.0.6"}
	if p.name == "istio" {
		want = []string{"table ip nat", "table ip6 nat", "chain ISTIO_OUTPUT", "chain ISTIO_REDIRECT", "redirect to :15001", "redirect to :15006"}
	}
	for _, w := range want {
		if !strings.Contains(rs, w) {
			missing = append(missing, w)
		}
	}
	if p.name == "istio" && strings.Count(rs, "chain ISTIO_REDIRECT") < 2 {
		missing = append(missing, "ISTIO_REDIRECT in both families")
	}
	if len(missing) > 0 {
		t.Fatalf("%s: capture missing in %s (%s):\n%s", p.name, netnsName, strings.Join(missing, ", "), rs)
	}
}

// pct is the p-th percentile of ds in milliseconds (nearest rank).
func pct(ds []time.Duration, p float64) float64 {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(p*float64(len(s)) + 0.5)
	if i > 0 {
		i--
	}
	i = min(i, len(s)-1)
	return float64(s[i].Microseconds()) / 1000
}
