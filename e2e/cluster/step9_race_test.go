package cluster

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/nftmesh/nftmesh/installer/inplace"
	"github.com/nftmesh/nftmesh/testkit/istiotest"
)

// TestNodeStartRace is assertion 3, the race Istio users hit: a mesh pod
// (in a Deployment) starts before the plugin is on its node, so Istio's
// istio-validation exits 126; then the chart is installed with one repair
// mode, and the workload must end Running with validation passing (Istio's
// own proof of capture) within a bounded time. In place: the same pod
// recovers; delete: its replacement runs; label: the pod is labelled, and
// the replacement an operator gets by deleting it runs.
func TestNodeStartRace(t *testing.T) {
	c := need(t)
	c.standinReady(t)
	ctx := context.Background()
	for _, mode := range []struct {
		name string
		sets []string
	}{
		{"repair", []string{"repair.repairPods=true"}},
		{"delete", []string{"repair.repairPods=false", "repair.deletePods=true"}},
		{"label", []string{"repair.repairPods=false", "repair.labelPods=true"}},
	} {
		t.Run(mode.name, func(t *testing.T) { c.race(ctx, t, mode.name, mode.sets) })
	}
}

func (c *Cluster) race(ctx context.Context, t *testing.T, mode string, sets []string) {
	chartMu.Lock()
	installed := chartInstalled
	chartMu.Unlock()
	if installed {
		if err := uninstallChart(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	name := "race-" + mode
	dep := raceDeployment(t, name)
	if _, err := c.Client.CoreV1().ServiceAccounts(meshNS).Create(ctx, &corev1.ServiceAccount{
		ObjectMeta: metav1.ObjectMeta{Name: dep.Spec.Template.Spec.ServiceAccountName, Labels: map[string]string{meshLabel: "true"}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ca, err := os.ReadFile(c.pki.CA)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Client.CoreV1().ConfigMaps(meshNS).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "istio-ca-root-cert", Labels: map[string]string{meshLabel: "true"}},
		Data:       map[string]string{"root-cert.pem": string(ca)},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.deleteMesh(t)
		if err := uninstallChart(context.Background(), c); err != nil {
			t.Error(err)
		}
	})
	if _, err := c.Client.AppsV1().Deployments(meshNS).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	selector := metav1.FormatLabelSelector(dep.Spec.Selector)

	// Without the plugin, Istio's check fails.
	var broken *corev1.Pod
	err = c.poll(ctx, 90*time.Second, name+": istio-validation exits 126", func() (bool, error) {
		l, err := c.Client.CoreV1().Pods(meshNS).List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil || len(l.Items) == 0 {
			return false, nil
		}
		broken = &l.Items[0]
		return validationExit(broken, 126), nil
	})
	if err != nil {
		t.Fatalf("%v (%s)", err, podState(broken))
	}
	t.Logf("%s: pod %s started before the plugin: istio-validation exited 126", name, broken.Name)

	args := append(helmInstallArgs(c), "--set", "repair.enabled=true")
	for _, s := range sets {
		args = append(args, "--set", s)
	}
	t0 := time.Now()
	if _, err := c.Helm(ctx, args...); err != nil {
		t.Fatal(err)
	}
	chartMu.Lock()
	chartInstalled = true
	chartMu.Unlock()

	if mode == "label" {
		key := "cni.istio.io/uninitialized"
		var p *corev1.Pod
		if err := c.poll(ctx, 60*time.Second, name+": broken pod labelled", func() (bool, error) {
			p, err = c.Client.CoreV1().Pods(meshNS).Get(ctx, broken.Name, metav1.GetOptions{})
			return err == nil && p.Labels[key] == "true", nil
		}); err != nil {
			t.Fatalf("%v (labels %v)", err, p.GetLabels())
		}
		t.Logf("%s: pod %s labelled %s=true after %.1fs; deleting it as an operator would", name, broken.Name, key, time.Since(t0).Seconds())
		if err := c.Client.CoreV1().Pods(meshNS).Delete(ctx, broken.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	var fixed *corev1.Pod
	err = c.poll(ctx, 150*time.Second, name+": workload Running with validation passing", func() (bool, error) {
		l, err := c.Client.CoreV1().Pods(meshNS).List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			return false, nil
		}
		for i := range l.Items {
			p := &l.Items[i]
			fixed = p
			samePod := p.UID == broken.UID
			if (mode == "repair") != samePod || p.DeletionTimestamp != nil {
				continue
			}
			if p.Status.Phase == corev1.PodRunning && validationExit(p, 0) {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("%v (%s)", err, podState(fixed))
	}
	record("race: repair mode %s: chart installed → workload Running and captured %.1fs (pod %s)", mode, time.Since(t0).Seconds(), fixed.Name)
	if mode == "repair" {
		// The harness's stranger namespace holds the pod's address too:
		// the agent must have found the pod by its cgroup.
		out, err := c.Kubectl(ctx, "-n", agentNS, "logs", "ds/"+agentDaemonSet)
		if err != nil {
			t.Fatal(err)
		}
		var line map[string]any
		for _, l := range strings.Split(out, "\n") {
			var m map[string]any
			if json.Unmarshal([]byte(l), &m) != nil {
				continue
			}
			if msg, _ := m["message"].(string); m["pod"] == fixed.Name && strings.HasPrefix(msg, "repaired the pod's capture in place") {
				line = m
			}
		}
		// At least the pod's namespace and the stranger hold its IP (more
		// when another cluster shares the machine).
		if n, _ := line["candidates"].(float64); line["match"] != inplace.MatchCgroup || n < 2 {
			t.Errorf("repair line for %s does not say it found the pod by its cgroup among at least 2 namespaces holding its IP: %v", fixed.Name, line)
		}
	}
	if mode != "repair" {
		line := c.agentLogLine(ctx, t, meshNS, fixed.Name, "ADD")
		if line["decision"] != "capture" {
			t.Errorf("replacement pod %s: decision %v, want capture", fixed.Name, line["decision"])
		}
	}
}

// raceDeployment is the injected httpbin workload renamed to name, with
// Rewrite's offline images.
func raceDeployment(t *testing.T, name string) *appsv1.Deployment {
	t.Helper()
	dep := injectedHTTPBin(t, istiotest.Standin{Image: standinImage, Every: dialEvery})
	dep.Name = name
	dep.Spec.Selector.MatchLabels["app"] = name
	dep.Spec.Template.Labels["app"] = name
	labelled(&dep.ObjectMeta)
	return dep
}

// injectedHTTPBin is the injected httpbin Deployment with Rewrite's
// offline images and s's dial targets.
func injectedHTTPBin(t *testing.T, s istiotest.Standin) *appsv1.Deployment {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(istiotest.TestdataDir(), "injected", "httpbin.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	objs, err := istiotest.SplitManifests(data)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if o.Kind != "Deployment" {
			continue
		}
		dep := &appsv1.Deployment{}
		if err := yaml.Unmarshal(o.Raw, dep); err != nil {
			t.Fatal(err)
		}
		if err := istiotest.Rewrite(&dep.Spec.Template.Spec, s); err != nil {
			t.Fatal(err)
		}
		return dep
	}
	t.Fatal("httpbin.yaml has no Deployment")
	return nil
}

// validationExit says whether istio-validation's latest run ended with
// code (its current state, or the last one while it waits to restart).
func validationExit(p *corev1.Pod, code int32) bool {
	for _, s := range p.Status.InitContainerStatuses {
		if s.Name != istiotest.ValidationContainer {
			continue
		}
		if s.State.Terminated != nil {
			return s.State.Terminated.ExitCode == code
		}
		if s.State.Waiting != nil && s.LastTerminationState.Terminated != nil {
			return s.LastTerminationState.Terminated.ExitCode == code
		}
	}
	return false
}
