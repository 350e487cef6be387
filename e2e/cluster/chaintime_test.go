package cluster

import (
	"context"
	"fmt"
	"math"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
)

const (
	chainPods  = 30            // pods per phase of the chain timings
	chainLabel = "e2e-chain"   // on every pod the chain timings create
	chainFront = "nftmesh-cni" // the plugin binary the runtime runs
)

// chainPhase is one batch of pods started one after the other, with what the
// runtime and the API showed of each.
type chainPhase struct {
	name    string
	ns      string
	created map[string]int64 // pod → CLOCK_MONOTONIC just before the create call
	running map[string]int64 // pod → when the test's watch first saw phase Running
	marked  bool             // plain pods whose app container is marked
}

// containerdPID is the node's containerd (nsenter execs it in place).
func (c *Cluster) containerdPID() (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, comp := range c.components {
		if comp.name == "containerd" && comp.cmd.Process != nil {
			return comp.cmd.Process.Pid, nil
		}
	}
	return 0, fmt.Errorf("no containerd among the node's components")
}

// chainTimings is TestChainTimings (declared in step1_chart_test.go, between
// the baseline without the chart and TestHelmInstall, so that it needs no
// chart install of its own): what the runtime sees of each plugin of the
// chain, and pod create → Running without and with nftmesh-cni in it.
//
// Each plugin exec is timed from containerd's fork of it to its exit, from
// the kernel's process events (procWatch): nothing on the node is wrapped
// or changed. bridge's time includes host-local's, which it runs.
// create → started is from the create call to the exec of the pod's app
// container process (kernel timestamp, µs); create → Running is when the
// test's watch saw the phase, which the kubelet sets after its next PLEG
// relist (1 s period) and a status write, so it moves in steps of up to 1 s.
func chainTimings(t *testing.T) {
	c := need(t)
	ctx := context.Background()
	template := c.meshPodsReady(t) // the stand-in image built before anything is timed
	t.Cleanup(func() {
		_ = c.Client.CoreV1().ServiceAccounts(meshNS).Delete(ctx, template.Spec.ServiceAccountName, metav1.DeleteOptions{})
		_ = c.Client.CoreV1().ConfigMaps(meshNS).Delete(ctx, "istio-ca-root-cert", metav1.DeleteOptions{})
	})
	if _, err := c.Client.AppsV1().DaemonSets(agentNS).Get(ctx, agentDaemonSet, metav1.GetOptions{}); err == nil {
		// Run alone after the chart: take it out for the baseline.
		if err := uninstallChart(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	pid, err := c.containerdPID()
	if err != nil {
		t.Fatal(err)
	}
	w, err := watchProcs(pid)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	t0 := time.Now()
	// The pods stay until the end: stopping 30 pods takes the runtime
	// longer than starting them, and the next phase would time the chain
	// beside their DELs.
	defer func() {
		if err := c.deletePodsWithin(ctx, meshNS, chainLabel, 3*time.Minute); err != nil {
			t.Error(err)
		}
	}()

	without := c.chainPhase(ctx, t, w, "chain-without", false, func(name string) *corev1.Pod { return chainPlainPod(name) })
	installChart(t, c)
	with := c.chainPhase(ctx, t, w, "chain-with", true, func(name string) *corev1.Pod { return chainPlainPod(name) })
	injected := c.chainPhase(ctx, t, w, "chain-mesh", true, func(name string) *corev1.Pod {
		pod := &corev1.Pod{ObjectMeta: *template.ObjectMeta.DeepCopy(), Spec: *template.Spec.DeepCopy()}
		pod.Name, pod.Namespace = name, meshNS
		grace := int64(1)
		pod.Spec.TerminationGracePeriodSeconds = &grace
		// Istio's requests would fill the node's 2 CPUs after a dozen pods.
		for i := range pod.Spec.InitContainers {
			pod.Spec.InitContainers[i].Resources = corev1.ResourceRequirements{}
		}
		for i := range pod.Spec.Containers {
			pod.Spec.Containers[i].Resources = corev1.ResourceRequirements{}
		}
		return pod
	})

	runs, starts, missed, err := w.snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if missed > 0 {
		t.Logf("%d execs of the runtime's children ended before their /proc entries were read", missed)
	}
	sw := without.summarize(t, runs, starts, false)
	sc := with.summarize(t, runs, starts, true)
	sm := injected.summarize(t, runs, starts, true)
	line := func(s phaseSummary) string {
		return fmt.Sprintf("pods=%d add_ms p50/p99 bridge=%s host-local=%s portmap=%s loopback=%s nftmesh-cni=%s ratio=%.2f",
			s.pods, s.ms("bridge"), s.ms("host-local"), s.ms("portmap"), s.ms("loopback"), s.ms(chainFront), s.ratio())
	}
	record("chain: plain %s; create-to-running p50 without=%s with=%s (%+.1f%%), p99 without=%s with=%s; API Running p50 without=%s with=%s; bridge without nftmesh p50/p99 %s",
		line(sc), ms(sw.started[0]), ms(sc.started[0]), 100*(float64(sc.started[0])/float64(sw.started[0])-1),
		ms(sw.started[1]), ms(sc.started[1]), ms(sw.apiRunning), ms(sc.apiRunning), sw.ms("bridge"))
	record("chain: injected %s", line(sm))
	record("chain: chain wall (first plugin fork → last exit) p50 without=%s with=%s injected=%s; took %.1fs",
		ms(sw.chain), ms(sc.chain), ms(sm.chain), time.Since(t0).Seconds())
}

// chainPlainPod is a pod outside the mesh whose app container is marked.
func chainPlainPod(name string) *corev1.Pod {
	pod := plainPod(name)
	pod.Spec.Containers[0].Env = append(pod.Spec.Containers[0].Env, corev1.EnvVar{Name: chainMarkerEnv, Value: name})
	return pod
}

// chainPhase creates chainPods pods from mk one after the other, each once
// the previous one's app container has started (plain pods) or its sandbox's
// nftmesh-cni ADD has ended (mesh pods, whose containers wait for Istio's
// validation), then waits for all to be Running (plain) and deletes them.
func (c *Cluster) chainPhase(ctx context.Context, t *testing.T, w *procWatch, prefix string, front bool, mk func(string) *corev1.Pod) *chainPhase {
	t.Helper()
	ph := &chainPhase{name: prefix, created: map[string]int64{}, running: map[string]int64{}}
	sel := chainLabel + "=" + prefix
	var mu sync.Mutex
	first := mk(prefix + "-0")
	ph.ns, ph.marked = first.Namespace, isMarked(first)
	// When the API first showed each pod Running, from an informer (a
	// list, then a watch resumed whenever the server ends it).
	seen := func(obj any) {
		p, ok := obj.(*corev1.Pod)
		if !ok || p.Status.Phase != corev1.PodRunning {
			return
		}
		now := monotonicNow()
		mu.Lock()
		if _, dup := ph.running[p.Name]; !dup {
			ph.running[p.Name] = now
		}
		mu.Unlock()
	}
	factory := informers.NewSharedInformerFactoryWithOptions(c.Client, 0, informers.WithNamespace(ph.ns),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = sel }))
	inf := factory.Core().V1().Pods().Informer()
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    seen,
		UpdateFunc: func(_, obj any) { seen(obj) },
	}); err != nil {
		t.Fatal(err)
	}
	stopInf := make(chan struct{})
	factory.Start(stopInf)
	defer func() { close(stopInf); factory.Shutdown() }()
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		t.Fatal("the pod informer did not sync")
	}
	// Under load the connector's events can reach the test after a short
	// plugin has exited and its /proc entry is gone: such a pod is not
	// measured whole, the API's view paces the next one, and more pods are
	// created until chainPods are (at most twice as many).
	wholeCount := 0
	for i := 0; wholeCount < chainPods && i < 2*chainPods; i++ {
		pod := mk(fmt.Sprintf("%s-%d", prefix, i))
		if pod.Labels == nil {
			pod.Labels = map[string]string{}
		}
		pod.Labels[chainLabel] = prefix
		marked := isMarked(pod)
		t0 := monotonicNow()
		if _, err := c.Client.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatalf("creating pod %s: %v", pod.Name, err)
		}
		mu.Lock()
		ph.created[pod.Name] = t0
		mu.Unlock()
		name, key := pod.Name, pod.Namespace+"/"+pod.Name
		isWhole := false
		werr := w.waitFor(ctx, 90*time.Second, name+"'s sandbox", func(runs, starts []procRun) bool {
			if isWhole = ph.whole(runs, starts, name, front, marked); isWhole {
				return true
			}
			// The API's view: the container running (plain) or the sandbox
			// up (mesh pods, whose containers wait for Istio's validation).
			obj, ok, _ := inf.GetStore().GetByKey(key)
			if !ok {
				return false
			}
			p := obj.(*corev1.Pod)
			if marked {
				return p.Status.Phase == corev1.PodRunning
			}
			return p.Status.PodIP != ""
		})
		if werr != nil {
			p, _ := c.Client.CoreV1().Pods(pod.Namespace).Get(ctx, name, metav1.GetOptions{})
			t.Fatalf("%v (%s)", werr, podState(p))
		}
		if !isWhole {
			// The runtime may still be finishing the chain's last plugin.
			time.Sleep(200 * time.Millisecond)
			runs, starts, _, _ := w.snapshot()
			isWhole = ph.whole(runs, starts, name, front, marked)
		}
		if isWhole {
			wholeCount++
		}
	}
	if isMarked(first) {
		// Plain pods: every one Running in the API.
		err := c.poll(ctx, 60*time.Second, prefix+" pods Running", func() (bool, error) {
			mu.Lock()
			defer mu.Unlock()
			return len(ph.running) >= len(ph.created), nil
		})
		if err != nil {
			// Say which and where they are; the runtime's figures still count.
			mu.Lock()
			for name := range ph.created {
				if _, ok := ph.running[name]; !ok {
					p, _ := c.Client.CoreV1().Pods(ph.ns).Get(ctx, name, metav1.GetOptions{})
					t.Errorf("%v: %s not Running: %s", err, name, podState(p))
				}
			}
			mu.Unlock()
		}
	}
	mu.Lock()
	defer mu.Unlock()
	ph.running = copyMap(ph.running)
	return ph
}

