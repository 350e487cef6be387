package podinfo

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftmesh/nftmesh/podinfo/meshpod"
	"github.com/nftmesh/nftmesh/redirect"
	"github.com/nftmesh/nftmesh/testkit/kubetest"
)

// meshPod is the smallest pod FromPod puts in the mesh; tests mutate it.
func meshPod() *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:        "web-1",
			Namespace:   "shop",
			Labels:      map[string]string{},
			Annotations: map[string]string{redirect.AnnotationSidecarStatus: "{}"},
		},
		Spec: corev1.PodSpec{
			InitContainers: []corev1.Container{{Name: "istio-validation"}},
			Containers: []corev1.Container{
				{Name: "web"},
				{Name: meshpod.ProxyContainer, Args: []string{"proxy", "sidecar"}},
			},
		},
	}
}

func proxyOf(p *corev1.Pod) *corev1.Container {
	for _, list := range [][]corev1.Container{p.Spec.InitContainers, p.Spec.Containers} {
		for i := range list {
			if list[i].Name == meshpod.ProxyContainer {
				return &list[i]
			}
		}
	}
	return nil
}

func setEnv(p *corev1.Pod, kv ...string) {
	c := proxyOf(p)
	for i := 0; i+1 < len(kv); i += 2 {
		c.Env = append(c.Env, corev1.EnvVar{Name: kv[i], Value: kv[i+1]})
	}
}

func i64(v int64) *int64 { return &v }

