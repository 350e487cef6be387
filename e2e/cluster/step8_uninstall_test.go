package cluster

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestHelmUninstall is assertion 6, the last step: `helm uninstall` takes
// our entry and binary off the node, the primary's conflist is byte for
// byte what it was before the install, and a new pod outside the mesh
// starts normally through the primary alone. The node reboots before the
// uninstall (issue 29 item 3): what the restore needs must outlive the run
// dir.
func TestHelmUninstall(t *testing.T) {
	c := need(t)
	ctx := context.Background()
	installChart(t, c)
	if err := c.rebootAgent(ctx); err != nil {
		t.Fatal(err)
	}

	t0 := time.Now()
	// The agent restores the config on SIGTERM; helm returns once the
	// DaemonSet is gone, its pod may still be terminating.
	if err := uninstallChart(ctx, c); err != nil {
		t.Fatal(err)
	}
	record("chart: helm uninstall → agent gone %.2fs", time.Since(t0).Seconds())

	got, err := os.ReadFile(c.PrimaryConflist)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, []byte(primaryConflist)) {
		t.Errorf("%s after uninstall is not the original:\n--- got\n%s\n--- want\n%s", c.PrimaryConflist, got, primaryConflist)
	}
	ents, err := os.ReadDir(c.CNIConfDir)
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != 1 {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Errorf("CNI conf dir holds %v, want only %s", names, filepath.Base(c.PrimaryConflist))
	}
	for _, name := range []string{"nftmesh-cni", "nftmesh-cni-standalone"} {
		if _, err := os.Lstat(filepath.Join(c.CNIBinDir, name)); !os.IsNotExist(err) {
			t.Errorf("%s still in the node's CNI bin dir after uninstall (%v)", name, err)
		}
	}

	pod := plainPod("after-uninstall")
	pod.Labels["e2e-run"] = "after-uninstall"
	p, d, err := c.createAndWait(ctx, pod, 60*time.Second)
	if err != nil {
		t.Fatalf("%v (%s)", err, podState(p))
	}
	t.Logf("plain pod after uninstall: Running in %v", d.Round(time.Millisecond))
	if err := c.deletePods(ctx, "default", "e2e-run=after-uninstall"); err != nil {
		t.Fatal(err)
	}
}

// rebootAgent does to the agent what an unclean reboot of the node does:
// the run dir (a tmpfs) comes back empty and the agent starts again without
// having cleaned up. The run dir is emptied first and the agent then
// killed (SIGKILL) and its pod force-deleted, so no agent reads the old
// run dir after; it returns once the new agent is ready.
func (c *Cluster) rebootAgent(ctx context.Context) error {
	// Whatever image the agent runs (the churn test upgrades it to another
	// tag); helm's --wait can see the DaemonSet ready before its pod exists.
	var old *corev1.PodList
	if err := c.poll(ctx, 120*time.Second, "one agent pod", func() (bool, error) {
		l, err := c.Client.CoreV1().Pods(agentNS).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=nftmesh-agent"})
		old = l
		return err == nil && len(l.Items) == 1 && l.Items[0].DeletionTimestamp == nil, nil
	}); err != nil {
		return err
	}
	image := old.Items[0].Spec.Containers[0].Image
	if err := c.waitAgentImage(ctx, image, ""); err != nil {
		return err
	}
	pid, err := c.agentPID()
	if err != nil {
		return err
	}
	runDir := c.NodePath(agentRunDirOnNode)
	ents, err := os.ReadDir(runDir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if err := os.RemoveAll(filepath.Join(runDir, e.Name())); err != nil {
			return fmt.Errorf("emptying the node's run dir: %w", err)
		}
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return fmt.Errorf("killing the agent (pid %d): %w", pid, err)
	}
	zero := int64(0)
	if err := c.Client.CoreV1().Pods(agentNS).Delete(ctx, old.Items[0].Name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		return err
	}
	t0 := time.Now()
	if err := c.waitAgentImage(ctx, image, old.Items[0].Name); err != nil {
		return err
	}
	record("chart: simulated reboot (run dir emptied, agent SIGKILLed) → new agent Ready %.2fs", time.Since(t0).Seconds())
	return nil
}
