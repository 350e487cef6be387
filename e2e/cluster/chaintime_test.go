package cluster

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"os"
	"sort"
	"strconv"
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
	chainPods  = 30            // pods measured whole per side (and of injected pods)
	chainLabel = "e2e-chain"   // on every pod the chain timings create
	chainFront = "nftmesh-cni" // the plugin binary the runtime runs
	// chainOrder is the blocks of plain pods, A without nftmesh-cni in the
	// chain, B with it (helm install / uninstall between), each block's
	// pods deleted and gone before the next, so both sides see the same
	// node: no other measured pod on it, the agent the only difference.
	// The order is the Thue–Morse sequence: a load that drifts over the
	// run as a polynomial of degree up to 3 weighs on both sides alike, and
	// short blocks spread a passing load spike over both.
	chainOrder = "ABBABAABBAABABBA"
	// chainBlockPods are the pods measured whole per block: 8 blocks of 4
	// make 32 per side.
	chainBlockPods = 4
	// chainSettle is the pause after a block's pods are gone and after each
	// helm install or uninstall, before the next block: the DELs, the
	// agent's start or stop, and the kubelet's follow-up work end first.
	chainSettle = 3 * time.Second
	// chainIdle is how long the agent's idle CPU is read after each
	// install has settled.
	chainIdle = 2 * time.Second
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

// componentPID is the node's component name (nsenter execs it in place).
func (c *Cluster) componentPID(name string) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, comp := range c.components {
		if comp.name == name && comp.cmd.Process != nil {
			return comp.cmd.Process.Pid, nil
		}
	}
	return 0, fmt.Errorf("no %s among the node's components", name)
}

// chainBlock is one block of chainOrder: its pods and what the node spent
// while they started.
type chainBlock struct {
	with  bool
	ph    *chainPhase
	use   usageDelta
	agent []float64 // the agent's decision lines' duration_ms of the block's ADDs
}

