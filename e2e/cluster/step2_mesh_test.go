package cluster

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/nftmesh/nftmesh/e2e/cluster/standin"
	"github.com/nftmesh/nftmesh/podinfo"
	"github.com/nftmesh/nftmesh/testkit/istiotest"
)

const (
	standinImage = "localhost/istio-standin:e2e"
	meshNS       = "default"  // where the injector's manifests say they run
	peerPort     = 7070       // the peer pod's app port: every app and proxy dials it
	dialEvery    = "500ms"    // stand-ins' dial period
	meshLabel    = "e2e-mesh" // on every object this test creates, for cleanup
)

// meshWorkload is one injected manifest's workload running on the node.
type meshWorkload struct {
	file string
	pod  *corev1.Pod
	took time.Duration // Deployment created → pod Running
}

// TestIstioInjectedPods is assertion 2: every workload Istio's injector
// wrote (testdata/istio/injected) runs on the node through the chain with
// only its images and commands swapped for offline ones. istio-validation
// runs Istio's real pilot-agent with its injected arguments and must exit 0;
// the stand-in proxy must see the app's outbound connection with its
// original destination, another pod's inbound connection on 15006, and its
// own connection must leave uncaptured; the opted-out pod is not captured at
// all. The plugin's decision line for each pod is in the agent's log, and an
// independent reader (nft) finds our table in exactly the mesh pods.
func TestIstioInjectedPods(t *testing.T) {
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
	t.Cleanup(func() { c.deleteMesh(t) })

	t0 := time.Now()
	if err := c.importStandinImage(ctx, pilotAgent); err != nil {
		t.Fatal(err)
	}
	t.Logf("stand-in image (Istio's pilot-agent, standin-proxy, standin-app) built and imported in %.2fs", time.Since(t0).Seconds())

	// The injected pods mount this ConfigMap (istiod would publish it).
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

	// The rest of the cluster: a pod every app and proxy dials.
	peer, _, err := c.createAndWait(ctx, standinPod("mesh-peer", "-listen="+strconv.Itoa(peerPort)), 90*time.Second)
	if err != nil {
		t.Fatalf("%v (%s)", err, podState(peer))
	}
	peerAddr := netip.AddrPortFrom(netip.MustParseAddr(peer.Status.PodIP), peerPort)
	dnsTarget := "udp://" + netip.AddrPortFrom(peerAddr.Addr(), 53).String()

	files, err := filepath.Glob(filepath.Join(istiotest.TestdataDir(), "injected", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no injected manifests in %s (%v)", istiotest.TestdataDir(), err)
	}
	workloads := make([]*meshWorkload, len(files))
	done := make(chan error, len(files))
	for i, f := range files {
		w := &meshWorkload{file: strings.TrimSuffix(filepath.Base(f), ".yaml")}
		workloads[i] = w
		go func() {
			done <- c.runInjected(ctx, f, w, istiotest.Standin{
				Image: standinImage, ProxyConnect: []string{peerAddr.String()},
				AppConnect: []string{peerAddr.String(), dnsTarget}, Every: dialEvery,
			})
		}()
	}
	for range files {
		if err := <-done; err != nil {
			t.Error(err)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	var took []time.Duration
	for _, w := range workloads {
		took = append(took, w.took)
	}
	p50, p95 := percentiles(took)
	record("pods: injected workloads, Deployment created → pod Running, %d at once (n=%d): p50 %v p95 %v",
		len(took), len(took), p50.Round(time.Millisecond), p95.Round(time.Millisecond))

	// Another pod connects to every app port of every workload.
	var dials []string
	for _, w := range workloads {
		for _, port := range appPorts(w.pod) {
			dials = append(dials, "-connect="+netip.AddrPortFrom(netip.MustParseAddr(w.pod.Status.PodIP), uint16(port)).String())
		}
	}
	prober, _, err := c.createAndWait(ctx, standinPod("mesh-prober", append([]string{"-every=" + dialEvery}, dials...)...), 90*time.Second)
	if err != nil {
		t.Fatalf("%v (%s)", err, podState(prober))
	}

	for _, w := range workloads {
		t.Run(w.file, func(t *testing.T) { c.checkInjected(ctx, t, w, peerAddr, dnsTarget, prober.Name) })
	}
}

// standinPod is a pod outside the mesh running standin-app with args.
func standinPod(name string, args ...string) *corev1.Pod {
	grace := int64(1)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: meshNS, Labels: map[string]string{meshLabel: "true"}},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{
				Name: "app", Image: standinImage, ImagePullPolicy: corev1.PullNever,
				Command: []string{"/usr/local/bin/standin-app"}, Args: args,
			}},
		},
	}
}