func TestFromPodSelection(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*corev1.Pod)
		inMesh bool
		reason string
	}{
		{"injected sidecar", func(*corev1.Pod) {}, true, meshpod.ReasonInMesh},
		{"istio-init container", func(p *corev1.Pod) {
			p.Spec.InitContainers = append(p.Spec.InitContainers, corev1.Container{Name: meshpod.InitContainer})
		}, false, meshpod.ReasonIstioInit},
		{"istio-init as a regular container", func(p *corev1.Pod) {
			p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: meshpod.InitContainer})
		}, false, meshpod.ReasonIstioInit},
		{"istio-init wins over inject=true", func(p *corev1.Pod) {
			p.Spec.InitContainers = append(p.Spec.InitContainers, corev1.Container{Name: meshpod.InitContainer})
			p.Labels[redirect.AnnotationInject] = "true"
		}, false, meshpod.ReasonIstioInit},
		{"DISABLE_ENVOY true", func(p *corev1.Pod) { setEnv(p, meshpod.EnvDisableEnvoy, "true") }, false, meshpod.ReasonEnvoyDisabled},
		{"DISABLE_ENVOY 1", func(p *corev1.Pod) { setEnv(p, meshpod.EnvDisableEnvoy, "1") }, false, meshpod.ReasonEnvoyDisabled},
		{"DISABLE_ENVOY false", func(p *corev1.Pod) { setEnv(p, meshpod.EnvDisableEnvoy, "false") }, true, meshpod.ReasonInMesh},
		{"DISABLE_ENVOY malformed is not a skip (as Istio)", func(p *corev1.Pod) { setEnv(p, meshpod.EnvDisableEnvoy, "yes") }, true, meshpod.ReasonInMesh},
		{"DISABLE_ENVOY on another container is ignored", func(p *corev1.Pod) {
			p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: meshpod.EnvDisableEnvoy, Value: "true"}}
		}, true, meshpod.ReasonInMesh},
		{"DISABLE_ENVOY checked before inject=false", func(p *corev1.Pod) {
			setEnv(p, meshpod.EnvDisableEnvoy, "true")
			p.Labels[redirect.AnnotationInject] = "false"
		}, false, meshpod.ReasonEnvoyDisabled},
		{"no istio-proxy", func(p *corev1.Pod) { p.Spec.Containers = p.Spec.Containers[:1] }, false, meshpod.ReasonNoProxy},
		{"no containers at all", func(p *corev1.Pod) { p.Spec = corev1.PodSpec{} }, false, meshpod.ReasonNoProxy},
		{"native sidecar in init containers", func(p *corev1.Pod) {
			p.Spec.InitContainers = append(p.Spec.InitContainers, p.Spec.Containers[1])
			p.Spec.Containers = p.Spec.Containers[:1]
		}, true, meshpod.ReasonInMesh},
		{"gateway (proxy router)", func(p *corev1.Pod) { proxyOf(p).Args = []string{"proxy", "router"} }, false, meshpod.ReasonNotSidecar},
		{"proxy with no args", func(p *corev1.Pod) { proxyOf(p).Args = nil }, true, meshpod.ReasonInMesh},
		{"proxy with a single arg", func(p *corev1.Pod) { proxyOf(p).Args = []string{"proxy"} }, true, meshpod.ReasonInMesh},
		{"args not starting with proxy", func(p *corev1.Pod) { proxyOf(p).Args = []string{"--foo", "router"} }, true, meshpod.ReasonInMesh},
		{"no-sidecar checked before inject=false", func(p *corev1.Pod) {
			p.Spec.Containers = p.Spec.Containers[:1]
			p.Labels[redirect.AnnotationInject] = "false"
		}, false, meshpod.ReasonNoProxy},
		{"inject=false label", func(p *corev1.Pod) { p.Labels[redirect.AnnotationInject] = "false" }, false, meshpod.ReasonInjectLabelFalse},
		{"inject=false annotation", func(p *corev1.Pod) { p.Annotations[redirect.AnnotationInject] = "false" }, false, meshpod.ReasonInjectAnnotationOff},
		{"label true wins over annotation false", func(p *corev1.Pod) {
			p.Labels[redirect.AnnotationInject] = "true"
			p.Annotations[redirect.AnnotationInject] = "false"
		}, true, meshpod.ReasonInMesh},
		{"label false wins over annotation true", func(p *corev1.Pod) {
			p.Labels[redirect.AnnotationInject] = "false"
			p.Annotations[redirect.AnnotationInject] = "true"
		}, false, meshpod.ReasonInjectLabelFalse},
		{"malformed label wins over annotation false (as Istio)", func(p *corev1.Pod) {
			p.Labels[redirect.AnnotationInject] = "maybe"
			p.Annotations[redirect.AnnotationInject] = "false"
		}, true, meshpod.ReasonInMesh},
		{"inject=0 annotation", func(p *corev1.Pod) { p.Annotations[redirect.AnnotationInject] = "0" }, false, meshpod.ReasonInjectAnnotationOff},
		{"inject=true without status", func(p *corev1.Pod) {
			p.Labels[redirect.AnnotationInject] = "true"
			delete(p.Annotations, redirect.AnnotationSidecarStatus)
		}, false, meshpod.ReasonNotInjected},
		{"no status annotation", func(p *corev1.Pod) { p.Annotations = nil }, false, meshpod.ReasonNotInjected},
		{"empty status annotation still counts", func(p *corev1.Pod) { p.Annotations[redirect.AnnotationSidecarStatus] = "" }, true, meshpod.ReasonInMesh},
		{"nil labels", func(p *corev1.Pod) { p.Labels = nil }, true, meshpod.ReasonInMesh},
		{"interceptionMode NONE", func(p *corev1.Pod) { p.Annotations[redirect.AnnotationInterceptionMode] = "NONE" }, false, meshpod.ReasonInterceptionNone},
		{"interceptionMode NONE with spaces", func(p *corev1.Pod) { p.Annotations[redirect.AnnotationInterceptionMode] = " NONE " }, false, meshpod.ReasonInterceptionNone},
		{"interceptionMode NONE skips invalid capture annotations", func(p *corev1.Pod) {
			p.Annotations[redirect.AnnotationInterceptionMode] = "NONE"
			p.Annotations[redirect.AnnotationExcludeOutboundIPRanges] = "not-a-cidr"
		}, false, meshpod.ReasonInterceptionNone},
		{"interceptionMode NONE without status is not injected", func(p *corev1.Pod) {
			p.Annotations = map[string]string{redirect.AnnotationInterceptionMode: "NONE"}
		}, false, meshpod.ReasonNotInjected},
		{"inject=false checked before interceptionMode NONE", func(p *corev1.Pod) {
			p.Annotations[redirect.AnnotationInterceptionMode] = "NONE"
			p.Labels[redirect.AnnotationInject] = "false"
		}, false, meshpod.ReasonInjectLabelFalse},
		{"interceptionMode REDIRECT", func(p *corev1.Pod) { p.Annotations[redirect.AnnotationInterceptionMode] = "REDIRECT" }, true, meshpod.ReasonInMesh},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := meshPod()
			tt.mutate(p)
			inMesh, reason, spec, err := FromPod(p)
			if err != nil {
				t.Fatalf("FromPod: unexpected error %v", err)
			}
			if inMesh != tt.inMesh || reason != tt.reason {
				t.Fatalf("FromPod = (%v, %q), want (%v, %q)", inMesh, reason, tt.inMesh, tt.reason)
			}
			if inMesh {
				if _, err := redirect.Build(spec); err != nil {
					t.Fatalf("Build of the in-mesh spec: %v", err)
				}
			}
		})
	}
}

