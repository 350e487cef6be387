package cluster

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The conformance run (make conformance): Kubernetes' own e2e.test against
// the rig. Its inputs come from the Makefile through the environment.
const (
	conformanceEnv      = "NFTMESH_E2E_CONFORMANCE"
	conformanceNodes    = 3
	conformanceTimeout  = 150 * time.Minute // one e2e.test run, the whole set at load
	clusterDNSIP        = "10.96.0.10"
	clusterDomain       = "cluster.local"
	defaultConformance  = `\[sig-network\].*\[Conformance\]`
	conformanceMaxFocus = 512
)

// conformanceOn says whether this is a conformance run: only then do the
// nodes' kubelets name a cluster DNS (other tests' pods keep the node's
// resolv.conf).
func conformanceOn() bool { return os.Getenv(conformanceEnv) != "" }

// conformanceKubeletConfig is what a conformance run adds to every node's
// kubelet configuration: the cluster DNS the DNS specs query (CoreDNS,
// deployed by the run) and the domain e2e.test assumes.
func conformanceKubeletConfig() string {
	if !conformanceOn() {
		return ""
	}
	return "clusterDNS: [" + clusterDNSIP + "]\nclusterDomain: " + clusterDomain + "\n"
}

// conformanceConfig is one make conformance invocation's inputs.
type conformanceConfig struct {
	e2eTest string   // the e2e.test binary
	images  []string // docker-archives of the images the specs run
	focus   string   // --ginkgo.focus
	skip    string   // --ginkgo.skip, "" for none
	runs    []string // "noharm", "meshed", in order
	sidecar string   // the meshed run's sidecar: "native" or "container"
}

// readConformanceConfig reads the Makefile's environment; a missing input
// is an error naming the variable and what makes it.
func readConformanceConfig() (conformanceConfig, error) {
	var cfg conformanceConfig
	cfg.e2eTest = os.Getenv("NFTMESH_E2E_TEST_BIN")
	if st, err := os.Stat(cfg.e2eTest); cfg.e2eTest == "" || err != nil || st.Mode()&0o111 == 0 {
		return cfg, fmt.Errorf("NFTMESH_E2E_TEST_BIN=%q is not an executable e2e.test (make conformance builds it)", truncateStr(cfg.e2eTest, 200))
	}
	dir := os.Getenv("NFTMESH_CONFORMANCE_IMAGES")
	tars, _ := filepath.Glob(filepath.Join(dir, "*.tar"))
	if dir == "" || len(tars) == 0 {
		return cfg, fmt.Errorf("NFTMESH_CONFORMANCE_IMAGES=%q holds no image archive (make conformance-images writes them)", truncateStr(dir, 200))
	}
	cfg.images = tars
	cfg.focus = os.Getenv("NFTMESH_CONFORMANCE_FOCUS")
	if cfg.focus == "" {
		cfg.focus = defaultConformance
	}
	if len(cfg.focus) > conformanceMaxFocus {
		return cfg, fmt.Errorf("NFTMESH_CONFORMANCE_FOCUS is %d bytes, more than %d", len(cfg.focus), conformanceMaxFocus)
	}
	if _, err := regexp.Compile(cfg.focus); err != nil {
		return cfg, fmt.Errorf("NFTMESH_CONFORMANCE_FOCUS=%q is not a regular expression: %w", truncateStr(cfg.focus, 200), err)
	}
	cfg.skip = os.Getenv("NFTMESH_CONFORMANCE_SKIP")
	if len(cfg.skip) > conformanceMaxFocus {
		return cfg, fmt.Errorf("NFTMESH_CONFORMANCE_SKIP is %d bytes, more than %d", len(cfg.skip), conformanceMaxFocus)
	}
	if _, err := regexp.Compile(cfg.skip); err != nil {
		return cfg, fmt.Errorf("NFTMESH_CONFORMANCE_SKIP=%q is not a regular expression: %w", truncateStr(cfg.skip, 200), err)
	}
	runs := os.Getenv("NFTMESH_CONFORMANCE_RUNS")
	if runs == "" {
		runs = "noharm,meshed"
	}
	for _, r := range strings.Split(runs, ",") {
		switch r = strings.TrimSpace(r); r {
		case "noharm", "meshed":
			cfg.runs = append(cfg.runs, r)
		case "":
		default:
			return cfg, fmt.Errorf("NFTMESH_CONFORMANCE_RUNS: %q is not noharm or meshed", truncateStr(r, 40))
		}
	}
	if len(cfg.runs) == 0 {
		return cfg, errors.New("NFTMESH_CONFORMANCE_RUNS names no run: want noharm, meshed or both")
	}
	cfg.sidecar = os.Getenv("NFTMESH_CONFORMANCE_SIDECAR")
	if cfg.sidecar == "" {
		cfg.sidecar = "native"
	}
	if sidecarTemplates[cfg.sidecar] == "" {
		return cfg, fmt.Errorf("NFTMESH_CONFORMANCE_SIDECAR=%q is not native or container", truncateStr(cfg.sidecar, 40))
	}
	return cfg, nil
}

