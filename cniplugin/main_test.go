package cniplugin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftmesh/nftmesh/netlab"
	"github.com/nftmesh/nftmesh/nft"
	"github.com/nftmesh/nftmesh/podinfo"
	"github.com/nftmesh/nftmesh/redirect"
	"github.com/nftmesh/nftmesh/testkit/kubetest"

	"github.com/nftmesh/nftmesh/testkit/nstest"
)

// The package's tests share one API server and one built plugin binary.
var env struct {
	skip      string // why root/API tests cannot run
	api       *kubetest.Server
	binDir    string // holds the freshly built nftmesh-cni
	pluginBin string
	token     string // the agent's ServiceAccount token (get pods)
}

const (
	refPluginDir = "/usr/lib/cni" // Debian's containernetworking-plugins
	agentNS      = "nftmesh"
)

func TestMain(m *testing.M) {
	os.Exit(runTests(m))
}

func runTests(m *testing.M) int {
	if os.Getenv(standinEnv) != "" {
		return standinMain()
	}
	if os.Getenv(frontEnv) != "" {
		return frontMain()
	}
	flag.Parse()
	if testing.Short() {
		env.skip = "-short: needs root, the kube-apiserver build and the reference plugins"
		return m.Run()
	}
	if os.Geteuid() != 0 {
		env.skip = "needs root (network namespaces, nftables)"
		return m.Run()
	}
	for _, p := range []string{"bridge", "host-local"} {
		if _, err := os.Stat(filepath.Join(refPluginDir, p)); err != nil {
			env.skip = fmt.Sprintf("reference plugin %s missing in %s: install containernetworking-plugins", p, refPluginDir)
			return m.Run()
		}
	}
	tmp, err := os.MkdirTemp("", "nftmesh-cni-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(tmp)
	env.binDir = filepath.Join(tmp, "bin")
	env.pluginBin = filepath.Join(env.binDir, "nftmesh-cni")
	// Built as `make build` builds them, so latency figures are the shipped
	// ones: the front the runtime runs, its standalone companion beside it.
	build := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", env.binDir+"/", "../cmd/nftmesh-cni", "../cmd/nftmesh-cni-standalone")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintf(os.Stderr, "building nftmesh-cni: %v\n", err)
		return 1
	}
	api, err := kubetest.StartServer(filepath.Join(tmp, "api"))
	if errors.Is(err, kubetest.ErrNoBinary) {
		env.skip = err.Error()
		return m.Run()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "starting the API server: %v\n", err)
		return 1
	}
	defer api.Stop()
	env.api = api
	env.token = agentToken(api)
	return m.Run()
}

