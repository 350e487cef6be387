package cluster

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftmesh/nftmesh/e2e/cluster/standin"
	"github.com/nftmesh/nftmesh/podinfo/meshpod"
	"github.com/nftmesh/nftmesh/testkit/imagetest"
	"github.com/nftmesh/nftmesh/testkit/istiotest"
	"github.com/nftmesh/nftmesh/testkit/linkerdtest"
)

const (
	linkerdImage   = "localhost/linkerd-standin:e2e"
	linkerdPodFile = "inject_emojivoto_deployment_no_init_container" // Linkerd's injector output, CNI mode
	linkerdAppPort = 80                                              // the injected app's containerPort
)

// TestLinkerdPodsBesideIstio: with the chart installed with
// `--set linkerd.enabled=true`, a pod Linkerd's injector wrote in CNI mode
// (shared/oracles/linkerd) starts on the node through the chain with its
// images swapped for offline stand-ins: its linkerd-network-validator
// init container (the stand-in doing Linkerd's check with the injector's
// arguments, as UID 65534) passes on its first run; the app's outbound
// connection lands on the stand-in proxy's 4140 with its original
// destination, another pod's inbound connection to the app's port on its
// 4143, and the proxy's own connection (UID 2102) leaves uncaptured. The
// agent ran the pod's ADD from its watches. An Istio-injected workload
// runs captured beside it on the same node.
func TestLinkerdPodsBesideIstio(t *testing.T) {
	c := need(t)
	oracle, err := linkerdtest.OracleDir()
	if err != nil {
		t.Skipf("skipping: %v", err)
	}
	ctx := context.Background()
	installChart(t, c)
	c.setLinkerd(t, true)
	t.Cleanup(func() { c.deleteMesh(t); c.setLinkerd(t, false) })
	if err := c.importLinkerdImage(ctx); err != nil {
		t.Fatal(err)
	}

	// Named as assertion 2's peer: checkInjected expects its answers.
	peer, _, err := c.createAndWait(ctx, linkerdPlainPod("mesh-peer", "-listen="+strconv.Itoa(peerPort)), 90*time.Second)
	if err != nil {
		t.Fatalf("%v (%s)", err, podState(peer))
	}
	peerAddr := netip.AddrPortFrom(netip.MustParseAddr(peer.Status.PodIP), peerPort)

	// The Istio side: one workload of Istio's injector, as assertion 2 runs it.
	istio := c.startIstioBeside(ctx, t, peerAddr)

	pod, err := linkerdInjectedPod(oracle, peerAddr)
	if err != nil {
		t.Fatal(err)
	}
	lk, took, err := c.createAndWait(ctx, pod, 120*time.Second)
	if err != nil {
		t.Fatalf("%v (%s)", err, podState(lk))
	}
	record("pods: a Linkerd-injected pod (validator stand-in), created → Running %v", took.Round(time.Millisecond))
	checkValidatorFirstRun(t, lk)
	if line := c.agentLogLine(ctx, t, meshNS, lk.Name, "ADD"); line["reason"] != meshpod.ReasonLinkerdInMesh || line["ran_by"] != "agent" || line["lookup"] != "agent" {
		t.Errorf("the plugin's decision for %s: %v, want %q, run and looked up by the agent", lk.Name, line, meshpod.ReasonLinkerdInMesh)
	}
	podIP := netip.MustParseAddr(lk.Status.PodIP)
	c.expectDial(ctx, t, "the Linkerd app's outbound connection", lk.Name, "web-svc", peerAddr.String(),
		reply{pod: lk.Name, listener: standin.AppListener(4140), orig: peerAddr.String()})
	c.expectDial(ctx, t, "the Linkerd proxy's own connection (UID 2102)", lk.Name, meshpod.LinkerdProxyContainer, peerAddr.String(),
		reply{pod: peer.Name, listener: standin.AppListener(peerPort), orig: peerAddr.String()})
	appAddr := netip.AddrPortFrom(podIP, linkerdAppPort).String()
	dials := []string{"-every=" + dialEvery, "-connect=" + appAddr}
	if istio != nil {
		for _, port := range appPorts(istio.pod) {
			dials = append(dials, "-connect="+netip.AddrPortFrom(netip.MustParseAddr(istio.pod.Status.PodIP), uint16(port)).String())
		}
	}
	prober, _, err := c.createAndWait(ctx, linkerdPlainPod("lk-prober", dials...), 90*time.Second)
	if err != nil {
		t.Fatalf("%v (%s)", err, podState(prober))
	}
	c.expectDial(ctx, t, "another pod's connection to the Linkerd app", prober.Name, "app", appAddr,
		reply{pod: lk.Name, listener: standin.AppListener(4143), orig: appAddr})

	if istio != nil {
		t.Run("istio beside it", func(t *testing.T) {
			c.checkInjected(ctx, t, istio, peerAddr, "udp://"+netip.AddrPortFrom(peerAddr.Addr(), 53).String(), prober.Name)
		})
	}
}

