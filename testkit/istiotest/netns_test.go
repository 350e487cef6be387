package istiotest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/nftmesh/nftmesh/e2e/cluster/standin"
	"github.com/nftmesh/nftmesh/iptables"
	"github.com/nftmesh/nftmesh/netlab"
	"github.com/nftmesh/nftmesh/nft"
	"github.com/nftmesh/nftmesh/podinfo"
	"github.com/nftmesh/nftmesh/redirect"

	"github.com/nftmesh/nftmesh/testkit/syncbuf"
)

// The "other pod" of the netns test: the peer namespace runs a stand-in app
// on this port, reachable on every address the peer owns.
const peerPort = 7070

// outside is where every app and proxy dials: an address the peer owns that
// the exclude-cidrs variant excludes (203.0.113.0/24) and nothing else does.
var outside = netip.AddrPortFrom(netlab.OtherV4Host, peerPort)

// TestInjectedPodsInNetns runs every pod Istio's injector wrote as a node
// would, in a throw-away pod network namespace wired to a peer namespace
// (the rest of the cluster), with nothing faked but the images:
//
//  1. podinfo reads the injected pod, nft applies the capture it decides;
//  2. Istio's real pilot-agent runs the injected istio-validation command
//     (its args, its environment, its UID/GID) and must exit 0;
//  3. the stand-in proxy (the injected istio-proxy identity, environment and
//     arguments behind the stand-in command) and the stand-in app run, the
//     peer runs a stand-in app too, and their logs must show: the app's
//     outbound connection on the proxy's 15001 with its original
//     destination (straight to the peer for excluded CIDRs), DNS on 15053
//     where captured, the peer's inbound connections on 15006 (or on the
//     app for a port not captured), and the proxy's own connection leaving
//     uncaptured. The opted-out pod gets no rules and no capture.
//
// A control first runs the validation without capture: Istio's check must
// fail with its exit code 126, or a passing validation would prove nothing.
func TestInjectedPodsInNetns(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces, applies nftables rules, runs processes as UID 1337")
	}
	if testing.Short() {
		t.Skip("builds the stand-ins and runs real traffic (-short)")
	}
	// Without pilot-agent the stand-ins still run; only Istio's check is
	// left out (and said so).
	agent, agentErr := PilotAgent()
	bins := buildStandins(t)
	pods := injectedPods(t)

	t.Run("validation-fails-without-capture", func(t *testing.T) {
		if agentErr != nil {
			t.Skip(agentErr)
		}
		p := pods[indexOf(pods, "httpbin")]
		topo := newTopology(t)
		spec := p.Pod.Spec.DeepCopy()
		if err := Rewrite(spec, Standin{Image: "x", PilotAgent: agent}); err != nil {
			t.Fatal(err)
		}
		c := spec.InitContainers[0]
		argv := append(append(append([]string(nil), c.Command...), c.Args...), "--probe-timeout=1s")
		start := time.Now()
		code, out := runToEnd(t, topo.PodNetnsPath(), c, p.Pod.Spec.SecurityContext, argv)
		if code != 126 {
			t.Fatalf("validation without capture exited %d, want 126:\n%s", code, out)
		}
		t.Logf("validation without capture: exit 126 after %v (Istio's own check detects missing capture)", time.Since(start).Round(time.Millisecond))
	})

	for _, p := range pods {
		t.Run(p.File, func(t *testing.T) { runInjectedPod(t, p, agent, agentErr, bins) })
	}
}

func indexOf(pods []injectedPod, file string) int {
	for i, p := range pods {
		if p.File == file {
			return i
		}
	}
	panic("no injected pod " + file)
}

