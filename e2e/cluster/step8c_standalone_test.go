package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// multusShim is the test's stand-in for Multus's thin plugin
// (./multusshim), in the node's CNI bin dir.
const multusShim = "e2e-multus"

// nadCRD is the NetworkAttachmentDefinition CRD Multus installs (its
// group, version and names; the schema left open, as Multus's is).
const nadCRD = `{"apiVersion":"apiextensions.k8s.io/v1","kind":"CustomResourceDefinition",
"metadata":{"name":"network-attachment-definitions.k8s.cni.cncf.io"},
"spec":{"group":"k8s.cni.cncf.io","scope":"Namespaced",
"names":{"plural":"network-attachment-definitions","singular":"network-attachment-definition","kind":"NetworkAttachmentDefinition","shortNames":["net-attach-def"]},
"versions":[{"name":"v1","served":true,"storage":true,"schema":{"openAPIV3Schema":{"type":"object","x-kubernetes-preserve-unknown-fields":true}}}]}}`

// istioStandaloneConf is what Istio's agent writes in standalone (Multus)
// mode: its own network, named as the NetworkAttachmentDefinition.
const istioStandaloneConf = `{
  "cniVersion": "0.3.1",
  "name": "istio-cni",
  "type": "istio-cni",
  "log_level": "info",
  "kubernetes": {
    "kubeconfig": "/etc/cni/multus/net.d/ZZZ-istio-cni-kubeconfig",
    "cni_bin_dir": "/var/lib/cni/bin",
    "exclude_namespaces": ["kube-system"]
  }
}
`

const nadPath = "/apis/k8s.cni.cncf.io/v1/namespaces/default/network-attachment-definitions/istio-cni"

// nadMeta reads default/istio-cni's labels and annotations; found is
// false when it does not exist.
func (c *Cluster) nadMeta(ctx context.Context) (meta metav1.ObjectMeta, found bool, err error) {
	raw, err := c.Client.Discovery().RESTClient().Get().AbsPath(nadPath).DoRaw(ctx)
	if apierrors.IsNotFound(err) {
		return meta, false, nil
	}
	if err != nil {
		return meta, false, err
	}
	var obj struct {
		Metadata metav1.ObjectMeta `json:"metadata"`
	}
	err = json.Unmarshal(raw, &obj)
	return obj.Metadata, err == nil, err
}