// setLinkerd turns the chart's Linkerd support on or off, keeping every
// other value (the agent's DaemonSet rolls).
func (c *Cluster) setLinkerd(t *testing.T, on bool) {
	t.Helper()
	chartMu.Lock()
	defer chartMu.Unlock()
	args := append([]string{"upgrade"}, helmInstallArgs(c)[1:]...)
	args = append(args, "--reuse-values", "--set", "linkerd.enabled="+strconv.FormatBool(on))
	args = slicesDelete(args, "--create-namespace")
	if _, err := c.Helm(context.Background(), args...); err != nil {
		t.Fatalf("helm upgrade --set linkerd.enabled=%v (the chart's Linkerd profile): %v", on, err)
	}
}

func slicesDelete(s []string, v string) []string {
	out := s[:0:0]
	for _, x := range s {
		if x != v {
			out = append(out, x)
		}
	}
	return out
}

// importLinkerdImage builds and imports the image the Linkerd pod's
// containers run: standin-app (the app, and the proxy on 4143/4140) and
// the linkerd-network-validator stand-in.
func (c *Cluster) importLinkerdImage(ctx context.Context) error {
	dir := filepath.Join(c.Dir, "images", "linkerd-standin")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var files []imagetest.File
	for _, name := range []string{"standin-app", "linkerd-network-validator"} {
		out := filepath.Join(dir, name)
		if err := goBuild(repo, "./e2e/cluster/standin/cmd/"+name, out); err != nil {
			return err
		}
		files = append(files, imagetest.File{Path: "/usr/local/bin/" + name, Src: out})
	}
	tar := filepath.Join(c.Dir, "images", "linkerd-standin.tar")
	if err := imagetest.Write(tar, imagetest.Spec{Tag: linkerdImage, Files: files, Entrypoint: []string{"/usr/local/bin/standin-app"}}); err != nil {
		return fmt.Errorf("building the Linkerd stand-in image: %w", err)
	}
	return c.importImages(ctx, []string{tar})
}

// linkerdPlainPod is a pod outside any mesh running standin-app with args.
func linkerdPlainPod(name string, args ...string) *corev1.Pod {
	p := standinPod(name, args...)
	p.Spec.Containers[0].Image = linkerdImage
	return p
}

