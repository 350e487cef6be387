package inplace

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nftmesh/nftmesh/installer/repair"
	"github.com/nftmesh/nftmesh/netlab"
	"github.com/nftmesh/nftmesh/nft"
	"github.com/nftmesh/nftmesh/podinfo"
	"github.com/nftmesh/nftmesh/podinfo/meshpod"
	"github.com/nftmesh/nftmesh/redirect"
	"github.com/nftmesh/nftmesh/testkit/cgrouptest"
	"github.com/nftmesh/nftmesh/testkit/kubetest"
	"github.com/nftmesh/nftmesh/testkit/nettest"
)

func loadPod(t testing.TB, file string, ips ...netip.Addr) *corev1.Pod {
	t.Helper()
	pod, err := kubetest.ReadPodFile(filepath.Join("..", "..", "testdata", "pods", file))
	if err != nil {
		t.Fatal(err)
	}
	pod.UID = types.UID(cgrouptest.NewUID())
	pod.Status = corev1.PodStatus{}
	for _, ip := range ips {
		pod.Status.PodIPs = append(pod.Status.PodIPs, corev1.PodIP{IP: ip.String()})
	}
	if len(ips) > 0 {
		pod.Status.PodIP = ips[0].String()
	}
	return pod
}

func newRepairer(t testing.TB, backend string) *Repairer {
	t.Helper()
	r, err := New(Options{ProcDir: "/proc", Backend: backend, ExcludeNamespaces: []string{"kube-system"}, PodNamespace: "nftmesh-system"})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestNewRejectsBadOptions(t *testing.T) {
	if _, err := New(Options{ProcDir: "/proc", Backend: "nft"}); err == nil || !strings.Contains(err.Error(), `"nft"`) {
		t.Errorf("bad backend: %v", err)
	}
	if _, err := New(Options{ProcDir: t.TempDir(), Backend: "auto"}); err == nil || !strings.Contains(err.Error(), "not a proc file system") {
		t.Errorf("not a proc dir: %v", err)
	}
	if _, err := New(Options{Backend: "auto"}); err == nil {
		t.Error("empty proc dir accepted")
	}
}

// Pods that must not get capture are refused before any namespace is
// touched, with the sentinel the controller counts as a skip (or, for
// invalid settings, as a failure it does not retry).
func TestRepairPodRefusals(t *testing.T) {
	r := newRepairer(t, "nftables")
	ip := netip.MustParseAddr("192.0.2.77")
	cases := []struct {
		name string
		pod  func() *corev1.Pod
		want error
		text string
	}{
		{"host network", func() *corev1.Pod { p := loadPod(t, "injected.yaml", ip); p.Spec.HostNetwork = true; return p }, repair.ErrNotNeeded, "host network"},
		{"excluded namespace", func() *corev1.Pod { p := loadPod(t, "injected.yaml", ip); p.Namespace = "kube-system"; return p }, repair.ErrNotNeeded, meshpod.ReasonExcludedNamespace},
		{"agent pod", func() *corev1.Pod {
			p := loadPod(t, "injected.yaml", ip)
			p.Namespace, p.Name = "nftmesh-system", "nftmesh-agent-x1"
			return p
		}, repair.ErrNotNeeded, meshpod.ReasonAgentPod},
		{"no sidecar", func() *corev1.Pod { return loadPod(t, "no-sidecar.yaml", ip) }, repair.ErrNotNeeded, meshpod.ReasonNoProxy},
		{"interceptionMode NONE", func() *corev1.Pod { return loadPod(t, "interception-none.yaml", ip) }, repair.ErrNotNeeded, meshpod.ReasonInterceptionNone},
		{"bad annotation", func() *corev1.Pod { return loadPod(t, "bad-annotation.yaml", ip) }, repair.ErrImpossible, "traffic.sidecar.istio.io"},
		{"no IP", func() *corev1.Pod { return loadPod(t, "injected.yaml") }, nil, "has no IP yet"},
		{"bad IP", func() *corev1.Pod {
			p := loadPod(t, "injected.yaml")
			p.Status.PodIPs = []corev1.PodIP{{IP: "10.0.0.300"}}
			return p
		}, nil, `"10.0.0.300" is not an IP address`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := r.RepairPod(context.Background(), c.pod())
			if err == nil || !strings.Contains(err.Error(), c.text) {
				t.Fatalf("err = %v, want one containing %q", err, c.text)
			}
			if c.want != nil && !errors.Is(err, c.want) {
				t.Errorf("err = %v, want it to wrap %v", err, c.want)
			}
			if c.want == nil && (errors.Is(err, repair.ErrNotNeeded) || errors.Is(err, repair.ErrImpossible)) {
				t.Errorf("err = %v: a retryable condition must not carry a no-retry sentinel", err)
			}
		})
	}
}