func TestFromPodSpec(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*corev1.Pod)
		want   func(*redirect.Spec)
	}{
		{"defaults", func(*corev1.Pod) {}, func(*redirect.Spec) {}},
		{"runAsUser/runAsGroup", func(p *corev1.Pod) {
			proxyOf(p).SecurityContext = &corev1.SecurityContext{RunAsUser: i64(2000), RunAsGroup: i64(3000)}
		}, func(s *redirect.Spec) { s.ProxyUIDs, s.ProxyGIDs = []uint32{2000}, []uint32{3000} }},
		{"uid 0 keeps 1337 (TPROXY proxies run as root)", func(p *corev1.Pod) {
			proxyOf(p).SecurityContext = &corev1.SecurityContext{RunAsUser: i64(0), RunAsGroup: i64(1337)}
		}, func(*redirect.Spec) {}},
		{"pod securityContext is not read (as Istio)", func(p *corev1.Pod) {
			p.Spec.SecurityContext = &corev1.PodSecurityContext{RunAsUser: i64(4000), RunAsGroup: i64(4000)}
		}, func(*redirect.Spec) {}},
		{"other container's securityContext is not read", func(p *corev1.Pod) {
			p.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{RunAsUser: i64(4000)}
		}, func(*redirect.Spec) {}},
		{"DNS capture", func(p *corev1.Pod) { setEnv(p, meshpod.EnvDNSCapture, "true") }, func(s *redirect.Spec) { s.CaptureDNS = true }},
		{"DNS capture TRUE", func(p *corev1.Pod) { setEnv(p, meshpod.EnvDNSCapture, "TRUE") }, func(s *redirect.Spec) { s.CaptureDNS = true }},
		{"DNS capture later duplicate wins", func(p *corev1.Pod) { setEnv(p, meshpod.EnvDNSCapture, "true", meshpod.EnvDNSCapture, "false") }, func(*redirect.Spec) {}},
		{"DNS capture from valueFrom is not resolved", func(p *corev1.Pod) {
			proxyOf(p).Env = []corev1.EnvVar{{Name: meshpod.EnvDNSCapture, ValueFrom: &corev1.EnvVarSource{
				FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}}}
		}, func(*redirect.Spec) {}},
		{"empty env value is unset", func(p *corev1.Pod) { setEnv(p, meshpod.EnvDNSCapture, "") }, func(*redirect.Spec) {}},
		{"drop invalid", func(p *corev1.Pod) { setEnv(p, meshpod.EnvInvalidDrop, "1") }, func(s *redirect.Spec) { s.DropInvalid = true }},
		// IPv6 as Istio decides it (meshpod.IPv6Capture), predicted from the
		// pod IPs in the order the kernel lists them: IPv4 first.
		{"dual stack env, no pod IPs: nothing is IPv6", func(p *corev1.Pod) { setEnv(p, meshpod.EnvDualStack, "true") }, func(s *redirect.Spec) { s.DualStack = true }},
		{"dual stack env, v4 pod IP only", func(p *corev1.Pod) {
			setEnv(p, meshpod.EnvDualStack, "true")
			p.Status.PodIPs = []corev1.PodIP{{IP: "198.51.100.3"}}
		}, func(s *redirect.Spec) { s.DualStack = true }},
		{"dual-stack pod IPs without dual stack env: IPv4 only", func(p *corev1.Pod) {
			p.Status.PodIPs = []corev1.PodIP{{IP: "198.51.100.3"}, {IP: "2001:db8::3"}}
		}, func(*redirect.Spec) {}},
		{"dual-stack pod IPs, v6 listed first, without dual stack env: IPv4 only", func(p *corev1.Pod) {
			p.Status.PodIPs = []corev1.PodIP{{IP: "2001:db8::3"}, {IP: "198.51.100.3"}}
		}, func(*redirect.Spec) {}},
		{"dual-stack pod IPs with dual stack env", func(p *corev1.Pod) {
			setEnv(p, meshpod.EnvDualStack, "true")
			p.Status.PodIPs = []corev1.PodIP{{IP: "198.51.100.3"}, {IP: "2001:db8::3"}}
		}, func(s *redirect.Spec) { s.IPv6, s.DualStack = true, true }},
		{"v6 primary pod IP", func(p *corev1.Pod) { p.Status.PodIP = "2001:db8::3" }, func(s *redirect.Spec) { s.IPv6 = true }},
		{"v4 pod IP only", func(p *corev1.Pod) { p.Status.PodIPs = []corev1.PodIP{{IP: "198.51.100.3"}} }, func(*redirect.Spec) {}},
		{"v6-only pod with dual stack false", func(p *corev1.Pod) {
			setEnv(p, meshpod.EnvDualStack, "false")
			p.Status.PodIPs = []corev1.PodIP{{IP: "2001:db8::3"}}
		}, func(s *redirect.Spec) { s.IPv6 = true }},
		{"annotations applied", func(p *corev1.Pod) {
			p.Annotations[redirect.AnnotationExcludeOutboundIPRanges] = "192.0.2.0/24"
			p.Annotations[redirect.AnnotationInterceptionMode] = "TPROXY"
		}, func(s *redirect.Spec) {
			s.OutboundIPRangesExclude = []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}
			s.InterceptionMode = redirect.ModeTProxy
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := meshPod()
			tt.mutate(p)
			inMesh, _, got, err := FromPod(p)
			if err != nil || !inMesh {
				t.Fatalf("FromPod = (%v, err %v), want in mesh", inMesh, err)
			}
			want := redirect.DefaultSpec()
			tt.want(&want)
			if d := specDiff(want, got); d != "" {
				t.Fatalf("spec differs:\n%s", d)
			}
		})
	}
}