// importStandinImage builds the one image the injected pods' containers run
// (Istio's pilot-agent, standin-proxy, standin-app) and imports it, once per
// cluster.
func (c *Cluster) importStandinImage(ctx context.Context, pilotAgent string) error {
	c.standinMu.Lock()
	defer c.standinMu.Unlock()
	if c.standinImported {
		return nil
	}
	dir := filepath.Join(c.Dir, "images", "standin")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", dir, err)
	}
	for _, name := range []string{"standin-proxy", "standin-app"} {
		if err := goBuild(repo, "./e2e/cluster/standin/cmd/"+name, filepath.Join(dir, name)); err != nil {
			return err
		}
	}
	tar := filepath.Join(c.Dir, "images", "standin.tar")
	if err := istiotest.StandinImage(pilotAgent, filepath.Join(dir, "standin-proxy"), filepath.Join(dir, "standin-app"), tar, standinImage); err != nil {
		return err
	}
	if err := c.importImages(ctx, []string{tar}); err != nil {
		return err
	}
	c.standinImported = true
	return nil
}

// runInjected creates one manifest's objects, its Deployment with the pod
// template rewritten by istiotest.Rewrite, and waits for its pod to run.
func (c *Cluster) runInjected(ctx context.Context, file string, w *meshWorkload, s istiotest.Standin) error {
	data, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	objs, err := istiotest.SplitManifests(data)
	if err != nil {
		return fmt.Errorf("%s: %w", w.file, err)
	}
	var dep *appsv1.Deployment
	for _, o := range objs {
		switch o.Kind {
		case "ServiceAccount":
			var sa corev1.ServiceAccount
			if err := yaml.Unmarshal(o.Raw, &sa); err != nil {
				return fmt.Errorf("%s: decoding ServiceAccount: %w", w.file, err)
			}
			labelled(&sa.ObjectMeta)
			if _, err := c.Client.CoreV1().ServiceAccounts(meshNS).Create(ctx, &sa, metav1.CreateOptions{}); err != nil {
				return fmt.Errorf("%s: %w", w.file, err)
			}
		case "Service":
			var svc corev1.Service
			if err := yaml.Unmarshal(o.Raw, &svc); err != nil {
				return fmt.Errorf("%s: decoding Service: %w", w.file, err)
			}
			labelled(&svc.ObjectMeta)
			if _, err := c.Client.CoreV1().Services(meshNS).Create(ctx, &svc, metav1.CreateOptions{}); err != nil {
				return fmt.Errorf("%s: %w", w.file, err)
			}
		case "Deployment":
			dep = &appsv1.Deployment{}
			if err := yaml.Unmarshal(o.Raw, dep); err != nil {
				return fmt.Errorf("%s: decoding Deployment: %w", w.file, err)
			}
		default:
			return fmt.Errorf("%s: unexpected %s %s", w.file, o.Kind, o.Name)
		}
	}
	if dep == nil {
		return fmt.Errorf("%s: no Deployment", w.file)
	}
	if err := istiotest.Rewrite(&dep.Spec.Template.Spec, s); err != nil {
		return fmt.Errorf("%s: %w", w.file, err)
	}
	labelled(&dep.ObjectMeta)
	selector := metav1.FormatLabelSelector(dep.Spec.Selector)
	t0 := time.Now()
	if _, err := c.Client.AppsV1().Deployments(meshNS).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("%s: %w", w.file, err)
	}
	var last *corev1.Pod
	err = c.poll(ctx, 120*time.Second, w.file+" pod Running", func() (bool, error) {
		l, err := c.Client.CoreV1().Pods(meshNS).List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil || len(l.Items) == 0 {
			return false, nil
		}
		last = &l.Items[0]
		if last.Status.Phase == corev1.PodFailed {
			return false, fmt.Errorf("%s: pod %s failed: %s", w.file, last.Name, podState(last))
		}
		return last.Status.Phase == corev1.PodRunning && last.Status.PodIP != "", nil
	})
	if err != nil {
		return fmt.Errorf("%s: %w (%s)", w.file, err, podState(last))
	}
	w.took = time.Since(t0)
	w.pod = last
	return nil
}

func labelled(m *metav1.ObjectMeta) {
	if m.Labels == nil {
		m.Labels = map[string]string{}
	}
	m.Labels[meshLabel] = "true"
}

// appPorts are the TCP ports the pod's app containers declare.
func appPorts(p *corev1.Pod) []int32 {
	var out []int32
	for _, ctr := range p.Spec.Containers {
		if ctr.Name == istiotest.ProxyContainer {
			continue
		}
		for _, port := range ctr.Ports {
			if port.Protocol == "" || port.Protocol == corev1.ProtocolTCP {
				out = append(out, port.ContainerPort)
			}
		}
	}
	return out
}

