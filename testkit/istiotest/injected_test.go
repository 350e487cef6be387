package istiotest

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/nftmesh/nftmesh/podinfo"
	"github.com/nftmesh/nftmesh/redirect"
)

// injectedPod is one workload of testdata/istio/injected: its file, the
// Deployment's name and the pod template the injector wrote.
type injectedPod struct {
	File string
	Name string
	Pod  *corev1.Pod
}

func injectedPods(t *testing.T) []injectedPod {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(TestdataDir(), "injected", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no injected manifests in testdata/istio/injected (make istio-manifests): %v", err)
	}
	var out []injectedPod
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		objs, err := SplitManifests(data)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for _, o := range objs {
			if o.Kind != "Deployment" {
				continue
			}
			meta, spec, err := PodTemplate(o)
			if err != nil {
				t.Fatal(err)
			}
			pod := &corev1.Pod{ObjectMeta: meta, Spec: spec}
			pod.Name, pod.Namespace = o.Name, "default"
			out = append(out, injectedPod{File: strings.TrimSuffix(filepath.Base(f), ".yaml"), Name: o.Name, Pod: pod})
		}
	}
	return out
}

// decision is what nftmesh must read from an injected pod.
type decision struct {
	inMesh       bool
	mode         redirect.InterceptionMode
	dns          bool
	excluded     []string // outbound CIDRs left uncaptured
	inboundPorts []uint16 // nil: all
	native       bool     // istio-proxy is a native sidecar
}

// wantDecisions says, per input file, what the injector's output must make
// nftmesh do: each variant's one setting, the rest Istio's defaults.
var wantDecisions = map[string]decision{
	"productpage":           {inMesh: true, mode: redirect.ModeRedirect},
	"reviews":               {inMesh: true, mode: redirect.ModeRedirect},
	"httpbin":               {inMesh: true, mode: redirect.ModeRedirect},
	"tproxy":                {inMesh: true, mode: redirect.ModeTProxy},
	"dns-capture":           {inMesh: true, mode: redirect.ModeRedirect, dns: true},
	"exclude-cidrs":         {inMesh: true, mode: redirect.ModeRedirect, excluded: []string{"10.244.0.0/16", "203.0.113.0/24"}},
	"include-inbound-ports": {inMesh: true, mode: redirect.ModeRedirect, inboundPorts: []uint16{8080}},
	"native-sidecar":        {inMesh: true, mode: redirect.ModeRedirect, native: true},
	"no-inject":             {inMesh: false},
}

// TestInjectedPodsDecisions reads every pod Istio's injector wrote the way
// the CNI plugin reads it, and checks it gets the capture its annotations
// asked for: the injector's real output (native sidecar in initContainers,
// settings moved into annotations and the proxy's environment) is what
// nftmesh must understand.
func TestInjectedPodsDecisions(t *testing.T) {
	pods := injectedPods(t)
	seen := map[string]bool{}
	for _, p := range pods {
		want, ok := wantDecisions[p.File]
		if !ok {
			t.Errorf("%s: no expected decision: add it to wantDecisions", p.File)
			continue
		}
		seen[p.File] = true
		inMesh, reason, spec, err := podinfo.FromPod(p.Pod)
		if err != nil {
			t.Errorf("%s: %v", p.File, err)
			continue
		}
		if inMesh != want.inMesh {
			t.Errorf("%s: in mesh = %v (%s), want %v", p.File, inMesh, reason, want.inMesh)
			continue
		}
		if !inMesh {
			if hasContainer(p.Pod.Spec, ProxyContainer) || hasContainer(p.Pod.Spec, ValidationContainer) {
				t.Errorf("%s: the injector injected a pod that opted out", p.File)
			}
			continue
		}
		// Istio's own proof that capture works must be there, and
		// istio-init must not (the CNI's job).
		if p.Pod.Spec.InitContainers[0].Name != ValidationContainer {
			t.Errorf("%s: first init container is %q, want %s", p.File, p.Pod.Spec.InitContainers[0].Name, ValidationContainer)
		}
		if spec.InterceptionMode != want.mode {
			t.Errorf("%s: mode %s, want %s", p.File, spec.InterceptionMode, want.mode)
		}
		if spec.CaptureDNS != want.dns {
			t.Errorf("%s: DNS capture %v, want %v", p.File, spec.CaptureDNS, want.dns)
		}
		var excl []string
		for _, pf := range spec.OutboundIPRangesExclude {
			excl = append(excl, pf.String())
		}
		slices.Sort(excl)
		if !slices.Equal(excl, want.excluded) {
			t.Errorf("%s: excluded outbound %v, want %v", p.File, excl, want.excluded)
		}
		if want.inboundPorts == nil {
			if !spec.InboundPorts.All {
				t.Errorf("%s: inbound ports %s, want all", p.File, spec.InboundPorts)
			}
		} else if spec.InboundPorts.All || !slices.Equal(spec.InboundPorts.Ports, want.inboundPorts) {
			t.Errorf("%s: inbound ports %s, want %v", p.File, spec.InboundPorts, want.inboundPorts)
		}
		native := false
		for _, c := range p.Pod.Spec.InitContainers {
			if c.Name == ProxyContainer && c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
				native = true
			}
		}
		if native != want.native || native == hasContainerIn(p.Pod.Spec.Containers, ProxyContainer) {
			t.Errorf("%s: istio-proxy native sidecar = %v, want %v", p.File, native, want.native)
		}
		if want.mode == redirect.ModeTProxy && !slices.Contains(spec.ProxyGIDs, 1337) {
			t.Errorf("%s: TPROXY proxy GIDs %v lack 1337", p.File, spec.ProxyGIDs)
		}
	}
	for f := range wantDecisions {
		if !seen[f] {
			t.Errorf("no injected manifest for %s", f)
		}
	}
}