func runInjectedPod(t *testing.T, p injectedPod, agent string, agentErr error, bins standinBins) {
	inMesh, reason, cs, err := podinfo.FromPod(p.Pod)
	if err != nil {
		t.Fatal(err)
	}
	topo := newTopology(t)
	if inMesh {
		plan, err := redirect.Build(cs)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := nft.New().Apply(ctx, topo.PodNetnsPath(), plan); err != nil {
			t.Fatalf("applying the capture podinfo decided: %v", err)
		}
	} else {
		t.Logf("not in mesh (%s): no rules", reason)
	}

	targets := []string{outside.String()}
	if cs.CaptureDNS {
		targets = append(targets, "udp://"+netip.AddrPortFrom(netlab.OtherV4Host, 53).String())
	}
	spec := p.Pod.Spec.DeepCopy()
	if err := Rewrite(spec, Standin{Image: "x", PilotAgent: agent, Proxy: bins.proxy, App: bins.app,
		ProxyConnect: []string{outside.String()}, AppConnect: targets, Every: "250ms"}); err != nil {
		t.Fatal(err)
	}

	// Init containers in order, as kubelet runs them: validation to the
	// end, a native sidecar started and left running.
	logs := map[string]*syncbuf.Buffer{}
	for _, c := range spec.InitContainers {
		argv := append(append([]string(nil), c.Command...), c.Args...)
		if c.Name == ValidationContainer {
			if agent == "" {
				t.Logf("istio-validation NOT run: %v", agentErr)
				continue
			}
			start := time.Now()
			code, out := runToEnd(t, topo.PodNetnsPath(), c, spec.SecurityContext, argv)
			if code != 0 {
				t.Fatalf("Istio's validation exited %d (want 0: capture in place):\n%s", code, out)
			}
			t.Logf("istio-validation (real pilot-agent, injected args) exit 0 in %v", time.Since(start).Round(time.Millisecond))
			continue
		}
		logs[c.Name] = startIn(t, topo.PodNetnsPath(), c, spec.SecurityContext, withPod(argv, p.Name))
	}
	for _, c := range spec.Containers {
		argv := append(append([]string(nil), c.Command...), c.Args...)
		logs[c.Name] = startIn(t, topo.PodNetnsPath(), c, spec.SecurityContext, withPod(argv, p.Name))
	}

	// Kubernetes sends Service traffic only to ready pods: the other pod
	// starts dialing once the proxy is up (see
	// TestTProxyInboundBeforeProxyListens for why that matters).
	if inMesh {
		waitReady(t, logs[ProxyContainer])
	}

	// The other pod: serves peerPort, dials every TCP port of the app.
	var appPorts []int32
	var dials []string
	for _, c := range p.Pod.Spec.Containers {
		if c.Name == ProxyContainer {
			continue
		}
		for _, port := range c.Ports {
			appPorts = append(appPorts, port.ContainerPort)
			dials = append(dials, "-connect="+netip.AddrPortFrom(netlab.PodV4, uint16(port.ContainerPort)).String())
		}
	}
	peer := corev1.Container{Name: "peer"}
	logs["peer"] = startIn(t, topo.PeerNetnsPath(), peer, nil,
		append([]string{bins.app, "-pod=peer", "-every=250ms", "-listen=" + strconv.Itoa(peerPort)}, dials...))

	app := appContainer(t, spec)
	var checks []check
	outboundWant := reply{pod: p.Name, listener: standin.ListenerOutbound, orig: outside.String()}
	if !inMesh || Excludes(cs, outside.Addr()) {
		outboundWant = reply{pod: "peer", listener: standin.AppListener(peerPort), orig: outside.String()}
	}
	checks = append(checks, check{what: "app's outbound connection", log: app, target: outside.String(), want: outboundWant})
	if cs.CaptureDNS {
		checks = append(checks, check{what: "app's DNS query", log: app, target: targets[1], want: reply{pod: p.Name, listener: standin.ListenerDNS}})
	}
	for _, port := range appPorts {
		dst := netip.AddrPortFrom(netlab.PodV4, uint16(port))
		want := reply{pod: p.Name, listener: standin.ListenerInbound, orig: dst.String()}
		if !inMesh || !CapturesInbound(cs, uint16(port)) {
			want = reply{pod: p.Name, listener: standin.AppListener(uint16(port)), orig: dst.String()}
		}
		checks = append(checks, check{what: "other pod's inbound connection", log: "peer", target: dst.String(), want: want})
	}
	if inMesh {
		checks = append(checks, check{what: "proxy's own outbound connection", log: ProxyContainer, target: outside.String(),
			want: reply{pod: "peer", listener: standin.AppListener(peerPort), orig: outside.String()}})
	}
	for _, c := range checks {
		c.wait(t, logs)
	}
	if inMesh {
		// The proxy logged the same connections with the same original
		// destinations, from its own side.
		ev := events(t, logs[ProxyContainer])
		if !hasAccepted(ev, outboundWant.listener, outboundWant.orig) && outboundWant.pod == p.Name {
			t.Errorf("the proxy logged no accepted %s connection to %s", outboundWant.listener, outboundWant.orig)
		}
		uid, gid := proxyIdentity(t, ev)
		t.Logf("proxy ran as uid %d gid %d, mode %s", uid, gid, cs.InterceptionMode)
	}
}

type reply struct{ pod, listener, orig string }

type check struct {
	what   string
	log    string // container whose log holds the dials
	target string // dial target as the dialer logs it
	want   reply
}