func truncateStr(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

// TestConformance runs Kubernetes' [sig-network] [Conformance] specs
// (e2e.test v1.35.4, FOCUS narrows them) on the rig grown to three nodes
// with the chart installed and CoreDNS as the cluster DNS: "noharm" with
// the test namespaces unmeshed (nftmesh-cni in every pod's chain must
// change nothing), then "meshed" with a mutating webhook labelling every
// test namespace and injecting istio-validation and the forwarding
// stand-in proxy (UID 1337, relaying both ways to the original
// destination) into every pod, so every spec's traffic goes through
// nftmesh's capture. Each run prints ginkgo's own report; a failed spec
// fails the test. docs/conformance.md has the results and their reading.
func TestConformance(t *testing.T) {
	if !conformanceOn() {
		t.Skipf("skipping: %s is not set (make conformance runs it)", conformanceEnv)
	}
	c := need(t)
	cfg, err := readConformanceConfig()
	if err != nil {
		t.Fatal(err)
	}
	c.standinReady(t)
	ctx := context.Background()
	c.conformanceCluster(ctx, t, cfg.images)

	total, err := c.e2eDryRun(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	record("conformance: focus %q (skip %q) selects %d specs", cfg.focus, cfg.skip, total)
	var summaries []string
	for _, run := range cfg.runs {
		var stop func()
		if run == "meshed" {
			if stop, err = c.startInjector(ctx, t, cfg.sidecar); err != nil {
				t.Fatal(err)
			}
		}
		before := c.specDecisions(ctx, t)
		res, err := c.e2eRun(ctx, cfg, run)
		if stop != nil {
			stop()
		}
		after := c.specDecisions(ctx, t)
		line := fmt.Sprintf("conformance %s: %s; nftmesh-cni ADDs for the specs' pods: capture %d, skip %d",
			run, res.String(total), after["capture"]-before["capture"], after["skip"]-before["skip"])
		if run == "meshed" {
			line += fmt.Sprintf("; %d pods injected (%s sidecar)", injected.Load(), cfg.sidecar)
		}
		summaries = append(summaries, line)
		record("%s", line)
		if err != nil {
			t.Errorf("%s run: %v", run, err)
		}
	}
	for _, s := range summaries {
		t.Log(s)
	}
}

// conformanceCluster makes flannel the rig's primary CNI, grows the rig to
// conformanceNodes nodes with the conformance images, installs the chart as
// they join, and deploys CoreDNS; all of it is taken away afterwards.
func (c *Cluster) conformanceCluster(ctx context.Context, t *testing.T, images []string) {
	t.Helper()
	t0 := time.Now()
	// flannel first (TestMultiNode's order): the multi-node rig's primary
	// CNI, before any pod of the pod network is on the first node.
	t.Cleanup(func() {
		if err := c.stopFlannel(context.Background()); err != nil {
			t.Errorf("stopping flannel: %v", err)
		}
	})
	if err := c.startFlannel(ctx); err != nil {
		t.Fatalf("flannel: %v\n%s", err, c.Logs(30))
	}
	record("conformance: flannel the first node's primary CNI %.2fs", time.Since(t0).Seconds())
	t0 = time.Now()
	if err := c.importImages(ctx, images); err != nil {
		t.Fatal(err)
	}
	record("conformance: %d image archives imported on %s %.2fs", len(images), nodeName, time.Since(t0).Seconds())
	var workers []*workerNode
	t.Cleanup(func() {
		if _, err := c.Kubectl(context.Background(), "delete", "--wait", "-f", c.path("conformance", "coredns.yaml")); err != nil {
			t.Error(err)
		}
		if err := uninstallChart(context.Background(), c); err != nil {
			t.Error(err)
		}
		c.removeNodes(t, workers)
	})
	t0 = time.Now()
	chartDone := make(chan error, 1)
	go func() { chartDone <- installChartOnce(c) }()
	extra := append([]string{filepath.Join(c.Dir, "images", "standin.tar")}, images...)
	workers, err := c.AddNodes(ctx, conformanceNodes-1, extra...)
	chartErr := <-chartDone
	if err != nil {
		t.Fatalf("adding nodes: %v\n%s", err, c.Logs(30))
	}
	if chartErr != nil {
		t.Fatal(chartErr)
	}
	if err := c.waitAgents(ctx, conformanceNodes); err != nil {
		t.Fatal(err)
	}
	record("conformance: %d nodes, chart installed, agents ready %.2fs", conformanceNodes, time.Since(t0).Seconds())
	t0 = time.Now()
	if err := c.deployCoreDNS(ctx); err != nil {
		t.Fatal(err)
	}
	record("conformance: CoreDNS ready at %s %.2fs", clusterDNSIP, time.Since(t0).Seconds())
}

// specDecisions counts the ADD decisions (capture, skip, ...) in every
// agent's log for pods outside the rig's own namespaces: the specs' pods.
func (c *Cluster) specDecisions(ctx context.Context, t *testing.T) map[string]int {
	t.Helper()
	pods, err := c.Client.CoreV1().Pods(agentNS).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=nftmesh-agent"})
	if err != nil {
		t.Fatal(err)
	}
	n := map[string]int{}
	for _, p := range pods.Items {
		raw, err := c.Client.CoreV1().Pods(agentNS).GetLogs(p.Name, &corev1.PodLogOptions{Container: "agent"}).DoRaw(ctx)
		if err != nil {
			t.Fatalf("reading the log of agent %s: %v", p.Name, err)
		}
		for _, line := range strings.Split(string(raw), "\n") {
			var m map[string]any
			if json.Unmarshal([]byte(line), &m) != nil || m["component"] != "cni-plugin" {
				continue
			}
			msg, _ := m["message"].(string)
			ns, _ := m["namespace"].(string)
			d, _ := m["decision"].(string)
			if d != "" && strings.HasPrefix(msg, "ADD ") && !rigNamespaces[ns] {
				n[d]++
			}
		}
	}
	return n
}

// rigNamespaces are the rig's own, not a spec's.
var rigNamespaces = map[string]bool{"default": true, "kube-system": true, agentNS: true}

// e2eArgs are e2e.test's flags for focus, its reports under dir.
func (c *Cluster) e2eArgs(cfg conformanceConfig, dir string) []string {
	args := []string{
		"--kubeconfig=" + c.AdminKubeconfig,
		"--kubectl-path=" + c.bin.kubectl,
		"--provider=skeleton",
		"--report-dir=" + dir,
		"--e2e-output-dir=" + dir,
		"--dns-domain=" + clusterDomain,
		"--num-nodes=" + strconv.Itoa(conformanceNodes),
		"--disable-log-dump",
		"--ginkgo.focus=" + cfg.focus,
		"--ginkgo.no-color",
		"--ginkgo.timeout=" + conformanceTimeout.String(),
	}
	if cfg.skip != "" {
		args = append(args, "--ginkgo.skip="+cfg.skip)
	}
	return args
}

// e2eDryRun counts the specs the focus selects.
func (c *Cluster) e2eDryRun(ctx context.Context, cfg conformanceConfig) (int, error) {
	dir := c.path("conformance", "dry-run")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return 0, err
	}
	out, err := c.run(ctx, cfg.e2eTest, append(c.e2eArgs(cfg, dir), "--ginkgo.dry-run")...)
	if err != nil {
		return 0, fmt.Errorf("e2e.test --ginkgo.dry-run: %w", err)
	}
	res := parseGinkgo(out)
	if res.ran == 0 {
		return 0, fmt.Errorf("e2e.test --ginkgo.dry-run: focus %q selects no spec:\n%s", cfg.focus, lastLines(out, 20))
	}
	return res.ran, nil
}

// e2eRun runs e2e.test for one run, its output streamed to the test's
// stdout and kept in conformance/<run>/e2e.log; the error says what failed.
func (c *Cluster) e2eRun(ctx context.Context, cfg conformanceConfig, run string) (ginkgoResult, error) {
	dir := c.path("conformance", run)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return ginkgoResult{}, err
	}
	logFile, err := os.Create(filepath.Join(dir, "e2e.log"))
	if err != nil {
		return ginkgoResult{}, err
	}
	defer logFile.Close()
	fmt.Printf("=== conformance %s: e2e.test --ginkgo.focus=%q\n", run, cfg.focus)
	ctx, cancel := context.WithTimeout(ctx, conformanceTimeout+5*time.Minute)
	defer cancel()
	t0 := time.Now()
	cmd := c.inNodeNet(cfg.e2eTest, c.e2eArgs(cfg, dir)...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+c.AdminKubeconfig, "HOME="+dir)
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	var out strings.Builder
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := sc.Text() + "\n"
			out.WriteString(line)
			_, _ = logFile.WriteString(line)
			fmt.Print(line)
		}
		_, _ = io.Copy(io.Discard, pr)
	}()
	if err := cmd.Start(); err != nil {
		pw.Close()
		<-copied
		return ginkgoResult{}, fmt.Errorf("starting e2e.test: %w", err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var waitErr error
	select {
	case waitErr = <-done:
	case <-ctx.Done():
		_ = cmd.Process.Kill()
		waitErr = fmt.Errorf("%w: %w", ctx.Err(), <-done)
	}
	pw.Close()
	<-copied
	res := parseGinkgo(out.String())
	res.took = time.Since(t0)
	if waitErr != nil {
		return res, fmt.Errorf("e2e.test: %w; failed specs: %s (log: %s)", waitErr, strings.Join(res.failedSpecs, "; "), logFile.Name())
	}
	return res, nil
}