// TestRewrite: only images and commands change; Istio's validation keeps
// its injected arguments, the proxy keeps its arguments and environment
// (nftmesh reads them), the app serves its container ports.
func TestRewrite(t *testing.T) {
	for i, p := range injectedPods(t) {
		orig := p.Pod.Spec.DeepCopy()
		spec := p.Pod.Spec.DeepCopy()
		s := Standin{Image: "localhost/istio-standin:test", ProxyConnect: []string{"10.244.0.9:8080"}, AppConnect: []string{"10.96.0.20:9080"}, Every: "1s",
			ProxyForward: i%2 == 1} // every other pod: with and without -forward
		if err := Rewrite(spec, s); err != nil {
			t.Fatalf("%s: %v", p.File, err)
		}
		all := func(ps *corev1.PodSpec) []corev1.Container {
			return append(append([]corev1.Container(nil), ps.InitContainers...), ps.Containers...)
		}
		before, after := all(orig), all(spec)
		for i, c := range after {
			o := before[i]
			if c.Image != s.Image || c.ImagePullPolicy != corev1.PullNever {
				t.Errorf("%s/%s: image %s %s", p.File, c.Name, c.Image, c.ImagePullPolicy)
			}
			switch c.Name {
			case ValidationContainer:
				if !slices.Equal(c.Command, []string{"/usr/local/bin/pilot-agent"}) || !slices.Equal(c.Args, o.Args) || c.Args[0] != "istio-iptables" {
					t.Errorf("%s: validation runs %v %v", p.File, c.Command, c.Args)
				}
			case ProxyContainer:
				want := []string{"/usr/local/bin/standin-proxy", "-every=1s", "-connect=10.244.0.9:8080"}
				if s.ProxyForward {
					want = slices.Insert(want, 1, "-forward")
				}
				if !slices.Equal(c.Command, want) || !slices.Equal(c.Args, o.Args) || c.Args[0] != "proxy" {
					t.Errorf("%s: proxy runs %v %v", p.File, c.Command, c.Args)
				}
			default:
				want := []string{"-listen=" + portsOf(o), "-every=1s", "-connect=10.96.0.20:9080"}
				if !slices.Equal(c.Command, []string{"/usr/local/bin/standin-app"}) || !slices.Equal(c.Args, want) {
					t.Errorf("%s/%s: app runs %v %v, want args %v", p.File, c.Name, c.Command, c.Args, want)
				}
			}
			// Everything but image, pull policy, command and app args is
			// as the injector wrote it.
			c.Image, c.ImagePullPolicy, c.Command = o.Image, o.ImagePullPolicy, o.Command
			if c.Name != ValidationContainer && c.Name != ProxyContainer {
				c.Args = o.Args
			}
			if !equalContainer(c, o) {
				t.Errorf("%s/%s: Rewrite changed more than image and command", p.File, c.Name)
			}
		}
	}
	bad := &corev1.PodSpec{InitContainers: []corev1.Container{{Name: "istio-init"}}}
	if err := Rewrite(bad, Standin{Image: "x"}); err == nil || !strings.Contains(err.Error(), `"istio-init" has no stand-in`) {
		t.Errorf("an unknown init container: %v", err)
	}
	if err := Rewrite(&corev1.PodSpec{}, Standin{}); err == nil {
		t.Error("Rewrite without an image succeeded")
	}
}

func portsOf(c corev1.Container) string {
	var s []string
	for _, p := range c.Ports {
		s = append(s, strconv.Itoa(int(p.ContainerPort)))
	}
	return strings.Join(s, ",")
}

func equalContainer(a, b corev1.Container) bool {
	return a.String() == b.String()
}

func hasContainer(spec corev1.PodSpec, name string) bool {
	return hasContainerIn(spec.InitContainers, name) || hasContainerIn(spec.Containers, name)
}

func hasContainerIn(cs []corev1.Container, name string) bool {
	for _, c := range cs {
		if c.Name == name {
			return true
		}
	}
	return false
}
