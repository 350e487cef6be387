package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftmesh/nftmesh/installer/inplace"
	"github.com/nftmesh/nftmesh/testkit/istiotest"
)

// TestUpgradeAndRestartDuringPodStarts covers assertions 4 and 5: mesh pods
// are created one after the other while (a) `helm upgrade` moves the agent
// to a new image tag, (b) the agent pod is deleted and comes back and (c)
// the token the plugin uses is rotated while the agent is down: its
// ServiceAccount is recreated (every token issued for it stops
// authenticating, as in istio/istio#57438 and #38077) and the agent is
// killed without its clean-up and its pod force-deleted, so the standalone
// plugin serves ADDs with the node's stale kubeconfig until the new agent
// rewrites it (checkTokenRotation). Every
// pod must end Running with Istio's validation passing (an app container
// cannot start before it, so no mesh pod ever runs uncaptured: fail closed),
// none may stay stuck once the agent is back, and every read of the plugin
// binary during all of it is the complete binary (replaced atomically, never
// seen half-written). How long the node had no plugin entry or binary, and
// how many pods needed a second validation run (repaired), are reported.
//
// Pods created while the node has no plugin are repaired in place by the
// new agent, and the node's /proc then also shows the harness's stranger
// namespace holding every pod address (startDecoy): each repair must have
// found the pod by its cgroup, never by its address alone.
func TestUpgradeAndRestartDuringPodStarts(t *testing.T) {
	c := need(t)
	pilotAgent, err := istiotest.PilotAgent()
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal(err)
		}
		t.Skipf("skipping: %v", err)
	}
	ctx := context.Background()
	installChart(t, c)
	if err := c.importStandinImage(ctx, pilotAgent); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.deleteMesh(t) })
	template := raceDeployment(t, "churn").Spec.Template
	if err := c.meshPrerequisites(ctx, template.Spec.ServiceAccountName); err != nil {
		t.Fatal(err)
	}
	want, err := fileInImage(imageArchive, "/opt/cni/bin/nftmesh-cni")
	if err != nil {
		t.Fatal(err)
	}

	alogs, err := c.followAgentLogs(filepath.Join(c.Dir, "churn-agent-logs"))
	if err != nil {
		t.Fatal(err)
	}
	stuck := map[string]string{} // pod → kubectl describe at the deadline

	// Watch the node's plugin binary and conflist entry meanwhile.
	w := &nodeWatch{bin: filepath.Join(c.CNIBinDir, "nftmesh-cni"), conf: c.PrimaryConflist, want: want}
	stopWatch := make(chan struct{})
	var watchDone sync.WaitGroup
	watchDone.Add(1)
	go func() { defer watchDone.Done(); w.run(stopWatch) }()

	// Create mesh pods one after the other until told to stop. Each is
	// checked as soon as it runs and then deleted, so that at most
	// maxInFlight of them hold the node's CPU requests at a time: every pod
	// must end Running with validation passing within the bound.
	const maxInFlight = 6
	var (
		mu       sync.Mutex
		created  int
		repaired int
		failures []string
		starts   []time.Duration // create → Running with validation passing
		checks   sync.WaitGroup
	)
	slots := make(chan struct{}, maxInFlight)
	stopCreate := make(chan struct{})
	// launch creates one mesh pod and checks it in the background;
	// release runs when the check is done.
	launch := func(name string, release func()) bool {
		pod := &corev1.Pod{ObjectMeta: *template.ObjectMeta.DeepCopy(), Spec: *template.Spec.DeepCopy()}
		pod.Name = name
		pod.Namespace = meshNS
		pod.Labels[meshLabel] = "true"
		t0 := time.Now()
		if _, err := c.Client.CoreV1().Pods(meshNS).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			mu.Lock()
			failures = append(failures, fmt.Sprintf("creating %s: %v", pod.Name, err))
			mu.Unlock()
			release()
			return false
		}
		mu.Lock()
		created++
		mu.Unlock()
		checks.Add(1)
		go func(name string, t0 time.Time) {
			defer checks.Done()
			defer release()
			restarts, err := c.waitCaptured(ctx, name)
			took := time.Since(t0)
			var described string
			if err != nil {
				described = c.describePod(ctx, meshNS, name)
			}
			mu.Lock()
			if err != nil {
				failures = append(failures, err.Error())
				stuck[name] = described
			} else {
				starts = append(starts, took)
			}
			if err == nil && restarts > 0 {
				repaired++
				t.Logf("%s: istio-validation ran %d times, Running and captured after %.1fs (started while the node had no plugin; repaired in place)", name, restarts+1, took.Seconds())
			}
			mu.Unlock()
			if err := c.deletePodAndWait(ctx, name); err != nil {
				mu.Lock()
				failures = append(failures, err.Error())
				mu.Unlock()
			}
		}(pod.Name, t0)
		return true
	}
	var createDone sync.WaitGroup
	createDone.Add(1)
	go func() {
		defer createDone.Done()
		for i := 0; ; i++ {
			select {
			case <-stopCreate:
				return
			case slots <- struct{}{}:
			}
			if !launch(fmt.Sprintf("churn-%d", i), func() { <-slots }) {
				return
			}
			time.Sleep(500 * time.Millisecond)
		}
	}()

	time.Sleep(3 * time.Second)
	// (a) helm upgrade to a new tag of the same image.
	ref, tag, _ := strings.Cut(nftmeshImage, ":")
	newTag := tag + "-upgrade"
	if _, err := c.Ctr(ctx, "images", "tag", "--force", nftmeshImage, ref+":"+newTag); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	if _, err := c.Helm(ctx, "upgrade", "nftmesh", filepath.Join(repo, "charts", "nftmesh"), "-n", agentNS,
		"--reuse-values", "--set", "nftmesh.image.tag="+newTag, "--wait", "--timeout", "2m"); err != nil {
		t.Fatal(err)
	}
	helmTook := time.Since(t0)
	if err := c.waitAgentImage(ctx, ref+":"+newTag, ""); err != nil {
		t.Fatal(err)
	}
	record("churn: helm upgrade to tag %s --wait %.2fs, new agent Ready %.2fs", newTag, helmTook.Seconds(), time.Since(t0).Seconds())

	time.Sleep(3 * time.Second)
	upgradeBin, upgradeEntry := w.absent()
	// (b) the agent pod deleted while pods keep starting.
	old, err := c.Client.CoreV1().Pods(agentNS).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=nftmesh-agent"})
	if err != nil || len(old.Items) != 1 {
		t.Fatalf("agent pods: %v (%d)", err, len(old.Items))
	}
	t0 = time.Now()
	if err := c.Client.CoreV1().Pods(agentNS).Delete(ctx, old.Items[0].Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// Not kubectl rollout status: it can return before the deleted pod is
	// even gone.
	if err := c.waitAgentImage(ctx, ref+":"+newTag, old.Items[0].Name); err != nil {
		t.Fatal(err)
	}
	record("churn: agent pod deleted → replacement Ready %.2fs", time.Since(t0).Seconds())
	time.Sleep(3 * time.Second)
	restartBin, restartEntry := w.absent()
	// (c) the token the plugin uses rotated while the agent is down.
	// Two more pods at once, whatever the churn's pace: their ADDs
	// meet the stale kubeconfig.
	rot, err := c.rotateTokenAgentDown(ctx, ref+":"+newTag, func() {
		for i := range 2 {
			launch(fmt.Sprintf("churn-rotate-%d", i), func() {})
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second)
	close(stopCreate)
	createDone.Wait()
	checks.Wait()
	for _, f := range failures {
		t.Error(f)
	}
	close(stopWatch)
	watchDone.Wait()
	logs := alogs.stop()
	if len(stuck) > 0 {
		for name, d := range stuck {
			t.Logf("stuck pod %s:\n%s\nagent log lines naming it:\n%s", name, d, linesAbout(logs, name))
		}
		for name, l := range logs {
			t.Logf("agent %s log:\n%s", name, l)
		}
		if m, err := c.agentMetrics(ctx); err == nil {
			t.Logf("agent metrics (repair):\n%s", m)
		}
	}
	// Every repair in place went to the pod's own namespace.
	repairs := 0
	for name, l := range logs {
		for _, line := range strings.Split(l, "\n") {
			if !strings.Contains(line, "repaired the pod's capture in place") {
				continue
			}
			repairs++
			if !strings.Contains(line, `"match":"`+inplace.MatchCgroup+`"`) {
				t.Errorf("agent %s repaired a pod without finding it by its cgroup: %s", name, line)
			}
		}
	}
	var p50, p95 time.Duration
	if len(starts) > 0 {
		p50, p95 = percentiles(starts)
	}
	binGone, entryGone := w.absent()
	ms := func(d time.Duration) time.Duration { return d.Round(time.Millisecond) }
	record("churn: %d mesh pods created during upgrade, restart and token rotation: %d not Running with validation passing within the bound, %d repaired (%d repair lines, each by pod cgroup); create → Running and captured p50 %v p95 %v; plugin binary read %d times, %d partial; node without the plugin binary %v in the upgrade, %v in the restart, %v in the rotation; without our conflist entry %v, %v and %v",
		created, len(failures), repaired, repairs, p50.Round(100*time.Millisecond), p95.Round(100*time.Millisecond), w.reads, w.partial,
		ms(upgradeBin), ms(restartBin-upgradeBin), ms(binGone-restartBin), ms(upgradeEntry), ms(restartEntry-upgradeEntry), ms(entryGone-restartEntry))
	c.checkTokenRotation(ctx, t, rot)
	if w.partial > 0 {
		t.Errorf("the plugin binary was seen incomplete or different %d times: not replaced atomically", w.partial)
	}
}

// waitCaptured waits until pod name runs with istio-validation passing and
// returns how often validation was restarted.
func (c *Cluster) waitCaptured(ctx context.Context, name string) (int32, error) {
	var last *corev1.Pod
	err := c.poll(ctx, 150*time.Second, name+" Running with validation passing", func() (bool, error) {
		p, err := c.Client.CoreV1().Pods(meshNS).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		last = p
		return p.Status.Phase == corev1.PodRunning && validationExit(p, 0), nil
	})
	if err != nil {
		return 0, fmt.Errorf("%w (%s)", err, podState(last))
	}
	for _, s := range last.Status.InitContainerStatuses {
		if s.Name == istiotest.ValidationContainer {
			return s.RestartCount, nil
		}
	}
	return 0, nil
}

// deletePodAndWait deletes a pod and waits until it is gone.
func (c *Cluster) deletePodAndWait(ctx context.Context, name string) error {
	if err := c.Client.CoreV1().Pods(meshNS).Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting pod %s: %w", name, err)
	}
	return c.poll(ctx, 60*time.Second, name+" gone", func() (bool, error) {
		_, err := c.Client.CoreV1().Pods(meshNS).Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
}

// meshPrerequisites creates what injected pods need in the namespace: their
// ServiceAccount and the istio-ca-root-cert ConfigMap.
func (c *Cluster) meshPrerequisites(ctx context.Context, sa string) error {
	ca, err := os.ReadFile(c.pki.CA)
	if err != nil {
		return err
	}
	_, err = c.Client.CoreV1().ServiceAccounts(meshNS).Create(ctx, &corev1.ServiceAccount{
		ObjectMeta: metav1.ObjectMeta{Name: sa, Labels: map[string]string{meshLabel: "true"}},
	}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	_, err = c.Client.CoreV1().ConfigMaps(meshNS).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "istio-ca-root-cert", Labels: map[string]string{meshLabel: "true"}},
		Data:       map[string]string{"root-cert.pem": string(ca)},
	}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	return nil
}

// waitAgentImage waits until the only agent pod runs image, is ready and
// is not the pod named replaced.
func (c *Cluster) waitAgentImage(ctx context.Context, image, replaced string) error {
	return c.poll(ctx, 120*time.Second, "agent on "+image, func() (bool, error) {
		l, err := c.Client.CoreV1().Pods(agentNS).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=nftmesh-agent"})
		if err != nil || len(l.Items) != 1 {
			return false, nil
		}
		p := l.Items[0]
		if p.Spec.Containers[0].Image != image || p.DeletionTimestamp != nil || p.Name == replaced {
			return false, nil
		}
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodReady {
				return cond.Status == corev1.ConditionTrue, nil
			}
		}
		return false, nil
	})
}

// nodeWatch polls the node's plugin binary and conflist.
type nodeWatch struct {
	bin, conf string
	want      []byte

	mu                 sync.Mutex
	reads, partial     int
	binGone, entryGone time.Duration
}

// absent returns how long the binary and the entry were missing so far.
func (w *nodeWatch) absent() (bin, entry time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.binGone, w.entryGone
}

func (w *nodeWatch) run(stop <-chan struct{}) {
	last := time.Now()
	for {
		select {
		case <-stop:
			return
		case <-time.After(5 * time.Millisecond):
		}
		now := time.Now()
		step := now.Sub(last)
		last = now
		data, err := os.ReadFile(w.bin)
		w.mu.Lock()
		switch {
		case os.IsNotExist(err):
			w.binGone += step
		case err == nil:
			w.reads++
			if !bytes.Equal(data, w.want) {
				w.partial++
			}
		}
		conf, err := os.ReadFile(w.conf)
		var list struct {
			Plugins []map[string]any `json:"plugins"`
		}
		if err != nil || json.Unmarshal(conf, &list) != nil || len(list.Plugins) == 0 || list.Plugins[len(list.Plugins)-1]["type"] != "nftmesh-cni" {
			w.entryGone += step
		}
		w.mu.Unlock()
	}
}