// The pod's IP is held by nobody on this host: a retryable not-found.
func TestRepairPodNotFound(t *testing.T) {
	needRoot(t)
	r := newRepairer(t, "nftables")
	_, err := r.RepairPod(context.Background(), loadPod(t, "injected.yaml", netip.MustParseAddr("192.0.2.78")))
	if !errors.Is(err, ErrNotFound) || errors.Is(err, repair.ErrNotNeeded) {
		t.Fatalf("err = %v, want ErrNotFound", err)
	}
}

// A running dual-stack "pod" (a sleeping process in nettest's pod
// namespace) that started without capture: before the repair real traffic
// goes straight through; RepairPod finds the namespace through /proc by the
// pod's IPs, programs the plan the plugin would have, and afterwards every
// probe, IPv4 and IPv6, lands where Istio's chains send it (nettest's
// independent oracle). As in Istio, IPv6 is captured only when the sidecar
// is dual-stack (ISTIO_DUAL_STACK=true): the pod's first address is IPv4.
func TestRepairPodRealTraffic(t *testing.T) {
	needRoot(t)
	for _, tc := range []struct {
		backend   string
		dualStack bool
	}{{"auto", false}, {"iptables-legacy", false}, {"auto", true}} {
		t.Run(fmt.Sprintf("%s/dual-stack-sidecar=%t", tc.backend, tc.dualStack), func(t *testing.T) {
			backend := tc.backend
			pod := loadPod(t, "injected.yaml", netlab.PodV4, netlab.PodV6)
			if tc.dualStack {
				for i := range pod.Spec.Containers {
					if pod.Spec.Containers[i].Name == meshpod.ProxyContainer {
						pod.Spec.Containers[i].Env = append(pod.Spec.Containers[i].Env, corev1.EnvVar{Name: meshpod.EnvDualStack, Value: "true"})
					}
				}
			}
			inMesh, _, spec, err := podinfo.FromPod(pod)
			if err != nil || !inMesh {
				t.Fatalf("sample pod not in mesh: %v", err)
			}
			topo, _ := nettest.NewLab(t, func() netlab.TopologyOptions {
				o := nettest.TopologyOptionsFor(spec)
				o.Prefix = "e2e-"
				return o
			}(), netlab.ListenerOptions{ProxyUID: spec.ProxyUIDs[0], ProxyGID: spec.ProxyGIDs[0]})
			pause := sleeper(t, topo.PodNetns)
			cgrouptest.MovePod(t, pause, cgrouptest.CgroupfsLeaf(string(pod.UID)))

			// Before: no capture at all (the broken pod's state).
			before := nettest.ExpectedProbesFor(nil, topo)
			for _, o := range nettest.RunProbes(topo, before[:min(len(before), 6)]) {
				if !o.OK() {
					t.Fatalf("before the repair: %s", o)
				}
			}

			// nettest topologies all use the same addresses: a concurrent
			// test elsewhere on this machine whose main thread sits in its
			// own pod namespace would be a second candidate. Never program
			// someone else's namespace.
			if f, err := FindNetns("/proc", "", []netip.Addr{netlab.PodV4, netlab.PodV6}); err != nil || f.PID != pause {
				t.Skipf("skipping: another process holds nettest's pod addresses (found %+v, %v)", f, err)
			}
			rep, err := newRepairer(t, backend).RepairPod(context.Background(), pod)
			if err != nil {
				t.Fatalf("RepairPod: %v", err)
			}
			t.Logf("repair report: %+v", rep)
			if rep.PID != pause || rep.Rules == 0 || rep.Match != MatchCgroup {
				t.Errorf("repaired through pid %d (%d rules, matched by %s), want the sleeper %d matched by its pod cgroup", rep.PID, rep.Rules, rep.Match, pause)
			}
			if rep.Backend != backend && !(backend == "auto" && rep.Backend == "nftables") {
				t.Errorf("backend %s, want %s", rep.Backend, backend)
			}

			spec.IPv6 = tc.dualStack
			want, err := redirect.Build(spec)
			if err != nil {
				t.Fatal(err)
			}
			var b redirect.Backend = nft.New()
			if rep.Backend != "nftables" {
				b = legacyBackend()
			}
			if err := b.Check(context.Background(), topo.PodNetnsPath(), want); err != nil {
				t.Fatalf("live rules after the repair: %v", err)
			}

			cases := nettest.ExpectedProbesFor(&spec, topo)
			bad := 0
			for _, o := range nettest.RunProbes(topo, cases) {
				if !o.OK() {
					bad++
					t.Errorf("MISMATCH %s", o)
				}
			}
			t.Logf("%d/%d probes landed as expected after the repair", len(cases)-bad, len(cases))
			if len(cases) < 10 {
				t.Fatalf("only %d probes: the harness did not run", len(cases))
			}
		})
	}
}

func podinfoFromPod(p *corev1.Pod) (bool, string, redirect.Spec, error) { return podinfo.FromPod(p) }
