package charts

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/nftmesh/nftmesh/installer"
	"github.com/nftmesh/nftmesh/installer/inplace"
	"github.com/nftmesh/nftmesh/installer/metrics"
	"github.com/nftmesh/nftmesh/installer/repair"
	"github.com/nftmesh/nftmesh/nft"
	"github.com/nftmesh/nftmesh/testkit/cgrouptest"
	"github.com/nftmesh/nftmesh/testkit/kubetest"
)

const agentNS = "nftmesh-system"

// meshPod is an injected pod on node; broken means its istio-validation
// init container last exited 126 (it started without capture).
func meshPod(t *testing.T, c kubernetes.Interface, ns, name, node string, broken bool) *corev1.Pod {
	t.Helper()
	ctx := context.Background()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Annotations: map[string]string{"sidecar.istio.io/status": `{"initContainers":["istio-validation"]}`}},
		Spec: corev1.PodSpec{
			NodeName:       node,
			InitContainers: []corev1.Container{{Name: "istio-validation", Image: "registry.example/proxyv2:1"}},
			Containers:     []corev1.Container{{Name: "app", Image: "registry.example/app:1"}, {Name: "istio-proxy", Image: "registry.example/proxyv2:1"}},
		},
	}
	p, err := c.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	st := corev1.ContainerStatus{Name: "istio-validation", Image: "registry.example/proxyv2:1"}
	if broken {
		st.RestartCount = 2
		st.State = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}}
		st.LastTerminationState = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 126, Reason: "Error", Message: "iptables validation failed"}}
	} else {
		st.State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed"}}
	}
	p.Status = corev1.PodStatus{Phase: corev1.PodPending, InitContainerStatuses: []corev1.ContainerStatus{st}}
	p, err = c.CoreV1().Pods(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// waitChartRBAC waits until the authorizer grants the agent's
// ServiceAccount every rule of the ClusterRoles the chart bound to it: RBAC
// reaches the authorizer through an informer, a moment after helm returns.
func waitChartRBAC(t *testing.T, s *kubetest.Server) {
	t.Helper()
	ctx := context.Background()
	bindings, err := s.Client().RbacV1().ClusterRoleBindings().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, b := range bindings.Items {
		for _, sub := range b.Subjects {
			if sub.Kind != "ServiceAccount" || sub.Namespace != agentNS || sub.Name != "nftmesh-agent" || b.RoleRef.Kind != "ClusterRole" {
				continue
			}
			role, err := s.Client().RbacV1().ClusterRoles().Get(ctx, b.RoleRef.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			s.WaitAllowed(t, agentNS, "nftmesh-agent", "", role.Rules...)
			n++
		}
	}
	if n == 0 {
		t.Fatal("the chart bound no ClusterRole to nftmesh-agent")
	}
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out: %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// The chart installs into a real kube-apiserver; its RBAC lets the plugin's
// kubeconfig (written by the agent from the chart's ServiceAccount token)
// GET pods, and the agent list and watch its node's pods (the watch that
// answers the plugin), with repair off too, and do nothing else; each
// repair mode's role is enough for the repair controller to do its job and
// no more.
func TestChartOnRealAPIServer(t *testing.T) {
	helm(t)
	s := kubetest.Start(t)
	ctx := context.Background()
	admin := s.Client()
	dir := t.TempDir()
	kc := filepath.Join(dir, "admin.kubeconfig")
	if err := s.WriteKubeconfig(kc, s.AdminToken()); err != nil {
		t.Fatal(err)
	}
	helmArgs := func(verb string, set ...string) []string {
		a := []string{verb, "nftmesh", chartDir, "--kubeconfig", kc, "--namespace", agentNS}
		if verb == "install" {
			a = append(a, "--create-namespace")
		}
		for _, x := range set {
			a = append(a, "--set", x)
		}
		return a
	}

	out, err := runHelm(t, helmArgs("install", "repair.enabled=false")...)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "rollout status daemonset/nftmesh-agent") || !strings.Contains(out, "Repair: off") {
		t.Errorf("install output lacks the NOTES on how to check it:\n%s", out)
	}
	waitChartRBAC(t, s)
	if _, err := admin.AppsV1().DaemonSets(agentNS).Get(ctx, "nftmesh-agent", metav1.GetOptions{}); err != nil {
		t.Fatalf("DaemonSet not installed: %v", err)
	}
	if _, err := admin.CoreV1().ConfigMaps(agentNS).Get(ctx, "nftmesh-agent-config", metav1.GetOptions{}); err != nil {
		t.Fatalf("ConfigMap not installed: %v", err)
	}

	s.EnsureNamespace(t, "shop")
	web := meshPod(t, admin, "shop", "web-1", "node-1", false)

	// The agent's kubeconfig, built from the chart's ServiceAccount token
	// exactly as in the DaemonSet pod.
	sa := filepath.Join(dir, "sa")
	_ = os.MkdirAll(sa, 0o755)
	_ = os.WriteFile(filepath.Join(sa, "token"), []byte(s.TokenFor(t, agentNS, "nftmesh-agent")), 0o600)
	ca, err := os.ReadFile(s.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	_ = os.WriteFile(filepath.Join(sa, "ca.crt"), ca, 0o644)
	kcb, err := installer.RenderKubeconfig(s.Host, sa, "")
	if err != nil {
		t.Fatal(err)
	}
	rc, err := clientcmd.RESTConfigFromKubeConfig(kcb)
	if err != nil {
		t.Fatal(err)
	}
	plugin := kubernetes.NewForConfigOrDie(rc)
	if got, err := plugin.CoreV1().Pods("shop").Get(ctx, "web-1", metav1.GetOptions{}); err != nil || got.UID != web.UID {
		t.Fatalf("the plugin's GET with the chart's RBAC: %v", err)
	}
	// The agent's watch of its node's pods, as it asks for it: a paged
	// list and a watch of every namespace, scoped by field selector.
	onNode := metav1.ListOptions{FieldSelector: "spec.nodeName=node-1", Limit: 100}
	if l, err := plugin.CoreV1().Pods("").List(ctx, onNode); err != nil || len(l.Items) != 1 || l.Items[0].UID != web.UID {
		t.Fatalf("the agent's list of its node's pods with the chart's RBAC (repair off): %v", err)
	}
	w, err := plugin.CoreV1().Pods("").Watch(ctx, metav1.ListOptions{FieldSelector: onNode.FieldSelector})
	if err != nil {
		t.Fatalf("the agent's watch of its node's pods with the chart's RBAC (repair off): %v", err)
	}
	w.Stop()
	forbidden := map[string]error{}
	forbidden["delete pod"] = plugin.CoreV1().Pods("shop").Delete(ctx, "web-1", metav1.DeleteOptions{})
	_, forbidden["patch pod status"] = plugin.CoreV1().Pods("shop").Patch(ctx, "web-1", types.MergePatchType, []byte(`{"metadata":{"labels":{"x":"y"}}}`), metav1.PatchOptions{}, "status")
	_, forbidden["create pod"] = plugin.CoreV1().Pods("shop").Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "x"}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "x", Image: "x"}}}}, metav1.CreateOptions{})
	_, forbidden["get secret"] = plugin.CoreV1().Secrets(agentNS).Get(ctx, "any", metav1.GetOptions{})
	_, forbidden["get configmap"] = plugin.CoreV1().ConfigMaps(agentNS).Get(ctx, "nftmesh-agent-config", metav1.GetOptions{})
	_, forbidden["list nodes"] = plugin.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	_, forbidden["get namespace"] = plugin.CoreV1().Namespaces().Get(ctx, "shop", metav1.GetOptions{})
	_, forbidden["update node"] = plugin.CoreV1().Nodes().Update(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}}, metav1.UpdateOptions{})
	for what, err := range forbidden {
		if !apierrors.IsForbidden(err) {
			t.Errorf("%s with the plugin's RBAC: %v, want forbidden", what, err)
		}
	}

	runRepair := func(t *testing.T, args ...string) context.CancelFunc {
		t.Helper()
		cfg, err := installer.ParseConfig(append([]string{"--service-account-dir=", "--repair-enabled", "--node-name", "node-1"}, args...), func(string) (string, bool) { return "", false })
		if err != nil {
			t.Fatal(err)
		}
		// The controller authenticates as the chart's ServiceAccount.
		c := kubernetes.NewForConfigOrDie(s.ConfigFor(s.TokenFor(t, agentNS, "nftmesh-agent")))
		m := metrics.New()
		rcon, err := repair.New(c.CoreV1(), cfg.Repair, nil, zerolog.New(io.Discard), m)
		if err != nil {
			t.Fatal(err)
		}
		cctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- rcon.Run(cctx) }()
		return func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("repair controller: %v", err)
			}
		}
	}

	t.Run("label mode", func(t *testing.T) {
		if _, err := runHelm(t, helmArgs("upgrade", "repair.enabled=true", "repair.repairPods=false", "repair.labelPods=true")...); err != nil {
			t.Fatal(err)
		}
		waitChartRBAC(t, s)
		broken := meshPod(t, admin, "shop", "broken-l", "node-1", true)
		other := meshPod(t, admin, "shop", "broken-other-node", "node-2", true)
		stop := runRepair(t, "--repair-label-pods")
		defer stop()
		eventually(t, "broken pod labelled", func() bool {
			p, err := admin.CoreV1().Pods("shop").Get(ctx, broken.Name, metav1.GetOptions{})
			return err == nil && p.Labels["cni.istio.io/uninitialized"] == "true"
		})
		eventually(t, "event recorded", func() bool {
			evs, err := admin.CoreV1().Events("shop").List(ctx, metav1.ListOptions{})
			if err != nil {
				return false
			}
			for _, e := range evs.Items {
				if e.Reason == "LabelBrokenPod" && e.InvolvedObject.Name == broken.Name {
					return true
				}
			}
			return false
		})
		for _, n := range []string{web.Name, other.Name} {
			p, err := admin.CoreV1().Pods("shop").Get(ctx, n, metav1.GetOptions{})
			if err != nil || p.Labels["cni.istio.io/uninitialized"] != "" {
				t.Errorf("pod %s should be untouched (healthy or on another node): %v %v", n, err, p.Labels)
			}
		}
		sac := kubernetes.NewForConfigOrDie(s.ConfigFor(s.TokenFor(t, agentNS, "nftmesh-agent")))
		if err := sac.CoreV1().Pods("shop").Delete(ctx, web.Name, metav1.DeleteOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("label mode may delete pods: %v", err)
		}
	})

	t.Run("delete mode", func(t *testing.T) {
		if _, err := runHelm(t, helmArgs("upgrade", "repair.enabled=true", "repair.repairPods=false", "repair.deletePods=true")...); err != nil {
			t.Fatal(err)
		}
		waitChartRBAC(t, s)
		broken := meshPod(t, admin, "shop", "broken-d", "node-1", true)
		stop := runRepair(t, "--repair-delete-pods")
		defer stop()
		// A pod bound to a node is deleted gracefully: with no kubelet to
		// confirm, it stays with a deletion timestamp.
		eventually(t, "broken pod deleted", func() bool {
			p, err := admin.CoreV1().Pods("shop").Get(ctx, broken.Name, metav1.GetOptions{})
			return apierrors.IsNotFound(err) || (err == nil && p.DeletionTimestamp != nil)
		})
		for _, n := range []string{web.Name, "broken-other-node"} {
			if p, err := admin.CoreV1().Pods("shop").Get(ctx, n, metav1.GetOptions{}); err != nil || p.DeletionTimestamp != nil {
				t.Errorf("pod %s (healthy or on another node) deleted: %v", n, err)
			}
		}
		sac := kubernetes.NewForConfigOrDie(s.ConfigFor(s.TokenFor(t, agentNS, "nftmesh-agent")))
		if _, err := sac.CoreV1().Pods("shop").Patch(ctx, web.Name, types.MergePatchType, []byte(`{"metadata":{"labels":{"x":"y"}}}`), metav1.PatchOptions{}, "status"); !apierrors.IsForbidden(err) {
			t.Errorf("delete mode may patch pod status: %v", err)
		}
	})

	t.Run("repair in place mode (default)", func(t *testing.T) {
		if os.Geteuid() != 0 {
			t.Skip("skipping: needs root (a network namespace and a process in it stand in for the running pod)")
		}
		if _, err := runHelm(t, helmArgs("upgrade", "repair.enabled=true")...); err != nil {
			t.Fatal(err)
		}
		waitChartRBAC(t, s)
		nsName := "e2e-chart-" + strings.ReplaceAll(time.Now().Format("150405.000"), ".", "")
		ip := "100.127.31.7"
		for _, args := range [][]string{
			{"netns", "add", nsName},
			{"-n", nsName, "link", "add", "eth0", "type", "veth", "peer", "name", "p0"},
			{"-n", nsName, "addr", "add", ip + "/24", "dev", "eth0"},
			{"-n", nsName, "link", "set", "eth0", "up"},
		} {
			if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
				t.Fatalf("ip %v: %v\n%s", args, err, out)
			}
			if args[0] == "netns" {
				t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", nsName).Run() })
			}
		}
		pause := exec.Command("ip", "netns", "exec", nsName, "sleep", "300")
		if err := pause.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = pause.Process.Kill(); _ = pause.Wait() })
		eventually(t, "sleeper in the pod namespace", func() bool {
			b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pause.Process.Pid))
			return strings.TrimSpace(string(b)) == "sleep"
		})

		broken := meshPod(t, admin, "shop", "broken-r", "node-1", true)
		broken.Status.PodIP = ip
		broken.Status.PodIPs = []corev1.PodIP{{IP: ip}}
		if _, err := admin.CoreV1().Pods("shop").UpdateStatus(ctx, broken, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		// In the pod's cgroup, as kubelet puts it: repair in place takes
		// a namespace outside it only on a host where no pod runs, and a
		// cluster on this machine (another test's) makes pods.
		cgrouptest.MovePod(t, pause.Process.Pid, cgrouptest.CgroupfsLeaf(string(broken.UID)))
		// The agent's own configuration as the chart renders it, with the
		// host's /proc at /proc since this test runs on the host.
		cfg, err := installer.ParseConfig([]string{"--service-account-dir=", "--repair-enabled", "--repair-pods", "--node-name", "node-1", "--host-proc", "/proc", "--backend", "nftables"}, func(string) (string, bool) { return "", false })
		if err != nil {
			t.Fatal(err)
		}
		r, err := inplace.New(inplace.Options{ProcDir: cfg.Repair.HostProc, Backend: cfg.Backend, ExcludeNamespaces: cfg.ExcludeNamespaces})
		if err != nil {
			t.Fatal(err)
		}
		c := kubernetes.NewForConfigOrDie(s.ConfigFor(s.TokenFor(t, agentNS, "nftmesh-agent")))
		m := metrics.New()
		rcon, err := repair.New(c.CoreV1(), cfg.Repair, r, zerolog.New(io.Discard), m)
		if err != nil {
			t.Fatal(err)
		}
		cctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- rcon.Run(cctx) }()
		defer func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("repair controller: %v", err)
			}
		}()
		eventually(t, "rules in the broken pod's namespace", func() bool {
			p, err := nft.New().List(ctx, "/run/netns/"+nsName)
			return err == nil && len(p.Tables) > 0
		})
		// The table is visible as soon as the batch commits; the repair
		// counts once Apply has also done the routes and returned.
		eventually(t, "the repair counted", func() bool {
			return testutil.ToFloat64(m.Repairs.WithLabelValues("repair", "success")) >= 1
		})
		if got := testutil.ToFloat64(m.Repairs.WithLabelValues("repair", "success")); got != 1 {
			t.Errorf("repair successes %v, want 1", got)
		}
		if err := c.CoreV1().Pods("shop").Delete(ctx, web.Name, metav1.DeleteOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("repair-in-place mode may delete pods: %v", err)
		}
	})

	if _, err := runHelm(t, "uninstall", "nftmesh", "--kubeconfig", kc, "--namespace", agentNS); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().ClusterRoles().Get(ctx, "nftmesh-agent", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("ClusterRole left after uninstall: %v", err)
	}
}