// TestStandaloneModeThroughMultus runs the chart as on OpenShift
// (platform=openshift: chained=false, provider=multus, the standalone
// istio-cni.conf in Multus's own conf dir) on a node whose runtime config
// is a Multus-like plugin: Multus itself is not on the Go module proxy, so
// the stand-in in ./multusshim does what its thin plugin does for this
// (the cluster network, then each NetworkAttachmentDefinition the pod's
// annotation names, its config found by name in the conf dir). It follows
// docs/migrate-from-istio-cni.md's OpenShift hand-over: installed with
// networkAttachmentDefinition.create=false beside Istio's object and
// Istio's leftover standalone file, the agent neither overwrites that file
// nor turns ready; once it is gone the agent writes its own and turns
// ready; Istio's object deleted, `helm upgrade
// --set networkAttachmentDefinition.create=true` (with keep=true) takes it
// over; an injected pod carrying the annotation starts captured through
// the standalone config (Istio's real validation passes on its first run)
// while the primary conflist stays untouched; `helm uninstall` removes
// the standalone file and keeps the object.
func TestStandaloneModeThroughMultus(t *testing.T) {
	c := need(t)
	ctx := context.Background()
	template := c.meshPodsReady(t)
	chartMu.Lock()
	installed := chartInstalled
	chartMu.Unlock()
	if installed {
		if err := uninstallChart(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	t0 := time.Now()
	primaryBefore, err := os.ReadFile(c.PrimaryConflist)
	if err != nil {
		t.Fatal(err)
	}
	multusDir := filepath.Join(c.Dir, "multus", "net.d")
	cacheDir := filepath.Join(c.Dir, "multus", "cache")
	multusConf := filepath.Join(c.CNIConfDir, "00-multus.conf")
	if err := os.MkdirAll(multusDir, 0o755); err != nil {
		t.Fatal(err)
	}
	crdFile := filepath.Join(c.Dir, "multus", "nad-crd.json")
	if err := os.WriteFile(crdFile, []byte(nadCRD), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// After the mesh pods are gone (their DEL goes through the shim).
		for _, f := range []string{multusConf, filepath.Join(c.CNIBinDir, multusShim)} {
			if err := os.Remove(f); err != nil && !os.IsNotExist(err) {
				t.Error(err)
			}
		}
		if out, err := c.Kubectl(ctx, "delete", "--ignore-not-found", "-f", crdFile); err != nil {
			t.Errorf("deleting the NetworkAttachmentDefinition CRD: %v\n%s", err, out)
		}
		if _, err := c.Helm(ctx, "uninstall", "nftmesh", "-n", agentNS, "--ignore-not-found", "--wait", "--timeout", "2m"); err != nil {
			t.Error(err)
		}
	})
	t.Cleanup(func() { c.deleteMesh(t) })
	if out, err := c.Kubectl(ctx, "apply", "-f", crdFile); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if out, err := c.Kubectl(ctx, "wait", "--for", "condition=Established", "--timeout", "60s", "crd/network-attachment-definitions.k8s.cni.cncf.io"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if err := goBuild(repo, "./e2e/cluster/multusshim", filepath.Join(c.CNIBinDir, multusShim)); err != nil {
		t.Fatal(err)
	}
	shimConf, _ := json.Marshal(map[string]any{
		"cniVersion": "1.0.0", "name": "multus-cni-network", "type": multusShim,
		"kubeconfig": c.AdminKubeconfig, "clusterNetwork": c.PrimaryConflist,
		"confDir": multusDir, "binDir": c.CNIBinDir, "cacheDir": cacheDir,
	})
	if err := os.WriteFile(multusConf, shimConf, 0o644); err != nil {
		t.Fatal(err)
	}

	// Istio's release owns default/istio-cni, and Istio's agent left its
	// standalone file on the node.
	istioNAD := `{"apiVersion":"k8s.cni.cncf.io/v1","kind":"NetworkAttachmentDefinition","metadata":{"name":"istio-cni","namespace":"default",
"labels":{"app.kubernetes.io/managed-by":"Helm"},"annotations":{"meta.helm.sh/release-name":"istio-cni","meta.helm.sh/release-namespace":"istio-system"}}}`
	if err := c.Client.Discovery().RESTClient().Post().AbsPath("/apis/k8s.cni.cncf.io/v1/namespaces/default/network-attachment-definitions").
		Body([]byte(istioNAD)).Do(ctx).Error(); err != nil {
		t.Fatal(err)
	}
	foreign := filepath.Join(multusDir, "istio-cni.conf")
	if err := os.WriteFile(foreign, []byte(istioStandaloneConf), 0o644); err != nil {
		t.Fatal(err)
	}
	ref, tag, _ := strings.Cut(nftmeshImage, ":")
	chart := filepath.Join(repo, "charts", "nftmesh")
	if _, err := c.Helm(ctx, "install", "nftmesh", chart, "-n", agentNS, "--create-namespace",
		"--set", "nftmesh.image.repository="+ref, "--set", "nftmesh.image.tag="+tag, "--set", "pullPolicy=Never",
		"--set", "platform=openshift", "--set", "cniBinDir="+c.CNIBinDir, "--set", "cniConfDir="+multusDir,
		"--set", "networkAttachmentDefinition.create=false", "--timeout", "2m"); err != nil {
		t.Fatalf("helm install (standalone, beside Istio's object): %v", err)
	}
	// The agent refuses: it says so, stays not ready, and Istio's file
	// keeps its bytes.
	var refusal string
	err = c.poll(ctx, 120*time.Second, "the agent refusing Istio's standalone file", func() (bool, error) {
		out, err := c.Kubectl(ctx, "-n", agentNS, "logs", "ds/"+agentDaemonSet)
		if err != nil {
			return false, nil
		}
		for _, l := range strings.Split(out, "\n") {
			if strings.Contains(l, "writes no standalone config beside it") {
				refusal = l
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(refusal, "istio-cni.conf is the config of istio-cni") {
		t.Errorf("the refusal does not name Istio's file: %s", refusal)
	}
	time.Sleep(2 * time.Second) // a reconcile or two more
	if b, err := os.ReadFile(foreign); err != nil || string(b) != istioStandaloneConf {
		t.Errorf("Istio's standalone %s was changed (%v):\n%s", foreign, err, b)
	}
	if ready, err := c.agentReady(ctx); err != nil || ready {
		t.Errorf("agent ready beside Istio's standalone file (%v)", err)
	}
	if m, found, err := c.nadMeta(ctx); err != nil || !found || m.Annotations["meta.helm.sh/release-name"] != "istio-cni" {
		t.Errorf("Istio's NetworkAttachmentDefinition with networkAttachmentDefinition.create=false: found %v, annotations %v (%v)", found, m.Annotations, err)
	}

	// Istio's agent is gone from the node: nftmesh writes its own file.
	if err := os.Remove(foreign); err != nil {
		t.Fatal(err)
	}
	if err := c.waitAgentImage(ctx, nftmeshImage, ""); err != nil {
		t.Fatal(err)
	}
	var own struct{ CNIVersion, Name, Type string }
	if b, err := os.ReadFile(foreign); err != nil || json.Unmarshal(b, &own) != nil || own.Type != "nftmesh-cni" || own.Name != "istio-cni" {
		t.Errorf("the agent's standalone config %s: %+v (%v)", foreign, own, err)
	}

	// The hand-over: Istio's release uninstalled (its object goes), then
	// nftmesh's creates it (and keeps it on uninstall).
	if err := c.Client.Discovery().RESTClient().Delete().AbsPath(nadPath).Do(ctx).Error(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Helm(ctx, "upgrade", "nftmesh", chart, "-n", agentNS, "--reuse-values",
		"--set", "networkAttachmentDefinition.create=true", "--set", "networkAttachmentDefinition.keep=true", "--wait", "--timeout", "2m"); err != nil {
		t.Fatalf("helm upgrade (taking the NetworkAttachmentDefinition over): %v", err)
	}
	if m, found, err := c.nadMeta(ctx); err != nil || !found || m.Annotations["meta.helm.sh/release-name"] != "nftmesh" || m.Annotations["helm.sh/resource-policy"] != "keep" {
		t.Errorf("NetworkAttachmentDefinition after the hand-over: found %v, annotations %v (%v)", found, m.Annotations, err)
	}
	handover := time.Since(t0)

	// An injected pod (pilot.cni.provider=multus adds the network) starts
	// through the shim and the standalone config.
	template.Annotations["k8s.v1.cni.cncf.io/networks"] = "default/istio-cni"
	t1 := time.Now()
	c.createMeshPod(t, template, "multus-0")
	restarts, err := c.waitCaptured(ctx, "multus-0")
	if err != nil {
		t.Fatalf("%v\n%s", err, c.describePod(ctx, meshNS, "multus-0"))
	}
	started := time.Since(t1)
	if restarts != 0 {
		t.Errorf("multus-0: istio-validation ran %d times: not captured at its start", restarts+1)
	}
	lines, err := c.pluginLines("multus-0")
	if err != nil {
		t.Fatal(err)
	}
	adds := 0
	for _, l := range lines {
		if l.Command == "ADD" && l.Decision != "error" {
			adds++
		}
	}
	if adds != 1 {
		t.Errorf("multus-0: %d successful ADD lines in the plugin log, want 1: %+v", adds, lines)
	}
	if b, err := os.ReadFile(c.PrimaryConflist); err != nil || !bytes.Equal(b, primaryBefore) {
		t.Errorf("the primary conflist changed in standalone mode (%v):\n%s", err, b)
	}
	if fs, err := os.ReadDir(c.CNIConfDir); err == nil {
		for _, f := range fs {
			if b, err := os.ReadFile(filepath.Join(c.CNIConfDir, f.Name())); err == nil && bytes.Contains(b, []byte("nftmesh-cni")) {
				t.Errorf("standalone mode wrote into the runtime's conf dir: %s:\n%s", f.Name(), b)
			}
		}
	}

	c.deleteMesh(t)
	t2 := time.Now()
	if _, err := c.Helm(ctx, "uninstall", "nftmesh", "-n", agentNS, "--wait", "--timeout", "2m"); err != nil {
		t.Fatal(err)
	}
	if err := c.poll(ctx, 60*time.Second, "agent pods gone", func() (bool, error) {
		l, err := c.Client.CoreV1().Pods(agentNS).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=nftmesh-agent"})
		return err == nil && len(l.Items) == 0, nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(foreign); !os.IsNotExist(err) {
		t.Errorf("the standalone config %s is still there after helm uninstall (%v)", foreign, err)
	}
	if _, found, err := c.nadMeta(ctx); err != nil || !found {
		t.Errorf("the NetworkAttachmentDefinition with keep=true is gone after helm uninstall (%v)", err)
	}
	if err := c.Client.Discovery().RESTClient().Delete().AbsPath(nadPath).Do(ctx).Error(); err != nil {
		t.Error(err)
	}
	record("standalone (Multus stand-in): install beside Istio's file → hand-over done %.2fs; injected pod through the NetworkAttachmentDefinition Running and captured %.2fs; uninstall %.2fs",
		handover.Seconds(), started.Seconds(), time.Since(t2).Seconds())
}

// agentReady says whether the only agent pod is Ready.
func (c *Cluster) agentReady(ctx context.Context) (bool, error) {
	l, err := c.Client.CoreV1().Pods(agentNS).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=nftmesh-agent"})
	if err != nil || len(l.Items) != 1 {
		return false, fmt.Errorf("agent pods: %v (%d)", err, len(l.Items))
	}
	for _, cond := range l.Items[0].Status.Conditions {
		if cond.Type == "Ready" {
			return cond.Status == "True", nil
		}
	}
	return false, nil
}