// wait polls the dialer's log until two dials of the target were answered
// as wanted. A dial answered by anyone else fails at once: capture must
// never be partly right. Failed dials before that are tolerated (the
// dialer may start before the server it reaches).
func (c check) wait(t *testing.T, logs map[string]*syncbuf.Buffer) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		ok := 0
		var last standin.Event
		for _, e := range events(t, logs[c.log]) {
			if e.Target != strings.TrimPrefix(c.target, "udp://") {
				continue
			}
			last = e
			if e.Event != standin.EventDialed {
				continue
			}
			got := reply{pod: e.Reply.Pod, listener: e.Reply.Listener, orig: e.Reply.Orig}
			if c.want.orig == "" {
				got.orig = ""
			}
			if got != c.want {
				t.Fatalf("%s to %s: answered by %+v, want %+v", c.what, c.target, got, c.want)
			}
			ok++
		}
		if ok >= 2 {
			t.Logf("ok %s to %s: %s on %s (orig %s)", c.what, c.target, c.want.pod, c.want.listener, c.want.orig)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s to %s: no answer from %+v within 20s; last attempt: %+v\nlogs:\n%s", c.what, c.target, c.want, last, dump(logs))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitReady waits until a stand-in logged its "ready" event.
func waitReady(t *testing.T, b *syncbuf.Buffer) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !isReady(t, b) {
		if time.Now().After(deadline) {
			t.Fatalf("stand-in not ready within 10s:\n%s", b.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func isReady(t *testing.T, b *syncbuf.Buffer) bool {
	for _, e := range events(t, b) {
		if e.Event == standin.EventReady {
			return true
		}
	}
	return false
}

func events(t *testing.T, b *syncbuf.Buffer) []standin.Event {
	t.Helper()
	if b == nil {
		return nil
	}
	ev, err := standin.ParseEvents(strings.NewReader(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	return ev
}

func hasAccepted(ev []standin.Event, listener, orig string) bool {
	for _, e := range ev {
		if e.Event == standin.EventAccepted && e.Listener == listener && e.Orig == orig {
			return true
		}
	}
	return false
}

func proxyIdentity(t *testing.T, ev []standin.Event) (int, int) {
	for _, e := range ev {
		if e.Event == standin.EventReady && e.UID != nil && e.GID != nil {
			return *e.UID, *e.GID
		}
	}
	t.Fatal("the proxy logged no ready event")
	return 0, 0
}

func dump(logs map[string]*syncbuf.Buffer) string {
	var b strings.Builder
	for name, l := range logs {
		fmt.Fprintf(&b, "== %s\n%s", name, tail(l.String(), 30))
	}
	return b.String()
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n") + "\n"
}

func appContainer(t *testing.T, spec *corev1.PodSpec) string {
	for _, c := range spec.Containers {
		if c.Name != ProxyContainer {
			return c.Name
		}
	}
	t.Fatal("pod has no app container")
	return ""
}

// withPod adds -pod=name after the program: the stand-ins would take the
// pod name from the hostname, which all namespaces here share.
func withPod(argv []string, name string) []string {
	return append([]string{argv[0], "-pod=" + name}, argv[1:]...)
}

func newTopology(t *testing.T) *netlab.Topology {
	t.Helper()
	topo, err := netlab.NewTopology(netlab.TopologyOptions{Prefix: "ist-"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := topo.Close(); err != nil {
			t.Error(err)
		}
	})
	return topo
}

type standinBins struct{ proxy, app string }

func buildStandins(t *testing.T) standinBins {
	t.Helper()
	// Not t.TempDir: its 0700 parent would keep UID 1337 from running them.
	dir, err := os.MkdirTemp("", "istiotest-standin-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "build", "-o", dir+"/", "./e2e/cluster/standin/cmd/standin-proxy", "./e2e/cluster/standin/cmd/standin-app")
	cmd.Dir = RepoRoot()
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building the stand-ins: %v\n%s", err, out)
	}
	return standinBins{proxy: filepath.Join(dir, "standin-proxy"), app: filepath.Join(dir, "standin-app")}
}

// identity is the UID/GID a container runs as: its securityContext, else
// the pod's, else root (the image's default user for these images).
func identity(c corev1.Container, pod *corev1.PodSecurityContext) *syscall.Credential {
	cred := &syscall.Credential{}
	if pod != nil {
		if pod.RunAsUser != nil {
			cred.Uid = uint32(*pod.RunAsUser)
		}
		if pod.RunAsGroup != nil {
			cred.Gid = uint32(*pod.RunAsGroup)
		}
	}
	if sc := c.SecurityContext; sc != nil {
		if sc.RunAsUser != nil {
			cred.Uid = uint32(*sc.RunAsUser)
		}
		if sc.RunAsGroup != nil {
			cred.Gid = uint32(*sc.RunAsGroup)
		}
	}
	return cred
}

// environ is the container's literal environment (values from the
// downward API are not available outside a cluster and are left out).
func environ(c corev1.Container) []string {
	env := []string{"PATH=/usr/local/bin:/usr/bin:/bin"}
	for _, e := range c.Env {
		if e.ValueFrom == nil {
			env = append(env, e.Name+"="+e.Value)
		}
	}
	return env
}

func command(c corev1.Container, pod *corev1.PodSecurityContext, argv []string) *exec.Cmd {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = environ(c)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: identity(c, pod)}
	return cmd
}

// runToEnd runs argv in the namespace as the container would and returns
// its exit code and output.
func runToEnd(t *testing.T, ns string, c corev1.Container, pod *corev1.PodSecurityContext, argv []string) (int, string) {
	t.Helper()
	cmd := command(c, pod, argv)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := netlab.Do(ns, cmd.Start); err != nil {
		t.Fatalf("starting %v: %v", argv, err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode(), out.String()
		}
		if err != nil {
			t.Fatalf("running %v: %v", argv, err)
		}
		return 0, out.String()
	case <-time.After(60 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("%v did not finish within 60s:\n%s", argv, out.String())
		return -1, ""
	}
}

// startIn starts argv in the namespace as the container would and stops it
// (SIGTERM, which the stand-ins answer with exit 0) when the test ends.
func startIn(t *testing.T, ns string, c corev1.Container, pod *corev1.PodSecurityContext, argv []string) *syncbuf.Buffer {
	t.Helper()
	cmd := command(c, pod, argv)
	out := &syncbuf.Buffer{}
	var stderr syncbuf.Buffer
	cmd.Stdout, cmd.Stderr = out, &stderr
	if err := netlab.Do(ns, cmd.Start); err != nil {
		t.Fatalf("starting %s %v: %v", c.Name, argv, err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		// A Go program that has not installed its handlers yet dies of
		// SIGTERM: give the stand-in time to come up first.
		for i := 0; i < 100 && !isReady(t, out) && len(argv) > 0; i++ {
			time.Sleep(20 * time.Millisecond)
		}
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("%s exited with %v after SIGTERM (want 0):\n%s", c.Name, err, stderr.String())
			}
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
			t.Errorf("%s ignored SIGTERM for 10s", c.Name)
		}
	})
	return out
}

// TestTProxyInboundBeforeProxyListens: in TPROXY mode, until the proxy
// listens on 15006 an inbound connection must not reach the app (that would
// bypass the proxy and its policies): Istio's iptables TPROXY target drops
// it, and so must every backend. The app listens; nothing listens on 15006.
func TestTProxyInboundBeforeProxyListens(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces and applies capture rules")
	}
	if testing.Short() {
		t.Skip("builds the stand-ins and runs real traffic (-short)")
	}
	bins := buildStandins(t)
	p := injectedPods(t)
	tp := p[indexOf(p, "tproxy")]
	_, _, cs, err := podinfo.FromPod(tp.Pod)
	if err != nil {
		t.Fatal(err)
	}
	plan, err := redirect.Build(cs)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range []redirect.Backend{nft.New(), iptables.New()} {
		t.Run(b.Name(), func(t *testing.T) {
			topo := newTopology(t)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := b.Apply(ctx, topo.PodNetnsPath(), plan); err != nil {
				t.Fatal(err)
			}
			app := startIn(t, topo.PodNetnsPath(), corev1.Container{Name: "app"}, nil, []string{bins.app, "-pod=tproxy", "-listen=8080"})
			waitReady(t, app)
			dst := netip.AddrPortFrom(netlab.PodV4, 8080)
			var e standin.Event
			if err := netlab.Do(topo.PeerNetnsPath(), func() error {
				e = standin.Dial(context.Background(), standin.Target{Proto: "tcp", Addr: dst.String()})
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			if e.Event == standin.EventDialed {
				t.Fatalf("with no proxy listening, an inbound connection to %s reached %s on %s: capture bypassed", dst, e.Reply.Pod, e.Reply.Listener)
			}
			t.Logf("ok: no proxy on 15006, the connection to %s did not get through (%s)", dst, e.Error)
		})
	}
}