// agentToken sets up what the agent's chart grants the plugin: get pods,
// cluster-wide, and nothing else.
func agentToken(api *kubetest.Server) string {
	ft := &fatalTB{}
	tok := api.ServiceAccount(ft, agentNS, "nftmesh-cni")
	api.Grant(ft, agentNS, "nftmesh-cni", true, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get"}})
	for _, ns := range []string{"shop", "kube-system", "jobs", "istio-system", "bookinfo"} {
		api.EnsureNamespace(ft, ns)
	}
	return tok
}

// fatalTB lets TestMain use the kubetest helpers, which take a testing.TB.
type fatalTB struct{ testing.TB }

func (fatalTB) Helper() {}
func (fatalTB) Fatalf(format string, args ...any) {
	panic(fmt.Sprintf(format, args...))
}

func needEnv(t testing.TB) {
	t.Helper()
	if env.skip != "" {
		t.Skipf("skipping: %s", env.skip)
	}
}

// inNetns runs fn inside the namespace at path (see netlab.Do).
func inNetns(path string, fn func() error) error { return netlab.Do(path, fn) }

// host is a throw-away "node": a netns where the bridge lives and the chain
// runs, a forwarder inside it to the API server (so the plugin reaches the
// API at 127.0.0.1 from the node's netns), and an agent run dir.
type host struct {
	netnsPath string
	runDir    string
	cacheDir  string
	dataDir   string
	apiURL    string
}

// cni returns a libcni handle for one call: a CNIConfig initialises its
// exec helper lazily without a lock, so concurrent calls get their own.
func (h *host) cni() *libcni.CNIConfig {
	return libcni.NewCNIConfigWithCacheDir([]string{env.binDir, refPluginDir}, h.cacheDir, nil)
}

func newHost(t testing.TB, api *kubetest.Server, token string) *host {
	t.Helper()
	_, path := nstest.New(t, "cni-host-")
	dir := t.TempDir()
	h := &host{
		netnsPath: path,
		runDir:    filepath.Join(dir, "run"),
		cacheDir:  filepath.Join(dir, "cache"),
		dataDir:   filepath.Join(dir, "ipam"),
	}
	for _, d := range []string{h.runDir, h.cacheDir, h.dataDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	var ln net.Listener
	if err := inNetns(path, func() (err error) {
		ln, err = net.Listen("tcp", "127.0.0.1:0")
		return err
	}); err != nil {
		t.Fatalf("listening in the host netns: %v", err)
	}
	t.Cleanup(func() { ln.Close() })
	go kubetest.Forward(ln, strings.TrimPrefix(api.Host, "https://"))
	h.apiURL = "https://" + ln.Addr().String()
	if err := api.WriteKubeconfigHost(filepath.Join(h.runDir, "kubeconfig"), h.apiURL, token); err != nil {
		t.Fatal(err)
	}
	return h
}

// pluginConf is our entry of the conflist; extra overrides fields.
func (h *host) pluginConf(extra map[string]any) map[string]any {
	c := map[string]any{
		"type":               "nftmesh-cni",
		"log_level":          "debug",
		"exclude_namespaces": []string{"kube-system"},
		"pod_namespace":      agentNS,
		"agent_run_dir":      h.runDir,
		"backend":            "nftables",
		"api_timeout":        "10s",
	}
	for k, v := range extra {
		c[k] = v
	}
	return c
}

// conflist is [bridge + host-local, nftmesh-cni] at cniVersion v.
func (h *host) conflist(t testing.TB, v string, extra map[string]any) *libcni.NetworkConfigList {
	t.Helper()
	ranges := []any{[]any{map[string]any{"subnet": "198.51.100.0/24"}}}
	list := map[string]any{
		"cniVersion": v,
		"name":       "nftmesh-test",
		"plugins": []any{
			map[string]any{
				"type":      "bridge",
				"bridge":    "cni0",
				"isGateway": true,
				"ipam":      map[string]any{"type": "host-local", "dataDir": h.dataDir, "ranges": ranges},
			},
			h.pluginConf(extra),
		},
	}
	data, err := json.Marshal(list)
	if err != nil {
		t.Fatal(err)
	}
	cl, err := libcni.ConfListFromBytes(data)
	if err != nil {
		t.Fatalf("parsing conflist: %v", err)
	}
	return cl
}

func (h *host) add(cl *libcni.NetworkConfigList, rt *libcni.RuntimeConf) (types.Result, error) {
	var res types.Result
	err := inNetns(h.netnsPath, func() (err error) {
		res, err = h.cni().AddNetworkList(context.Background(), cl, rt)
		return err
	})
	return res, err
}

func (h *host) check(cl *libcni.NetworkConfigList, rt *libcni.RuntimeConf) error {
	return inNetns(h.netnsPath, func() error { return h.cni().CheckNetworkList(context.Background(), cl, rt) })
}

func (h *host) del(cl *libcni.NetworkConfigList, rt *libcni.RuntimeConf) error {
	return inNetns(h.netnsPath, func() error { return h.cni().DelNetworkList(context.Background(), cl, rt) })
}

// loadPod reads a sample manifest and gives it a unique name.
func loadPod(t testing.TB, file string) *corev1.Pod {
	t.Helper()
	pod, err := kubetest.ReadPodFile(filepath.Join("..", "testdata", "pods", file))
	if err != nil {
		t.Fatal(err)
	}
	pod.Name = strings.TrimSuffix(pod.Name, "-") + "-" + nstest.RandHex(3)
	pod.Status = corev1.PodStatus{}
	return pod
}

var podMu sync.Mutex

// createPod stores the pod in the API (setting its UID) and deletes it at
// the end of the test.
func createPod(t testing.TB, api *kubetest.Server, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	for i := range pod.Spec.Containers {
		if pod.Spec.Containers[i].Image == "" {
			pod.Spec.Containers[i].Image = "registry.example/x:1"
		}
	}
	podMu.Lock()
	api.EnsureNamespace(t, pod.Namespace)
	podMu.Unlock()
	got, err := api.Client().CoreV1().Pods(pod.Namespace).Create(context.Background(), pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating pod %s/%s: %v", pod.Namespace, pod.Name, err)
	}
	t.Cleanup(func() {
		_ = api.Client().CoreV1().Pods(pod.Namespace).Delete(context.Background(), pod.Name, metav1.DeleteOptions{})
	})
	return got
}

// wantPlan is the plan the pod should get, built independently of the
// plugin from the pod object and the pod's address families.
func wantPlan(t testing.TB, pod *corev1.Pod, ipv6 bool) redirect.Plan {
	t.Helper()
	inMesh, reason, spec, err := podinfo.FromPod(pod)
	if err != nil || !inMesh {
		t.Fatalf("pod %s not in mesh (%s, %v)", pod.Name, reason, err)
	}
	spec.IPv6 = ipv6
	p, err := redirect.Build(spec)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func live(t testing.TB, netnsPath string) redirect.Plan {
	t.Helper()
	p, err := nft.New().List(context.Background(), netnsPath)
	if err != nil {
		t.Fatalf("listing rules in %s: %v", netnsPath, err)
	}
	return p
}

func assertNoRules(t testing.TB, netnsPath string) {
	t.Helper()
	if p := live(t, netnsPath); !p.Empty() {
		t.Fatalf("rules left in %s:\n%s", netnsPath, strings.Join(redirect.Describe(p), "\n"))
	}
}

// nftTables lists the nftables tables of a netns with the nft binary, an
// independent reader of what the plugin installed.
func nftTables(t testing.TB, netnsName string) string {
	t.Helper()
	return nstest.Sh(t, "ip", "netns", "exec", netnsName, "nft", "list", "tables")
}

// execPlugin runs the built binary the way a runtime does: CNI_* env,
// config on stdin, result or error JSON on stdout.
func execPlugin(cmd, netnsPath, containerID, cniArgs string, stdin []byte) (stdout, stderr []byte, err error) {
	c := exec.Command(env.pluginBin)
	c.Env = []string{
		"CNI_COMMAND=" + cmd,
		"CNI_CONTAINERID=" + containerID,
		"CNI_NETNS=" + netnsPath,
		"CNI_IFNAME=eth0",
		"CNI_ARGS=" + cniArgs,
		"CNI_PATH=" + env.binDir,
	}
	c.Stdin = bytes.NewReader(stdin)
	var out, errb bytes.Buffer
	c.Stdout, c.Stderr = &out, &errb
	err = c.Run()
	return out.Bytes(), errb.Bytes(), err
}

func cniArgsFor(pod *corev1.Pod, id string) string {
	return fmt.Sprintf("IgnoreUnknown=1;K8S_POD_NAMESPACE=%s;K8S_POD_NAME=%s;K8S_POD_INFRA_CONTAINER_ID=%s;K8S_POD_UID=%s", pod.Namespace, pod.Name, id, pod.UID)
}

// directConf is a single-plugin config as a runtime hands it to us in a
// chain, with a prevResult from the "primary" plugin.
func directConf(t testing.TB, version, runDir string, prevResult map[string]any, extra map[string]any) []byte {
	t.Helper()
	c := map[string]any{
		"cniVersion":    version,
		"name":          "nftmesh-test",
		"type":          "nftmesh-cni",
		"log_level":     "info",
		"agent_run_dir": runDir,
		"pod_namespace": agentNS,
		"backend":       "nftables",
		"api_timeout":   "10s",
	}
	if prevResult != nil {
		c["prevResult"] = prevResult
	}
	for k, v := range extra {
		c[k] = v
	}
	data, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// agentRunDir is a run dir whose kubeconfig reaches the API directly (for
// plugins run in the test's own netns, as kubelet runs them).
func agentRunDir(t testing.TB, token string) string {
	t.Helper()
	dir := t.TempDir()
	if err := env.api.WriteKubeconfig(filepath.Join(dir, "kubeconfig"), token); err != nil {
		t.Fatal(err)
	}
	return dir
}

func prevResultV4(version, addr string) map[string]any {
	return map[string]any{
		"cniVersion": version,
		"interfaces": []any{map[string]any{"name": "eth0", "sandbox": "/run/netns/x"}},
		"ips":        []any{map[string]any{"address": addr, "gateway": "198.51.100.1", "interface": 0}},
	}
}

func since(start time.Time) time.Duration { return time.Since(start).Round(time.Millisecond) }