// logEvents reads a container's stand-in events through the apiserver and
// kubelet, like `kubectl logs`.
func (c *Cluster) logEvents(ctx context.Context, ns, pod, container string) ([]standin.Event, string, error) {
	raw, err := c.Client.CoreV1().Pods(ns).GetLogs(pod, &corev1.PodLogOptions{Container: container}).DoRaw(ctx)
	if err != nil {
		return nil, "", fmt.Errorf("reading logs of %s/%s %s: %w", ns, pod, container, err)
	}
	ev, err := standin.ParseEvents(strings.NewReader(string(raw)))
	return ev, string(raw), err
}

type reply struct{ pod, listener, orig string }

// expectDial waits until the dialer's log shows two dials of target
// answered as want; a dial answered by anyone else fails at once.
func (c *Cluster) expectDial(ctx context.Context, t *testing.T, what, pod, container, target string, want reply) {
	t.Helper()
	if err := c.waitDial(ctx, what, pod, container, target, want); err != nil {
		t.Fatal(err)
	}
	t.Logf("ok: %s to %s answered by %s on %s (orig %s)", what, target, want.pod, want.listener, want.orig)
}

// waitDial is expectDial returning its failure.
func (c *Cluster) waitDial(ctx context.Context, what, pod, container, target string, want reply) error {
	target = strings.TrimPrefix(target, "udp://")
	var last standin.Event
	var raw string
	err := c.poll(ctx, 30*time.Second, what, func() (bool, error) {
		ev, r, err := c.logEvents(ctx, meshNS, pod, container)
		if err != nil {
			return false, nil
		}
		raw = r
		ok := 0
		for _, e := range ev {
			if e.Target != target {
				continue
			}
			last = e
			if e.Event != standin.EventDialed || e.Reply == nil {
				continue
			}
			got := reply{pod: e.Reply.Pod, listener: e.Reply.Listener, orig: e.Reply.Orig}
			if want.orig == "" {
				got.orig = ""
			}
			if got != want {
				return false, fmt.Errorf("%s to %s: answered by %+v, want %+v", what, target, got, want)
			}
			ok++
		}
		return ok >= 2, nil
	})
	if err != nil {
		return fmt.Errorf("%w; last attempt %+v\n%s log:\n%s", err, last, container, lastLines(raw, 20))
	}
	return nil
}

