package cluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftmesh/nftmesh/testkit/istiotest"
)

// The node taint a node is born with until its CNI agent can program pods
// (Istio's name; the agent's --node-taint default).
const notReadyTaint = "cni.istio.io/not-ready"

// agentRunDirOnNode is the chart's default agentRunDir, inside the node.
const agentRunDirOnNode = "/run/nftmesh"

// meshPodsReady makes sure what injected pods need is on the node (the
// stand-in image, Istio's real pilot-agent in it, their ServiceAccount
// and CA ConfigMap) and returns a pod template of the injected httpbin.
func (c *Cluster) meshPodsReady(t *testing.T) corev1.PodTemplateSpec {
	t.Helper()
	c.standinReady(t)
	ctx := context.Background()
	template := raceDeployment(t, "lifecycle").Spec.Template
	if err := c.meshPrerequisites(ctx, template.Spec.ServiceAccountName); err != nil {
		t.Fatal(err)
	}
	return template
}

// standinReady imports the stand-in image injected pods run, with Istio's
// real pilot-agent in it (skipped without the pilot-agent build, a failure
// in CI).
func (c *Cluster) standinReady(t *testing.T) {
	t.Helper()
	pilotAgent, err := istiotest.PilotAgent()
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal(err)
		}
		t.Skipf("skipping: %v", err)
	}
	if err := c.importStandinImage(context.Background(), pilotAgent); err != nil {
		t.Fatal(err)
	}
}