// nadCRD is Multus's NetworkAttachmentDefinition CRD, reduced to what an
// API server needs to store the chart's object.
const nadCRD = `{"apiVersion":"apiextensions.k8s.io/v1","kind":"CustomResourceDefinition",
"metadata":{"name":"network-attachment-definitions.k8s.cni.cncf.io"},
"spec":{"group":"k8s.cni.cncf.io","scope":"Namespaced",
"names":{"plural":"network-attachment-definitions","singular":"network-attachment-definition","kind":"NetworkAttachmentDefinition","shortNames":["net-attach-def"]},
"versions":[{"name":"v1","served":true,"storage":true,"schema":{"openAPIV3Schema":{"type":"object","x-kubernetes-preserve-unknown-fields":true}}}]}}`

// A real API server accepts what the Istio values file and each platform
// render: the GKE quota, OpenShift's NetworkAttachmentDefinition in
// default and its SCC rule, the seccomp, AppArmor and NetworkPolicy objects.
func TestPlatformsAndIstioValuesOnRealAPIServer(t *testing.T) {
	helm(t)
	s := kubetest.Start(t)
	ctx := context.Background()
	admin := s.Client()
	kc := filepath.Join(t.TempDir(), "admin.kubeconfig")
	if err := s.WriteKubeconfig(kc, s.AdminToken()); err != nil {
		t.Fatal(err)
	}
	if err := admin.CoreV1().RESTClient().Post().AbsPath("/apis/apiextensions.k8s.io/v1/customresourcedefinitions").
		SetHeader("Content-Type", "application/json").Body([]byte(nadCRD)).Do(ctx).Error(); err != nil {
		t.Fatalf("creating the NetworkAttachmentDefinition CRD: %v", err)
	}
	nadPath := func(ns, name string) string {
		return fmt.Sprintf("/apis/k8s.cni.cncf.io/v1/namespaces/%s/network-attachment-definitions/%s", ns, name)
	}
	eventually(t, "the CRD served", func() bool {
		err := admin.CoreV1().RESTClient().Get().AbsPath("/apis/k8s.cni.cncf.io/v1/namespaces/default/network-attachment-definitions").Do(ctx).Error()
		return err == nil
	})
	helmDo := func(verb string, args ...string) string {
		t.Helper()
		a := append([]string{verb, "nftmesh", chartDir, "--kubeconfig", kc, "--namespace", agentNS, "--create-namespace"}, args...)
		if verb == "upgrade" {
			a = append(a, "--reset-values")
		}
		out, err := runHelm(t, a...)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}

	out := helmDo("install", "-f", filepath.Join("testdata", "istio-cni-values.yaml"))
	// The notes name what nothing reads (the other charts' globals, and
	// cniNetnsDir, which Istio mounts in ambient mode only, and Istio's
	// image values) and nftmesh's image, which Istio's values never pick.
	for _, want := range []string{"global.meshID", "global.istioNamespace", "cniNetnsDir", "hub, image, tag, variant (Istio's install-cni image", "Image: " + defaultImage} {
		if !strings.Contains(out, want) {
			t.Errorf("install notes lack %q:\n%s", want, out)
		}
	}
	q, err := admin.CoreV1().ResourceQuotas(agentNS).Get(ctx, "nftmesh-agent-resource-quota", metav1.GetOptions{})
	if err != nil || q.Spec.Hard.Pods().Value() != 64 {
		t.Errorf("resource quota: %v %+v", err, q)
	}
	// The network policy as stored: scrapes from the default scraper
	// namespace only; then scrapers by namespace and pod together, and by
	// address, which the API server validates too.
	np, err := admin.NetworkingV1().NetworkPolicies(agentNS).Get(ctx, "nftmesh-agent", metav1.GetOptions{})
	if err != nil {
		t.Errorf("network policy: %v", err)
	} else if got := ingressPorts(np); !slices.Equal(got, []string{"15014 from [ns{kubernetes.io/metadata.name=monitoring}]"}) {
		t.Errorf("network policy ingress as stored: %q", got)
	}
	helmDo("upgrade", "-f", filepath.Join("testdata", "istio-cni-values.yaml"), "--set-json",
		`networkPolicy.metricsFrom=[{"namespaceSelector":{"matchLabels":{"kubernetes.io/metadata.name":"istio-system"}},"podSelector":{"matchLabels":{"app.kubernetes.io/name":"prometheus"}}},{"ipBlock":{"cidr":"192.0.2.0/24"}}]`)
	np, err = admin.NetworkingV1().NetworkPolicies(agentNS).Get(ctx, "nftmesh-agent", metav1.GetOptions{})
	if err != nil {
		t.Errorf("network policy: %v", err)
	} else if got := ingressPorts(np); !slices.Equal(got, []string{"15014 from [ns{kubernetes.io/metadata.name=istio-system}+pod{app.kubernetes.io/name=prometheus} ip{192.0.2.0/24}]"}) {
		t.Errorf("network policy ingress as stored after the upgrade: %q", got)
	}
	ds, err := admin.AppsV1().DaemonSets(agentNS).Get(ctx, "nftmesh-agent", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if sc := ds.Spec.Template.Spec.Containers[0].SecurityContext; sc.AppArmorProfile == nil || sc.SeccompProfile == nil || sc.SeccompProfile.LocalhostProfile == nil {
		t.Errorf("security context as stored: %+v", sc)
	}

	helmDo("upgrade", "--set", "platform=openshift")
	if err := admin.CoreV1().RESTClient().Get().AbsPath(nadPath("default", "istio-cni")).Do(ctx).Error(); err != nil {
		t.Errorf("NetworkAttachmentDefinition default/istio-cni: %v", err)
	}
	role, err := admin.RbacV1().ClusterRoles().Get(ctx, "nftmesh-agent", metav1.GetOptions{})
	if err != nil || len(role.Rules) != 2 || role.Rules[1].Resources[0] != "securitycontextconstraints" {
		t.Errorf("openshift ClusterRole: %v %+v", err, role)
	}
	if _, err := admin.CoreV1().ResourceQuotas(agentNS).Get(ctx, "nftmesh-agent-resource-quota", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("quota left after the upgrade to openshift: %v", err)
	}

	helmDo("upgrade", "--set", "platform=gke")
	q, err = admin.CoreV1().ResourceQuotas(agentNS).Get(ctx, "nftmesh-agent-resource-quota", metav1.GetOptions{})
	if err != nil || q.Spec.Hard.Pods().Value() != 5000 || q.Spec.ScopeSelector == nil || q.Spec.ScopeSelector.MatchExpressions[0].Values[0] != "system-node-critical" {
		t.Errorf("gke quota: %v %+v", err, q)
	}
	if err := admin.CoreV1().RESTClient().Get().AbsPath(nadPath("default", "istio-cni")).Do(ctx).Error(); !apierrors.IsNotFound(err) {
		t.Errorf("NetworkAttachmentDefinition left after the upgrade to gke: %v", err)
	}
	ds, err = admin.AppsV1().DaemonSets(agentNS).Get(ctx, "nftmesh-agent", metav1.GetOptions{})
	if err != nil || hostPath(ds, "cni-bin-dir") != "/home/kubernetes/bin" {
		t.Errorf("gke bin dir: %v", err)
	}
	if _, err := runHelm(t, "uninstall", "nftmesh", "--kubeconfig", kc, "--namespace", agentNS); err != nil {
		t.Fatal(err)
	}
}

// The OpenShift hand-over of the NetworkAttachmentDefinition both charts
// create, as docs/migrate-from-istio-cni.md gives it: beside Istio's
// release, nftmesh's installs only with networkAttachmentDefinition.create=false;
// after Istio's uninstall, an upgrade with create=true makes it nftmesh's.
func TestNetworkAttachmentDefinitionHandOverOnRealAPIServer(t *testing.T) {
	helm(t)
	s := kubetest.Start(t)
	ctx := context.Background()
	admin := s.Client()
	kc := filepath.Join(t.TempDir(), "admin.kubeconfig")
	if err := s.WriteKubeconfig(kc, s.AdminToken()); err != nil {
		t.Fatal(err)
	}
	if err := admin.CoreV1().RESTClient().Post().AbsPath("/apis/apiextensions.k8s.io/v1/customresourcedefinitions").
		SetHeader("Content-Type", "application/json").Body([]byte(nadCRD)).Do(ctx).Error(); err != nil {
		t.Fatalf("creating the NetworkAttachmentDefinition CRD: %v", err)
	}
	const path = "/apis/k8s.cni.cncf.io/v1/namespaces/default/network-attachment-definitions/istio-cni"
	get := func() (*metav1.PartialObjectMetadata, error) {
		b, err := admin.CoreV1().RESTClient().Get().AbsPath(path).DoRaw(ctx)
		if err != nil {
			return nil, err
		}
		o := &metav1.PartialObjectMetadata{}
		return o, json.Unmarshal(b, o)
	}
	eventually(t, "the CRD served", func() bool {
		err := admin.CoreV1().RESTClient().Get().AbsPath("/apis/k8s.cni.cncf.io/v1/namespaces/default/network-attachment-definitions").Do(ctx).Error()
		return err == nil
	})
	h := func(args ...string) error {
		_, err := runHelm(t, append(args, "--kubeconfig", kc)...)
		return err
	}
	if err := h("install", "istio-cni", filepath.Join("testdata", "istio-cni-nad"), "--namespace", "istio-system", "--create-namespace"); err != nil {
		t.Fatal(err)
	}
	if _, err := get(); err != nil {
		t.Fatal(err)
	}
	install := []string{"install", "nftmesh", chartDir, "--namespace", agentNS, "--create-namespace", "--set", "platform=openshift"}
	// The conflict the hand-over avoids.
	if err := h(install...); err == nil || !strings.Contains(err.Error(), "istio-cni") {
		t.Fatalf("nftmesh's release took Istio's NetworkAttachmentDefinition: %v", err)
	}
	_ = h("uninstall", "nftmesh", "--namespace", agentNS)
	if err := h(append(install, "--set", "networkAttachmentDefinition.create=false")...); err != nil {
		t.Fatalf("beside Istio's release: %v", err)
	}
	// helm uninstall goes by the release's manifest (a keep annotation on
	// the live object does not count): Istio's release takes the object
	// with it, and nftmesh's creates it again right after.
	if err := h("uninstall", "istio-cni", "--namespace", "istio-system"); err != nil {
		t.Fatal(err)
	}
	if err := h("upgrade", "nftmesh", chartDir, "--namespace", agentNS, "--reuse-values", "--set", "networkAttachmentDefinition.create=true"); err != nil {
		t.Fatalf("taking over the NetworkAttachmentDefinition: %v", err)
	}
	o, err := get()
	if err != nil || o.Labels["app.kubernetes.io/name"] != "nftmesh-agent" || o.Annotations["meta.helm.sh/release-name"] != "nftmesh" {
		t.Fatalf("after the taking-over upgrade: %v %+v", err, o)
	}
}