// checkInjected runs the per-pod assertions of one workload.
func (c *Cluster) checkInjected(ctx context.Context, t *testing.T, w *meshWorkload, peer netip.AddrPort, dnsTarget, prober string) {
	pod, err := c.Client.CoreV1().Pods(meshNS).Get(ctx, w.pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	inMesh, reason, cs, err := podinfo.FromPod(pod)
	if err != nil {
		t.Fatalf("deciding on pod %s: %v", pod.Name, err)
	}
	t.Logf("pod %s: in mesh %v (%s), mode %s, Running %v after its Deployment", pod.Name, inMesh, reason, cs.InterceptionMode, w.took.Round(time.Millisecond))

	// istio-validation: Istio's real pilot-agent, exit 0.
	var validated bool
	for _, s := range pod.Status.InitContainerStatuses {
		if s.Name != istiotest.ValidationContainer {
			continue
		}
		validated = true
		if s.State.Terminated == nil || s.State.Terminated.ExitCode != 0 || s.RestartCount != 0 {
			t.Errorf("istio-validation: %+v restarts %d, want exit 0 at the first run", s.State, s.RestartCount)
		}
	}
	if inMesh && !validated {
		t.Errorf("mesh pod %s has no istio-validation status", pod.Name)
	}
	if !inMesh && validated {
		t.Errorf("opted-out pod %s has istio-validation", pod.Name)
	}

	// The plugin's decision, in the agent's log.
	line := c.agentLogLine(ctx, t, meshNS, pod.Name, "ADD")
	wantDecision := "skip"
	if inMesh {
		wantDecision = "capture"
	}
	if line["decision"] != wantDecision {
		t.Errorf("decision for %s: %v, want %s: %v", pod.Name, line["decision"], wantDecision, line)
	}

	// An independent reader: our table is in the pod's netns exactly when
	// the pod is in the mesh.
	netns, _ := line["netns"].(string)
	tables := c.nftTables(t, netns)
	if has := strings.Contains(tables, "nftmesh"); has != inMesh {
		t.Errorf("nft list tables in %s (%s): %q; want nftmesh table %v", pod.Name, netns, tables, inMesh)
	}

	appName := ""
	for _, ctr := range pod.Spec.Containers {
		if ctr.Name != istiotest.ProxyContainer {
			appName = ctr.Name
			break
		}
	}
	outbound := reply{pod: pod.Name, listener: standin.ListenerOutbound, orig: peer.String()}
	if !inMesh || istiotest.Excludes(cs, peer.Addr()) {
		outbound = reply{pod: "mesh-peer", listener: standin.AppListener(peerPort), orig: peer.String()}
	}
	c.expectDial(ctx, t, "app's outbound connection", pod.Name, appName, peer.String(), outbound)
	if inMesh && cs.CaptureDNS {
		c.expectDial(ctx, t, "app's DNS query", pod.Name, appName, dnsTarget, reply{pod: pod.Name, listener: standin.ListenerDNS})
	}
	for _, port := range appPorts(pod) {
		dst := netip.AddrPortFrom(netip.MustParseAddr(pod.Status.PodIP), uint16(port))
		want := reply{pod: pod.Name, listener: standin.ListenerInbound, orig: dst.String()}
		if !inMesh || !istiotest.CapturesInbound(cs, uint16(port)) {
			want = reply{pod: pod.Name, listener: standin.AppListener(uint16(port)), orig: dst.String()}
		}
		c.expectDial(ctx, t, "other pod's inbound connection", prober, "app", dst.String(), want)
	}
	if inMesh {
		c.expectDial(ctx, t, "proxy's own connection", pod.Name, istiotest.ProxyContainer, peer.String(),
			reply{pod: "mesh-peer", listener: standin.AppListener(peerPort), orig: peer.String()})
		ev, _, err := c.logEvents(ctx, meshNS, pod.Name, istiotest.ProxyContainer)
		if err != nil {
			t.Fatal(err)
		}
		if outbound.pod == pod.Name && !accepted(ev, outbound.listener, outbound.orig) {
			t.Errorf("the stand-in proxy logged no accepted %s connection to %s", outbound.listener, outbound.orig)
		}
	}
}

// nftTables lists the nftables tables of a pod's netns, read with nft in
// that namespace; the runtime pins it under the node's private /run.
func (c *Cluster) nftTables(t *testing.T, netns string) string {
	t.Helper()
	if netns == "" {
		t.Fatal("the decision line names no netns")
	}
	path := c.NodePath("/run/" + strings.TrimPrefix(strings.TrimPrefix(netns, "/var/run/"), "/run/"))
	out, err := exec.Command(c.bin.nsenter, "--net="+path, "--", "nft", "list", "tables").CombinedOutput()
	if err != nil {
		t.Fatalf("nft list tables in %s: %v\n%s", netns, err, out)
	}
	return strings.TrimSpace(string(out))
}

func accepted(ev []standin.Event, listener, orig string) bool {
	for _, e := range ev {
		if e.Event == standin.EventAccepted && e.Listener == listener && e.Orig == orig {
			return true
		}
	}
	return false
}

// deleteMesh removes everything TestIstioInjectedPods created and waits
// for the pods to be gone (their CNI DEL has run then).
func (c *Cluster) deleteMesh(t *testing.T) {
	ctx := context.Background()
	sel := metav1.ListOptions{LabelSelector: meshLabel + "=true"}
	del := metav1.DeleteOptions{}
	var errs []string
	note := func(err error) {
		if err != nil {
			errs = append(errs, err.Error())
		}
	}
	note(c.Client.AppsV1().Deployments(meshNS).DeleteCollection(ctx, del, sel))
	svcs, err := c.Client.CoreV1().Services(meshNS).List(ctx, sel)
	note(err)
	if err == nil {
		for _, s := range svcs.Items {
			note(c.Client.CoreV1().Services(meshNS).Delete(ctx, s.Name, del))
		}
	}
	note(c.Client.CoreV1().ServiceAccounts(meshNS).DeleteCollection(ctx, del, sel))
	note(c.Client.CoreV1().ConfigMaps(meshNS).DeleteCollection(ctx, del, sel))
	note(c.Client.CoreV1().Pods(meshNS).DeleteCollection(ctx, del, sel))
	// Pods of the Deployments go with their ReplicaSets (garbage
	// collector); the namespace holds no other pods by now.
	note(c.poll(ctx, 90*time.Second, "mesh pods gone", func() (bool, error) {
		l, err := c.Client.CoreV1().Pods(meshNS).List(ctx, metav1.ListOptions{})
		return err == nil && len(l.Items) == 0, nil
	}))
	if len(errs) > 0 {
		t.Errorf("cleaning up the mesh workloads: %s", strings.Join(errs, "; "))
	}
}