// createMeshPod creates one injected pod from template under name.
func (c *Cluster) createMeshPod(t *testing.T, template corev1.PodTemplateSpec, name string) {
	t.Helper()
	pod := &corev1.Pod{ObjectMeta: *template.ObjectMeta.DeepCopy(), Spec: *template.Spec.DeepCopy()}
	pod.Name, pod.Namespace = name, meshNS
	pod.Labels[meshLabel] = "true"
	if _, err := c.Client.CoreV1().Pods(meshNS).Create(context.Background(), pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// setNodeTaint puts the not-ready taint on the node as the kubelet does
// for --register-with-taints, or takes it off.
func (c *Cluster) setNodeTaint(ctx context.Context, on bool) error {
	n, err := c.Client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
	if err != nil {
		return err
	}
	var keep []corev1.Taint
	for _, tn := range n.Spec.Taints {
		if tn.Key != notReadyTaint {
			keep = append(keep, tn)
		}
	}
	if on {
		keep = append(keep, corev1.Taint{Key: notReadyTaint, Value: "true", Effect: corev1.TaintEffectNoSchedule})
	}
	n.Spec.Taints = keep
	_, err = c.Client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
	return err
}

func (c *Cluster) nodeTainted(ctx context.Context) (bool, error) {
	n, err := c.Client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
	if err != nil {
		return false, err
	}
	for _, tn := range n.Spec.Taints {
		if tn.Key == notReadyTaint {
			return true, nil
		}
	}
	return false, nil
}

// TestTaintedNodeUntaintedByAgent (issue 22 item 3): a node carrying
// cni.istio.io/not-ready, as a node registered with that taint does until
// its CNI agent is up. Mesh pods wait (unschedulable); the chart goes on;
// the agent removes the taint from its own node once it can program pods
// (no istiod untaint controller runs here); the pods then start captured on
// their first try: istio-validation passes on its first run, no repair.
func TestTaintedNodeUntaintedByAgent(t *testing.T) {
	c := need(t)
	ctx := context.Background()
	template := c.meshPodsReady(t)
	t.Cleanup(func() { c.deleteMesh(t) })
	chartMu.Lock()
	installed := chartInstalled
	chartMu.Unlock()
	if installed {
		if err := uninstallChart(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.setNodeTaint(ctx, true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.setNodeTaint(context.Background(), false); err != nil {
			t.Errorf("taking the taint off: %v", err)
		}
	})
	const n = 3
	for i := range n {
		c.createMeshPod(t, template, fmt.Sprintf("tainted-%d", i))
	}
	// The scheduler leaves them Pending: the node is tainted.
	if err := c.poll(ctx, 30*time.Second, "mesh pods unschedulable", func() (bool, error) {
		for i := range n {
			p, err := c.Client.CoreV1().Pods(meshNS).Get(ctx, fmt.Sprintf("tainted-%d", i), metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			if p.Spec.NodeName != "" {
				return false, fmt.Errorf("pod %s was scheduled on the tainted node", p.Name)
			}
			unsched := false
			for _, cd := range p.Status.Conditions {
				if cd.Type == corev1.PodScheduled && cd.Status == corev1.ConditionFalse && cd.Reason == corev1.PodReasonUnschedulable {
					unsched = true
				}
			}
			if !unsched {
				return false, nil
			}
		}
		return true, nil
	}); err != nil {
		t.Fatal(err)
	}

	t0 := time.Now()
	installChart(t, c)
	if err := c.poll(ctx, 60*time.Second, "the agent takes the taint off its node", func() (bool, error) {
		tainted, err := c.nodeTainted(ctx)
		return err == nil && !tainted, nil
	}); err != nil {
		t.Fatal(err)
	}
	untainted := time.Since(t0)
	var worst time.Duration
	for i := range n {
		name := fmt.Sprintf("tainted-%d", i)
		restarts, err := c.waitCaptured(ctx, name)
		if err != nil {
			t.Fatalf("%v\n%s", err, c.describePod(ctx, meshNS, name))
		}
		if restarts != 0 {
			t.Errorf("%s: istio-validation ran %d times: the pod started before capture was ready", name, restarts+1)
		}
		worst = max(worst, time.Since(t0))
	}
	record("taint: chart installed → %s off the node %.2fs; %d waiting mesh pods Running and captured on their first start within %.2fs", notReadyTaint, untainted.Seconds(), n, worst.Seconds())
}

// TestMeshPodDeletedAfterUninstall (issue 22 item 9): a pod created while
// nftmesh was installed is deleted cleanly after `helm uninstall` (its CNI
// DEL must not fail on a plugin that is gone, or the pod stays Terminating
// and its sandbox leaks, as istio.io#16748 reports for Istio).
func TestMeshPodDeletedAfterUninstall(t *testing.T) {
	c := need(t)
	ctx := context.Background()
	template := c.meshPodsReady(t)
	t.Cleanup(func() { c.deleteMesh(t) })
	installChart(t, c)
	c.createMeshPod(t, template, "before-uninstall")
	if _, err := c.waitCaptured(ctx, "before-uninstall"); err != nil {
		t.Fatal(err)
	}
	if err := uninstallChart(ctx, c); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	if err := c.deletePodAndWait(ctx, "before-uninstall"); err != nil {
		t.Fatalf("%v\n%s", err, c.describePod(ctx, meshNS, "before-uninstall"))
	}
	record("uninstall: a pod created under nftmesh deleted %.2fs after helm uninstall", time.Since(t0).Seconds())
}

// TestAgentFilesLostStartPodsAgain (issue 22 item 9): a hard power-off
// can leave the files the agent wrote empty or missing (data not yet on
// disk). With the node's kubeconfig and plugin binary emptied, the
// companion binary gone and the agent's undo record cut (it is synced
// before use, so only a damaged disk cuts it), the restarted agent
// puts everything back and mesh pods start captured again as soon as it is
// up, without any hand edit (istio/istio#60668).
func TestAgentFilesLostStartPodsAgain(t *testing.T) {
	c := need(t)
	ctx := context.Background()
	template := c.meshPodsReady(t)
	t.Cleanup(func() { c.deleteMesh(t) })
	installChart(t, c)

	runDir := c.NodePath(agentRunDirOnNode)
	for file, how := range map[string]string{
		filepath.Join(runDir, "kubeconfig"):                  "empty",
		filepath.Join(c.CNIBinDir, "nftmesh-cni"):            "empty",
		filepath.Join(c.CNIBinDir, "nftmesh-cni-standalone"): "gone",
		filepath.Join(c.CNIConfDir, ".nftmesh", "undo.json"): "cut",
	} {
		var err error
		switch how {
		case "empty":
			err = os.Truncate(file, 0)
		case "gone":
			err = os.Remove(file)
		case "cut":
			var st os.FileInfo
			if st, err = os.Stat(file); err == nil {
				err = os.Truncate(file, st.Size()/2)
			}
		}
		if err != nil && !os.IsNotExist(err) {
			t.Fatalf("simulating the power loss on %s: %v", file, err)
		}
	}
	// The node comes back: the agent's pod starts again.
	old, err := c.Client.CoreV1().Pods(agentNS).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=nftmesh-agent"})
	if err != nil || len(old.Items) != 1 {
		t.Fatalf("agent pods: %v (%d)", err, len(old.Items))
	}
	t0 := time.Now()
	if err := c.Client.CoreV1().Pods(agentNS).Delete(ctx, old.Items[0].Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.waitAgentImage(ctx, nftmeshImage, old.Items[0].Name); err != nil {
		t.Fatal(err)
	}
	ready := time.Since(t0)
	c.createMeshPod(t, template, "after-power-loss")
	restarts, err := c.waitCaptured(ctx, "after-power-loss")
	if err != nil {
		t.Fatalf("%v\n%s", err, c.describePod(ctx, meshNS, "after-power-loss"))
	}
	if restarts != 0 {
		t.Errorf("after-power-loss: istio-validation ran %d times", restarts+1)
	}
	// What an operator runs to check a pod: inspect by name through the
	// agent, in the agent's container.
	out, err := c.Kubectl(ctx, "-n", agentNS, "exec", "ds/"+agentDaemonSet, "--", "redirect", "inspect", meshNS+"/after-power-loss")
	if err != nil || !strings.Contains(out, "in sync") {
		t.Errorf("kubectl exec ds/%s -- redirect inspect %s/after-power-loss: %v\n%s", agentDaemonSet, meshNS, err, out)
	}
	for _, f := range []string{filepath.Join(runDir, "kubeconfig"), filepath.Join(c.CNIBinDir, "nftmesh-cni"), filepath.Join(c.CNIBinDir, "nftmesh-cni-standalone")} {
		if st, err := os.Stat(f); err != nil || st.Size() == 0 {
			t.Errorf("%s not put back: %v", f, err)
		}
	}
	record("power loss: agent files emptied or gone → new agent Ready %.2fs, a mesh pod Running and captured %.2fs after", ready.Seconds(), time.Since(t0).Seconds())
}