// specDiff compares two Specs through their plans' canonical lines plus
// the fields a plan does not show when they are off.
func specDiff(want, got redirect.Spec) string {
	pw, err1 := redirect.Build(want)
	pg, err2 := redirect.Build(got)
	if err1 != nil || err2 != nil {
		return "build: " + errors.Join(err1, err2).Error()
	}
	d := redirect.Diff(pw, pg)
	if want.IPv6 != got.IPv6 || want.DualStack != got.DualStack || want.CaptureDNS != got.CaptureDNS || want.DropInvalid != got.DropInvalid {
		d = append(d, "flags differ")
	}
	return strings.Join(d, "\n")
}

func TestFromPodBadInput(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*corev1.Pod)
		want   []string // substrings of the error, each naming field and value
	}{
		{"DNS capture not a bool", func(p *corev1.Pod) { setEnv(p, meshpod.EnvDNSCapture, "yes") },
			[]string{"env ISTIO_META_DNS_CAPTURE", `"yes"`}},
		{"drop invalid not a bool", func(p *corev1.Pod) { setEnv(p, meshpod.EnvInvalidDrop, "on") },
			[]string{"env INVALID_DROP", `"on"`}},
		{"dual stack not a bool", func(p *corev1.Pod) { setEnv(p, meshpod.EnvDualStack, "2") },
			[]string{"env ISTIO_DUAL_STACK", `"2"`}},
		{"negative runAsUser", func(p *corev1.Pod) {
			proxyOf(p).SecurityContext = &corev1.SecurityContext{RunAsUser: i64(-1)}
		}, []string{"securityContext.runAsUser", `"-1"`}},
		{"runAsGroup too large", func(p *corev1.Pod) {
			proxyOf(p).SecurityContext = &corev1.SecurityContext{RunAsGroup: i64(1 << 33)}
		}, []string{"securityContext.runAsGroup", `"8589934592"`}},
		{"CIDR without prefix", func(p *corev1.Pod) {
			p.Annotations[redirect.AnnotationExcludeOutboundIPRanges] = "192.0.2.10"
		}, []string{redirect.AnnotationExcludeOutboundIPRanges, `"192.0.2.10"`}},
		{"port out of range", func(p *corev1.Pod) {
			p.Annotations[redirect.AnnotationIncludeInboundPorts] = "70000"
		}, []string{redirect.AnnotationIncludeInboundPorts, `"70000"`}},
		{"unknown mode", func(p *corev1.Pod) {
			p.Annotations[redirect.AnnotationInterceptionMode] = "BOGUS"
		}, []string{redirect.AnnotationInterceptionMode, `"BOGUS"`}},
		{"env and annotation problems reported together", func(p *corev1.Pod) {
			setEnv(p, meshpod.EnvDNSCapture, "nope")
			p.Annotations[redirect.AnnotationExcludeOutboundPorts] = "0"
		}, []string{"env ISTIO_META_DNS_CAPTURE", `"nope"`, redirect.AnnotationExcludeOutboundPorts, `"0"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := meshPod()
			tt.mutate(p)
			inMesh, reason, _, err := FromPod(p)
			if err == nil {
				t.Fatal("FromPod: want an error")
			}
			if !inMesh || reason != meshpod.ReasonInvalid {
				t.Errorf("FromPod = (%v, %q), want (true, %q) so the caller fails closed", inMesh, reason, meshpod.ReasonInvalid)
			}
			var ve *redirect.ValidationError
			if !errors.As(err, &ve) {
				t.Errorf("error %v is not a *redirect.ValidationError", err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %s", err, w)
				}
			}
			if !strings.Contains(err.Error(), "shop/web-1") {
				t.Errorf("error %q does not name the pod", err)
			}
		})
	}
	if _, _, _, err := FromPod(nil); err == nil {
		t.Error("FromPod(nil): want an error")
	}
}

func TestSamplePods(t *testing.T) {
	tests := []struct {
		file    string
		inMesh  bool
		reason  string
		wantErr string
		check   func(t *testing.T, s redirect.Spec)
	}{
		{"injected.yaml", true, meshpod.ReasonInMesh, "", func(t *testing.T, s redirect.Spec) {
			if s.CaptureDNS || s.IPv6 || !slices.Equal(s.ProxyUIDs, []uint32{1337}) {
				t.Errorf("spec %+v", s)
			}
		}},
		{"annotated.json", true, meshpod.ReasonInMesh, "", func(t *testing.T, s redirect.Spec) {
			if !s.CaptureDNS || !s.IPv6 || !s.DropInvalid || s.InterceptionMode != redirect.ModeTProxy ||
				!slices.Equal(s.InboundPorts.Ports, []uint16{8080, 9090}) || len(s.OutboundIPRangesExclude) != 2 ||
				!slices.Equal(s.ProxyUIDs, []uint32{1337}) || !slices.Equal(s.OutboundPortsExclude, []uint16{5432}) {
				t.Errorf("spec %+v", s)
			}
		}},
		{"gateway.yaml", false, meshpod.ReasonNotSidecar, "", nil},
		{"interception-none.yaml", false, meshpod.ReasonInterceptionNone, "", nil},
		{"no-sidecar.yaml", false, meshpod.ReasonNoProxy, "", nil},
		{"inject-false.yaml", false, meshpod.ReasonInjectLabelFalse, "", nil},
		{"native-sidecar.yaml", true, meshpod.ReasonInMesh, "", func(t *testing.T, s redirect.Spec) {
			if len(s.OutboundIPRangesExclude) != 1 {
				t.Errorf("spec %+v", s)
			}
		}},
		{"bad-annotation.yaml", true, meshpod.ReasonInvalid, `"192.0.2.10" is not a CIDR`, nil},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			pod, err := kubetest.ReadPodFile(filepath.Join("..", "testdata", "pods", tt.file))
			if err != nil {
				t.Fatal(err)
			}
			inMesh, reason, spec, err := FromPod(pod)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("FromPod error = %v, want %q", err, tt.wantErr)
				}
			} else if err != nil {
				t.Fatal(err)
			}
			if inMesh != tt.inMesh || reason != tt.reason {
				t.Fatalf("FromPod = (%v, %q), want (%v, %q)", inMesh, reason, tt.inMesh, tt.reason)
			}
			if tt.check != nil {
				tt.check(t, spec)
			}
		})
	}
}

func TestReadPodFileBadInput(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name, content, want string
	}{
		{"deployment", "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\n", `kind is "Deployment"`},
		{"empty list", `{"apiVersion":"v1","kind":"List","items":[]}`, "no Pod in the manifest (found an empty List)"},
		{"no kind", "metadata: {name: x}\n", "no kind"},
		{"wrong apiVersion", "apiVersion: v2\nkind: Pod\n", `apiVersion is "v2"`},
		{"not yaml", "kind: [Pod\n", "decoding manifest"},
		{"wrong type", "apiVersion: v1\nkind: Pod\nspec: {containers: 3}\n", "decoding Pod"},
		{"empty", "", "the manifest is empty"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(dir, tt.name+".yaml")
			if err := os.WriteFile(path, []byte(tt.content), 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := kubetest.ReadPodFile(path)
			if err == nil || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), path) {
				t.Fatalf("ReadPodFile error = %v, want one containing %q and the path", err, tt.want)
			}
		})
	}
	if _, err := kubetest.ReadPodFile(filepath.Join(dir, "missing.yaml")); err == nil || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing file: error = %v, want ErrNotExist", err)
	}
}

// FuzzFromPod builds pods from fuzzed annotations, env, args and ids. FromPod
// must never panic, and an in-mesh answer without error must build.
func FuzzFromPod(f *testing.F) {
	f.Add("proxy", "sidecar", "true", "false", "", "*", "192.0.2.0/24", "REDIRECT", "", int64(1337), int64(1337), true, "198.51.100.7", "2001:db8::7")
	f.Add("proxy", "router", "", "", "", "", "", "", "false", int64(0), int64(0), true, "", "")
	f.Add("", "", "yes", "1", "2", "8080,70000", "10.0.0.1", "TPROXY", "true", int64(-1), int64(1<<40), false, "fe80::1", "::ffff:1.2.3.4")
	f.Add("proxy", "sidecar", "", "", "true", "", "::/0,*", "NONE", "", int64(0), int64(0), true, "2001:db8::7/64", "x")
	f.Fuzz(func(t *testing.T, arg0, arg1, dns, drop, dual, inPorts, exclCIDR, mode, inject string, uid, gid int64, status bool, ip1, ip2 string) {
		p := meshPod()
		proxyOf(p).Args = []string{arg0, arg1}
		setEnv(p, meshpod.EnvDNSCapture, dns, meshpod.EnvInvalidDrop, drop, meshpod.EnvDualStack, dual)
		proxyOf(p).SecurityContext = &corev1.SecurityContext{RunAsUser: &uid, RunAsGroup: &gid}
		p.Annotations[redirect.AnnotationIncludeInboundPorts] = inPorts
		p.Annotations[redirect.AnnotationExcludeOutboundIPRanges] = exclCIDR
		p.Annotations[redirect.AnnotationInterceptionMode] = mode
		p.Labels[redirect.AnnotationInject] = inject
		if !status {
			delete(p.Annotations, redirect.AnnotationSidecarStatus)
		}
		p.Status.PodIPs = []corev1.PodIP{{IP: ip1}, {IP: ip2}}
		inMesh, reason, spec, err := FromPod(p)
		if reason == "" {
			t.Fatal("empty reason")
		}
		if err != nil {
			if !inMesh {
				t.Fatalf("error %v with inMesh false: the caller would skip instead of failing closed", err)
			}
			return
		}
		if !inMesh {
			return
		}
		if _, err := redirect.Build(spec); err != nil {
			t.Fatalf("in-mesh spec does not build: %v", err)
		}
		// IPv6 capture needs an IPv6 pod IP that counts.
		if spec.IPv6 {
			v6 := false
			for _, s := range []string{ip1, ip2} {
				a, err := netip.ParseAddr(s)
				if err != nil {
					pr, perr := netip.ParsePrefix(s)
					if perr != nil {
						continue
					}
					a = pr.Addr()
				}
				v6 = v6 || (meshpod.Counts(a) && a.Unmap().Is6())
			}
			if !v6 {
				t.Fatalf("IPv6 captured for pod IPs %q, %q", ip1, ip2)
			}
		}
	})
}
