package capture_test

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/nftmesh/nftmesh/capture"
	"github.com/nftmesh/nftmesh/podinfo/meshpod"
	"github.com/nftmesh/nftmesh/redirect"
)

func sidecarPod(dualStack bool, ann map[string]string) *meshpod.Pod {
	a := map[string]string{"sidecar.istio.io/status": "{}"}
	for k, v := range ann {
		a[k] = v
	}
	proxy := meshpod.Container{Name: meshpod.ProxyContainer, Args: []string{"proxy", "sidecar"}}
	if dualStack {
		proxy.Env = []meshpod.EnvVar{{Name: meshpod.EnvDualStack, Value: "true"}}
	}
	return &meshpod.Pod{Namespace: "shop", Name: "web-1", Annotations: a, Containers: []meshpod.Container{{Name: "app"}, proxy},
		PodIPs: []string{"2001:db8::7"}}
}

func addrs(list ...string) (capture.AddrSource, *int) {
	calls := 0
	return func() ([]netip.Addr, error) {
		calls++
		var out []netip.Addr
		for _, s := range list {
			out = append(out, netip.MustParseAddr(s))
		}
		return out, nil
	}, &calls
}

// TestPlan: the one decision every front end takes: IPv6 capture from the
// namespace's addresses (not the pod's IPs) when given, read only for a pod
// in the mesh; each failure names its step.
func TestPlan(t *testing.T) {
	for _, tc := range []struct {
		name     string
		dual     bool
		addrs    []string
		wantIPv6 bool
	}{
		{"IPv4 listed first, sidecar not dual-stack", false, []string{"127.0.0.1", "198.51.100.7", "::1", "2001:db8::7"}, false},
		{"IPv4 listed first, dual-stack sidecar", true, []string{"127.0.0.1", "198.51.100.7", "::1", "2001:db8::7"}, true},
		{"IPv6 only", false, []string{"127.0.0.1", "::1", "fe80::1", "2001:db8::7"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src, calls := addrs(tc.addrs...)
			d, err := capture.Plan(sidecarPod(tc.dual, nil), src)
			if err != nil || !d.InMesh || d.Reason != meshpod.ReasonInMesh || *calls != 1 {
				t.Fatalf("Plan = %+v, %v (%d address reads)", d, err, *calls)
			}
			if d.Spec.IPv6 != tc.wantIPv6 {
				t.Errorf("IPv6 = %t, want %t", d.Spec.IPv6, tc.wantIPv6)
			}
			want, err := redirect.Build(d.Spec)
			if err != nil {
				t.Fatal(err)
			}
			if diff := redirect.Diff(want, d.Plan); len(diff) > 0 {
				t.Errorf("Plan's plan is not Build's of its spec: %v", diff)
			}
		})
	}
	t.Run("no address source: predicted from the pod's IPs", func(t *testing.T) {
		d, err := capture.Plan(sidecarPod(false, nil), nil)
		if err != nil || !d.Spec.IPv6 {
			t.Errorf("Plan = IPv6 %t, %v; want IPv6 from the pod's IPv6 IP", d.Spec.IPv6, err)
		}
	})
	t.Run("not in the mesh: no address read", func(t *testing.T) {
		src, calls := addrs("198.51.100.7")
		pod := sidecarPod(false, nil)
		pod.Containers = pod.Containers[:1]
		d, err := capture.Plan(pod, src)
		if err != nil || d.InMesh || d.Reason != meshpod.ReasonNoProxy || *calls != 0 || len(d.Plan.Tables) != 0 {
			t.Errorf("Plan = %+v, %v (%d address reads)", d, err, *calls)
		}
	})
	t.Run("bad annotation", func(t *testing.T) {
		src, calls := addrs("198.51.100.7")
		_, err := capture.Plan(sidecarPod(false, map[string]string{redirect.AnnotationExcludeOutboundIPRanges: "10.0.0.0/33"}), src)
		var ve *redirect.ValidationError
		if capture.PlanStep(err) != capture.StepDecide || !errors.As(err, &ve) || *calls != 0 {
			t.Errorf("Plan = %v (step %q), want a validation error at %q", err, capture.PlanStep(err), capture.StepDecide)
		}
	})
	t.Run("addresses unreadable", func(t *testing.T) {
		boom := errors.New("netns gone")
		_, err := capture.Plan(sidecarPod(false, nil), func() ([]netip.Addr, error) { return nil, boom })
		if capture.PlanStep(err) != capture.StepAddrs || !errors.Is(err, boom) || err.Error() != boom.Error() {
			t.Errorf("Plan = %v (step %q), want %v at %q", err, capture.PlanStep(err), boom, capture.StepAddrs)
		}
	})
	t.Run("spec that does not build", func(t *testing.T) {
		spec := redirect.DefaultSpec()
		spec.InterceptionMode = "BOGUS"
		_, err := capture.PlanSpec(spec, nil)
		if capture.PlanStep(err) != capture.StepBuild {
			t.Errorf("PlanSpec = %v (step %q), want step %q", err, capture.PlanStep(err), capture.StepBuild)
		}
	})
}