// chainPlugins are the plugins the runtime runs for each sandbox: its own
// loopback, the node's chain (bridge, which runs host-local, and portmap),
// and nftmesh-cni when front.
func chainPlugins(front bool) []string {
	p := []string{"loopback", "bridge", "host-local", "portmap"}
	if front {
		p = append(p, chainFront)
	}
	return p
}

// whole says whether every plugin's ADD for pod was seen, and its app
// container's start when marked.
func (ph *chainPhase) whole(runs, starts []procRun, pod string, front, marked bool) bool {
	got := map[string]bool{}
	for _, r := range runs {
		if r.pod == pod && r.ns == ph.ns && r.command == "ADD" {
			got[r.name] = true
		}
	}
	for _, p := range chainPlugins(front) {
		if !got[p] {
			return false
		}
	}
	if !marked {
		return true
	}
	for _, s := range starts {
		if s.marker == pod {
			return true
		}
	}
	return false
}

// isMarked says whether pod's app container carries chainMarkerEnv.
func isMarked(pod *corev1.Pod) bool {
	for _, ct := range pod.Spec.Containers {
		for _, e := range ct.Env {
			if e.Name == chainMarkerEnv {
				return true
			}
		}
	}
	return false
}

func copyMap(m map[string]int64) map[string]int64 {
	out := make(map[string]int64, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// phaseSummary is one phase's figures.
type phaseSummary struct {
	pods       int
	add        map[string][]time.Duration // plugin → ADD wall per pod
	started    [2]time.Duration           // create → app container exec, p50 and p99
	apiRunning time.Duration              // create → Running seen in the API, p50
	chain      time.Duration              // first ADD fork → last ADD exit of a pod's sandbox, p50
}

func (s phaseSummary) ms(plugin string) string {
	ds := s.add[plugin]
	if len(ds) == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f/%.1f", msf(quantile(ds, 0.5)), msf(quantile(ds, 0.99)))
}

// ratio is nftmesh-cni's ADD p50 over bridge's.
func (s phaseSummary) ratio() float64 {
	f, b := s.add[chainFront], s.add["bridge"]
	if len(f) == 0 || len(b) == 0 {
		return math.NaN()
	}
	return float64(quantile(f, 0.5)) / float64(quantile(b, 0.5))
}

// summarize checks that each pod of the phase went through the chain once
// (loopback; bridge with host-local; portmap; nftmesh-cni when withFront),
// every plugin exiting 0, and returns the figures.
func (ph *chainPhase) summarize(t *testing.T, runs, starts []procRun, withFront bool) phaseSummary {
	t.Helper()
	s := phaseSummary{add: map[string][]time.Duration{}}
	want := chainPlugins(withFront)
	var started, api, chain []time.Duration
	names := make([]string, 0, len(ph.created))
	for n := range ph.created {
		names = append(names, n)
	}
	sort.Strings(names)
	partial := 0
	for _, pod := range names {
		got := map[string][]procRun{}
		for _, r := range runs {
			if r.pod == pod && r.ns == ph.ns && r.command == "ADD" {
				got[r.name] = append(got[r.name], r)
			}
		}
		ok := true
		for _, p := range want {
			switch {
			case len(got[p]) == 0: // not seen (see chainPhase)
				ok = false
			case len(got[p]) > 1:
				t.Errorf("%s: pod %s: %d ADD runs of %s, want 1", ph.name, pod, len(got[p]), p)
				ok = false
			case got[p][0].status != 0:
				t.Errorf("%s: pod %s: %s ADD exited with status %#x", ph.name, pod, p, got[p][0].status)
				ok = false
			}
		}
		if !withFront && len(got[chainFront]) > 0 {
			t.Errorf("%s: pod %s: %s ran without the chart", ph.name, pod, chainFront)
			ok = false
		}
		if ok && ph.marked && !ph.whole(runs, starts, pod, withFront, true) {
			ok = false
		}
		if !ok {
			partial++
			continue
		}
		s.pods++
		lo, hi := int64(math.MaxInt64), int64(0)
		for name, rs := range got {
			s.add[name] = append(s.add[name], rs[0].wall())
			if name != "loopback" { // containerd runs it beside the chain
				lo, hi = min(lo, rs[0].fork), max(hi, rs[0].exit)
			}
		}
		chain = append(chain, time.Duration(hi-lo))
		for _, st := range starts {
			if st.marker == pod {
				started = append(started, time.Duration(st.exec-ph.created[pod]))
				break
			}
		}
		if r, ok := ph.running[pod]; ok {
			api = append(api, time.Duration(r-ph.created[pod]))
		}
	}
	if s.pods < chainPods {
		t.Errorf("%s: %d pods measured whole of %d created, want %d", ph.name, s.pods, len(ph.created), chainPods)
	}
	if partial > 0 {
		t.Logf("%s: %d pods not measured whole (an exec's /proc entry gone before it was read)", ph.name, partial)
	}
	if len(started) > 0 {
		s.started = [2]time.Duration{quantile(started, 0.5), quantile(started, 0.99)}
	}
	if len(api) > 0 {
		s.apiRunning = quantile(api, 0.5)
	}
	if len(chain) > 0 {
		s.chain = quantile(chain, 0.5)
	}
	t.Logf("%s: %d pods; ADD ms p50/p99: %s", ph.name, s.pods, s.describe())
	return s
}

func (s phaseSummary) describe() string {
	var parts []string
	names := make([]string, 0, len(s.add))
	for n := range s.add {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		parts = append(parts, n+"="+s.ms(n))
	}
	return strings.Join(parts, " ")
}

// quantile is the nearest-rank quantile q of ds.
func quantile(ds []time.Duration, q float64) time.Duration {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[min(max(i, 0), len(s)-1)]
}

func msf(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func ms(d time.Duration) string { return fmt.Sprintf("%.0fms", msf(d)) }