// linkerdInjectedPod is the reference's CNI-mode pod with its images
// swapped: the validator stand-in with the injector's arguments and user,
// standin-app for the app (dialling peer) and for the proxy (serving 4143
// and 4140 as UID 2102, dialling peer). Probes, hooks, volumes and env
// from fields are dropped: they need Linkerd's control plane.
func linkerdInjectedPod(oracle string, peer netip.AddrPort) (*corev1.Pod, error) {
	pods, err := linkerdtest.Pods(oracle)
	if err != nil {
		return nil, err
	}
	var ref *corev1.Pod
	for _, p := range pods {
		if p.File == linkerdPodFile {
			ref = p.Pod
		}
	}
	if ref == nil {
		return nil, fmt.Errorf("no %s.yaml in %s/pods", linkerdPodFile, oracle)
	}
	grace := int64(1)
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "lk-web", Namespace: meshNS, Labels: ref.Labels, Annotations: ref.Annotations}}
	pod.Spec.TerminationGracePeriodSeconds = &grace
	labelled(&pod.ObjectMeta)
	connect := "-connect=" + peer.String()
	// The proxy and the app run standin-app; the proxy as the injector
	// placed it: a container, or a native sidecar (an init container that
	// restarts Always) after the validator, as here.
	standinOf := func(ct corev1.Container) corev1.Container {
		out := corev1.Container{Name: ct.Name, Image: linkerdImage, ImagePullPolicy: corev1.PullNever, RestartPolicy: ct.RestartPolicy,
			Command: []string{"/usr/local/bin/standin-app"}, Args: []string{"-every=" + dialEvery, connect}, Ports: ct.Ports}
		if ct.Name == meshpod.LinkerdProxyContainer {
			out.Args = append(out.Args, "-listen=4143,4140")
			out.SecurityContext = ct.SecurityContext
		} else {
			out.Args = append(out.Args, "-listen="+strconv.Itoa(linkerdAppPort))
		}
		return out
	}
	for _, ic := range ref.Spec.InitContainers {
		switch ic.Name {
		case "linkerd-network-validator":
			pod.Spec.InitContainers = append(pod.Spec.InitContainers, corev1.Container{
				Name: ic.Name, Image: linkerdImage, ImagePullPolicy: corev1.PullNever,
				Command: []string{"/usr/local/bin/linkerd-network-validator"}, Args: ic.Args, SecurityContext: ic.SecurityContext,
			})
		case meshpod.LinkerdProxyContainer:
			pod.Spec.InitContainers = append(pod.Spec.InitContainers, standinOf(ic))
		default:
			return nil, fmt.Errorf("%s: unexpected init container %s", linkerdPodFile, ic.Name)
		}
	}
	for _, ct := range ref.Spec.Containers {
		pod.Spec.Containers = append(pod.Spec.Containers, standinOf(ct))
	}
	return pod, nil
}

// checkValidatorFirstRun: the validator's first run exited 0 (not a
// restart after a failure).
func checkValidatorFirstRun(t *testing.T, p *corev1.Pod) {
	t.Helper()
	for _, st := range p.Status.InitContainerStatuses {
		if st.Name != "linkerd-network-validator" {
			continue
		}
		if tm := st.State.Terminated; tm == nil || tm.ExitCode != 0 || st.RestartCount != 0 {
			t.Fatalf("linkerd-network-validator: %+v, restarts %d; want exit 0 on its first run", st.State, st.RestartCount)
		}
		t.Logf("ok: linkerd-network-validator passed on its first run")
		return
	}
	t.Fatalf("no linkerd-network-validator status in %s", podState(p))
}

// startIstioBeside runs one Istio-injected workload on the node (nil,
// logged, where Istio's pilot-agent is not built and CI is not set).
func (c *Cluster) startIstioBeside(ctx context.Context, t *testing.T, peer netip.AddrPort) *meshWorkload {
	t.Helper()
	pilotAgent, err := istiotest.PilotAgent()
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal(err)
		}
		t.Logf("no Istio pod beside the Linkerd one: %v", err)
		return nil
	}
	if err := c.importStandinImage(ctx, pilotAgent); err != nil {
		t.Fatal(err)
	}
	ca, err := os.ReadFile(c.pki.CA)
	if err != nil {
		t.Fatal(err)
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "istio-ca-root-cert", Labels: map[string]string{meshLabel: "true"}},
		Data: map[string]string{"root-cert.pem": string(ca)}}
	if _, err := c.Client.CoreV1().ConfigMaps(meshNS).Create(ctx, cm, metav1.CreateOptions{}); err != nil && !strings.Contains(err.Error(), "already exists") {
		t.Fatal(err)
	}
	files, err := filepath.Glob(filepath.Join(istiotest.TestdataDir(), "injected", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no injected manifests in %s (%v)", istiotest.TestdataDir(), err)
	}
	w := &meshWorkload{file: strings.TrimSuffix(filepath.Base(files[0]), ".yaml")}
	err = c.runInjected(ctx, files[0], w, istiotest.Standin{Image: standinImage, ProxyConnect: []string{peer.String()},
		AppConnect: []string{peer.String(), "udp://" + netip.AddrPortFrom(peer.Addr(), 53).String()}, Every: dialEvery})
	if err != nil {
		t.Fatal(err)
	}
	return w
}