// chainTimings is TestChainTimings (declared in step1_chart_test.go, between
// the baseline without the chart and TestHelmInstall, so that it needs no
// chart install of its own): what the runtime sees of each plugin of the
// chain, and pod create → app started without and with nftmesh-cni in it,
// in interleaved blocks (chainOrder), then Istio-injected pods.
//
// Each plugin exec is timed from containerd's fork of it to its exit, from
// the kernel's process events (procWatch): nothing on the node is wrapped
// or changed. bridge's time includes host-local's, which it runs.
// create → started is from the create call to the exec of the pod's app
// container process (kernel timestamp, µs), split into create → the first
// plugin's fork (API, scheduler, kubelet, containerd before the network),
// the network (first plugin fork → last plugin exit, loopback included),
// and the rest (containerd starts the sandbox, the kubelet creates and
// starts the app container), itself split at the runc runs. create →
// Running is when the test's watch saw the phase, which the kubelet sets
// after its next PLEG relist (1 s period) and a status write, so it moves
// in steps of up to 1 s.
func chainTimings(t *testing.T) {
	c := need(t)
	ctx := context.Background()
	template := c.meshPodsReady(t) // the stand-in image built before anything is timed
	t.Cleanup(func() {
		_ = c.Client.CoreV1().ServiceAccounts(meshNS).Delete(ctx, template.Spec.ServiceAccountName, metav1.DeleteOptions{})
		_ = c.Client.CoreV1().ConfigMaps(meshNS).Delete(ctx, "istio-ca-root-cert", metav1.DeleteOptions{})
	})
	chartOn := false
	if _, err := c.Client.AppsV1().DaemonSets(agentNS).Get(ctx, agentDaemonSet, metav1.GetOptions{}); err == nil {
		chartOn = true
	}
	pids := map[string]int{}
	for _, name := range []string{"containerd", "kubelet", "kube-apiserver"} {
		pid, err := c.componentPID(name)
		if err != nil {
			t.Fatal(err)
		}
		pids[name] = pid
	}
	w, err := watchProcs(pids["containerd"])
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	t0 := time.Now()
	// The injected pods stay until the end (the last block); each block's
	// plain pods are deleted, and gone, before the next block: the next one
	// would time the chain beside their DELs and on a fuller node.
	defer func() {
		if err := c.deletePodsWithin(ctx, meshNS, chainLabel, 3*time.Minute); err != nil {
			t.Error(err)
		}
	}()
	var idle, idleAfter usageDelta // the agent settled: after its start, after a block's pods are gone
	setChart := func(on bool) {
		if on == chartOn {
			return
		}
		if on {
			installChart(t, c)
		} else if err := uninstallChart(ctx, c); err != nil {
			t.Fatal(err)
		}
		chartOn = on
		time.Sleep(chainSettle)
		if on {
			// The agent's CPU with no pod changing, for its share per pod.
			idle = idle.add(readIdle(t, w, pids, "after its start"))
		}
	}
	var blocks []chainBlock
	for i, side := range chainOrder {
		with := side == 'B'
		setChart(with)
		name := fmt.Sprintf("chain-%s-%d", sideName(with), i)
		u0 := sampleUsage(w, pids)
		ph := c.chainPhase(ctx, t, w, name, chainBlockPods, with, chainPlainPod)
		b := chainBlock{with: with, ph: ph, use: sampleUsage(w, pids).since(u0)}
		if with {
			// Before the uninstall, which may take the agent's run dir along.
			lines, err := c.pluginLines(name + "-")
			if err != nil {
				t.Errorf("reading the plugin log: %v", err)
			}
			for _, l := range lines {
				if l.Command == "ADD" && l.RanBy == "agent" {
					b.agent = append(b.agent, l.DurationMS)
				}
			}
		}
		blocks = append(blocks, b)
		// Each block's line now: a later failure keeps them.
		runs, starts, _, _ := w.snapshot()
		s := b.ph.summarize(t, runs, starts, w.runcRuns(), with, chainBlockPods)
		t.Logf("block %d %s: %s; %s", i, sideName(with), s.brief(), b.use.describe(len(ph.created)))
		if err := c.deletePodsWithin(ctx, ph.ns, chainLabel+"="+name, 3*time.Minute); err != nil {
			t.Fatal(err)
		}
		time.Sleep(chainSettle)
		if with {
			idleAfter = idleAfter.add(readIdle(t, w, pids, "after a block"))
		}
	}
	setChart(true)
	injected := c.chainPhase(ctx, t, w, "chain-mesh", chainPods, true, func(name string) *corev1.Pod {
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
	runcs := w.runcRuns()
	var sides [2][]*chainPhase
	var agentMS [2][]float64
	for _, b := range blocks {
		k := 0
		if b.with {
			k = 1
		}
		sides[k] = append(sides[k], b.ph)
		agentMS[k] = append(agentMS[k], b.agent...)
	}
	if n := w.overrunCount(); n > 0 {
		t.Logf("the kernel dropped process events %d times (ENOBUFS, a busy machine); the pods they touched were measured again", n)
	}
	sw := mergePhases("chain-without", sides[0]).summarize(t, runs, starts, runcs, false, chainPods)
	sc := mergePhases("chain-with", sides[1]).summarize(t, runs, starts, runcs, true, chainPods)
	sm := injected.summarize(t, runs, starts, runcs, true, chainPods)
	line := func(s phaseSummary) string {
		return fmt.Sprintf("pods=%d add_ms p50/p99 bridge=%s host-local=%s portmap=%s loopback=%s nftmesh-cni=%s ratio=%.2f",
			s.pods, s.ms("bridge"), s.ms("host-local"), s.ms("portmap"), s.ms("loopback"), s.ms(chainFront), s.ratio())
	}
	record("chain: plain %s; create-to-started p50 without=%s with=%s (%+.1f%%), p99 without=%s with=%s; API Running p50 without=%s with=%s; bridge without nftmesh p50/p99 %s",
		line(sc), ms(sw.started[0]), ms(sc.started[0]), 100*(float64(sc.started[0])/float64(sw.started[0])-1),
		ms(sw.started[1]), ms(sc.started[1]), ms(sw.apiRunning), ms(sc.apiRunning), sw.ms("bridge"))
	record("chain: injected %s", line(sm))
	record("chain: chain wall (first plugin fork → last exit, loopback aside) p50 without=%s with=%s injected=%s; took %.1fs",
		ms(sw.chain), ms(sc.chain), ms(sm.chain), time.Since(t0).Seconds())
	record("chain: create-to-started parts, mean (p50) ms: without %s; with %s", sw.parts(), sc.parts())
	record("chain: nftmesh-cni for a plain pod: fork→exec p50 %.1f ms, exec→exit p50 %.1f ms (bridge fork→exec %.1f ms); the agent's ADD (decision line duration_ms) p50/p99 %s ms over %d ADDs",
		msf(quantile(sc.forkExec[chainFront], 0.5)), msf(quantile(sc.execExit[chainFront], 0.5)), msf(quantile(sc.forkExec["bridge"], 0.5)),
		floatQ(agentMS[1]), len(agentMS[1]))
	var uw, uc usageDelta
	var nw, nc int
	for _, b := range blocks {
		if b.with {
			uc, nc = uc.add(b.use), nc+len(b.ph.created)
		} else {
			uw, nw = uw.add(b.use), nw+len(b.ph.created)
		}
	}
	record("chain: node CPU while the pods started: without %s; with %s", uw.describe(nw), uc.describe(nc))
	if ca := uc.cpu["agent"]; idle.wall > 0 && idleAfter.wall > 0 && uc.wall > 0 {
		record("chain: the agent's CPU: %.1f ms/s idle after its start (%.1fs read), %.1f ms/s idle after a block (%.1fs read), %.1f ms/s while the with blocks' pods started (%.1f ms per pod)",
			msf(idle.cpu["agent"])/idle.wall.Seconds(), idle.wall.Seconds(), msf(idleAfter.cpu["agent"])/idleAfter.wall.Seconds(), idleAfter.wall.Seconds(),
			msf(ca)/uc.wall.Seconds(), msf(ca)/float64(max(nc, 1)))
	}
}

// readIdle reads the node's usage over chainIdle with no pod changing, and
// logs the agent's part.
func readIdle(t *testing.T, w *procWatch, pids map[string]int, when string) usageDelta {
	u0 := sampleUsage(w, pids)
	time.Sleep(chainIdle)
	d := sampleUsage(w, pids).since(u0)
	t.Logf("the agent (pid %d) idle %s: %.0f ms CPU in %.1fs", w.pidByExe("nftmesh-agent"), when, msf(d.cpu["agent"]), d.wall.Seconds())
	return d
}

func sideName(with bool) string {
	if with {
		return "with"
	}
	return "without"
}

// mergePhases is one side's blocks as one phase.
func mergePhases(name string, phs []*chainPhase) *chainPhase {
	m := &chainPhase{name: name, created: map[string]int64{}, running: map[string]int64{}}
	for _, p := range phs {
		m.ns, m.marked = p.ns, p.marked
		for k, v := range p.created {
			m.created[k] = v
		}
		for k, v := range p.running {
			m.running[k] = v
		}
	}
	return m
}

// chainPlainPod is a pod outside the mesh whose app container is marked.
func chainPlainPod(name string) *corev1.Pod {
	pod := plainPod(name)
	pod.Spec.Containers[0].Env = append(pod.Spec.Containers[0].Env, corev1.EnvVar{Name: chainMarkerEnv, Value: name})
	return pod
}

// chainPhase creates n pods from mk one after the other, each once
// the previous one's app container has started (plain pods) or its sandbox's
// nftmesh-cni ADD has ended (mesh pods, whose containers wait for Istio's
// validation), then waits for all to be Running (plain) and deletes them.
func (c *Cluster) chainPhase(ctx context.Context, t *testing.T, w *procWatch, prefix string, n int, front bool, mk func(string) *corev1.Pod) *chainPhase {
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
	// created until n are (at most twice as many).
	wholeCount := 0
	for i := 0; wholeCount < n && i < 2*n; i++ {
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
	forkExec   map[string][]time.Duration // plugin → the runtime's fork to the plugin's exec
	execExit   map[string][]time.Duration // plugin → its exec to its exit
	started    [2]time.Duration           // create → app container exec, p50 and p99
	apiRunning time.Duration              // create → Running seen in the API, p50
	chain      time.Duration              // first ADD fork → last ADD exit of a pod's sandbox (loopback aside), p50
	// part → per pod, the parts of create → started (partNames).
	part map[string][]time.Duration
}

// The parts of create → app started, in order; the first three add up to
// it, the last four to "after".
var partNames = []string{
	"before",  // create → the first plugin's fork: API, scheduler, kubelet, containerd before the network
	"network", // the first plugin's fork → the last plugin's exit (loopback included)
	"after",   // the last plugin's exit → the app's exec
	"sandbox", // the last plugin's exit → the sandbox's runc create: containerd's container and shim
	"pause",   // the sandbox's runc create → its runc start's exit
	"kubelet", // → the app's runc create: RunPodSandbox's return, the kubelet's CreateContainer
	"app",     // the app's runc create → the app's exec
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

// parts is the mean and p50 of each part of create → started.
func (s phaseSummary) parts() string {
	var out []string
	for _, n := range partNames {
		ds := s.part[n]
		if len(ds) == 0 {
			out = append(out, n+"=-")
			continue
		}
		var sum time.Duration
		for _, d := range ds {
			sum += d
		}
		out = append(out, fmt.Sprintf("%s=%.0f(%.0f)", n, msf(sum/time.Duration(len(ds))), msf(quantile(ds, 0.5))))
	}
	return strings.Join(out, " ")
}

// brief is a block's line: started p50 and the parts' p50.
func (s phaseSummary) brief() string {
	var out []string
	for _, n := range partNames[:3] {
		if ds := s.part[n]; len(ds) > 0 {
			out = append(out, fmt.Sprintf("%s=%.0f", n, msf(quantile(ds, 0.5))))
		}
	}
	return fmt.Sprintf("pods=%d started p50=%s bridge=%s nftmesh-cni=%s; parts p50 ms %s", s.pods, ms(s.started[0]), s.ms("bridge"), s.ms(chainFront), strings.Join(out, " "))
}

// summarize checks that each pod of the phase went through the chain once
// (loopback; bridge with host-local; portmap; nftmesh-cni when withFront),
// every plugin exiting 0, that want pods were measured whole, and returns
// the figures. runcs are the runtime's runc runs, for the parts after the
// network.
func (ph *chainPhase) summarize(t *testing.T, runs, starts, runcs []procRun, withFront bool, want int) phaseSummary {
	t.Helper()
	s := phaseSummary{add: map[string][]time.Duration{}, forkExec: map[string][]time.Duration{},
		execExit: map[string][]time.Duration{}, part: map[string][]time.Duration{}}
	plugins := chainPlugins(withFront)
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
		for _, p := range plugins {
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
		first, last := int64(math.MaxInt64), int64(0)
		for name, rs := range got {
			r := rs[0]
			s.add[name] = append(s.add[name], r.wall())
			s.forkExec[name] = append(s.forkExec[name], time.Duration(r.exec-r.fork))
			s.execExit[name] = append(s.execExit[name], time.Duration(r.exit-r.exec))
			first, last = min(first, r.fork), max(last, r.exit)
			if name != "loopback" { // containerd runs it beside the chain
				lo, hi = min(lo, r.fork), max(hi, r.exit)
			}
		}
		chain = append(chain, time.Duration(hi-lo))
		created := ph.created[pod]
		for _, st := range starts {
			if st.marker != pod {
				continue
			}
			started = append(started, time.Duration(st.exec-created))
			s.part["before"] = append(s.part["before"], time.Duration(first-created))
			s.part["network"] = append(s.part["network"], time.Duration(last-first))
			s.part["after"] = append(s.part["after"], time.Duration(st.exec-last))
			if sb, pause, app, ok := runcMarks(runcs, last, st.exec); ok {
				s.part["sandbox"] = append(s.part["sandbox"], time.Duration(sb-last))
				s.part["pause"] = append(s.part["pause"], time.Duration(pause-sb))
				s.part["kubelet"] = append(s.part["kubelet"], time.Duration(app-pause))
				s.part["app"] = append(s.part["app"], time.Duration(st.exec-app))
			}
			break
		}
		if r, ok := ph.running[pod]; ok {
			api = append(api, time.Duration(r-created))
		}
	}
	if s.pods < want {
		t.Errorf("%s: %d pods measured whole of %d created, want %d", ph.name, s.pods, len(ph.created), want)
	}
	if partial > 0 {
		t.Logf("%s: %d pods not measured whole (an exec's /proc entry gone before it was read, or its events dropped)", ph.name, partial)
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

// runcMarks finds, among the runc runs forked between a pod's last plugin
// exit (from) and its app's exec (to), the sandbox's runc create (its
// fork), the end of the sandbox's runc start (its exit) and the app's runc
// create (its fork). The pods start one after the other, so the runc runs
// in between are theirs.
func runcMarks(runcs []procRun, from, to int64) (sandbox, pause, app int64, ok bool) {
	var in []procRun
	for _, r := range runcs {
		if r.fork > from && r.fork < to {
			in = append(in, r)
		}
	}
	sort.Slice(in, func(i, j int) bool { return in[i].fork < in[j].fork })
	sbIdx, appIdx := -1, -1
	for i, r := range in {
		if r.verb != "create" {
			continue
		}
		if sbIdx < 0 {
			sbIdx = i
		}
		appIdx = i
	}
	if sbIdx < 0 || appIdx == sbIdx {
		return 0, 0, 0, false
	}
	for _, r := range in[sbIdx+1 : appIdx] {
		if r.verb == "start" {
			return in[sbIdx].fork, r.exit, in[appIdx].fork, r.exit <= in[appIdx].fork
		}
	}
	return 0, 0, 0, false
}

// floatQ is "p50/p99" of xs, or "-".
func floatQ(xs []float64) string {
	if len(xs) == 0 {
		return "-"
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	q := func(q float64) float64 { return s[min(max(int(math.Ceil(q*float64(len(s))))-1, 0), len(s)-1)] }
	return fmt.Sprintf("%.2f/%.2f", q(0.5), q(0.99))
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

// usageSample is what the node and its processes had spent at one moment.
type usageSample struct {
	at          time.Time
	busy, total uint64  // the machine's CPU jiffies (/proc/stat), busy and all
	load1       float64 // the 1-minute load average
	cpu         map[string]time.Duration
}

// usageDelta is what was spent between two samples.
type usageDelta struct {
	wall        time.Duration
	busy, total uint64
	load1       []float64 // at each sample
	cpu         map[string]time.Duration
}

// userHZ is the kernel's clock tick of /proc/<pid>/stat (USER_HZ).
const userHZ = 100

// sampleUsage reads the machine's CPU and load and the CPU time of the
// node's processes: pids by name, containerd's waited-for children (the
// plugins, the shims' start), and the agent when one runs.
func sampleUsage(w *procWatch, pids map[string]int) usageSample {
	u := usageSample{at: time.Now(), cpu: map[string]time.Duration{}}
	if b, err := os.ReadFile("/proc/stat"); err == nil {
		line, _, _ := strings.Cut(string(b), "\n")
		for i, f := range strings.Fields(line)[1:] {
			v, _ := strconv.ParseUint(f, 10, 64)
			u.total += v
			if i != 3 && i != 4 { // idle, iowait
				u.busy += v
			}
		}
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		u.load1, _ = strconv.ParseFloat(strings.Fields(string(b))[0], 64)
	}
	read := func(key string, pid int, children bool) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return
		}
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			return
		}
		f := strings.Fields(string(b[i+1:])) // from field 3 (state) on
		if len(f) < 15 {
			return
		}
		a, b1 := 11, 12 // utime, stime
		if children {
			a, b1 = 13, 14 // cutime, cstime
		}
		x, _ := strconv.ParseUint(f[a], 10, 64)
		y, _ := strconv.ParseUint(f[b1], 10, 64)
		u.cpu[key] = time.Duration(x+y) * time.Second / userHZ
	}
	for name, pid := range pids {
		read(name, pid, false)
	}
	read("containerd-children", pids["containerd"], true)
	if pid := w.pidByExe("nftmesh-agent"); pid > 0 {
		read(fmt.Sprintf("agent/%d", pid), pid, false)
	}
	return u
}

func (u usageSample) since(u0 usageSample) usageDelta {
	d := usageDelta{wall: u.at.Sub(u0.at), busy: u.busy - u0.busy, total: u.total - u0.total,
		load1: []float64{u0.load1, u.load1}, cpu: map[string]time.Duration{}}
	for k, v := range u.cpu {
		if v0, ok := u0.cpu[k]; ok {
			if strings.HasPrefix(k, "agent/") {
				k = "agent"
			}
			d.cpu[k] = v - v0
		}
	}
	return d
}

func (d usageDelta) add(e usageDelta) usageDelta {
	out := usageDelta{wall: d.wall + e.wall, busy: d.busy + e.busy, total: d.total + e.total,
		load1: append(append([]float64(nil), d.load1...), e.load1...), cpu: map[string]time.Duration{}}
	for k, v := range d.cpu {
		out.cpu[k] += v
	}
	for k, v := range e.cpu {
		out.cpu[k] += v
	}
	return out
}

// describe is the load and the CPU per pod of n pods.
func (d usageDelta) describe(n int) string {
	if n == 0 || d.total == 0 {
		return "no usage"
	}
	var load float64
	for _, l := range d.load1 {
		load += l
	}
	load /= float64(max(len(d.load1), 1))
	keys := make([]string, 0, len(d.cpu))
	for k := range d.cpu {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var per []string
	for _, k := range keys {
		per = append(per, fmt.Sprintf("%s=%.1f", k, msf(d.cpu[k])/float64(n)))
	}
	return fmt.Sprintf("%.1fs, load1 mean %.1f, machine CPUs busy %.0f%%, CPU ms per pod %s",
		d.wall.Seconds(), load, 100*float64(d.busy)/float64(d.total), strings.Join(per, " "))
}
