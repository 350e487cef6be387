package capture_test

import (
	"context"
	"errors"
	"io/fs"
	"testing"

	"github.com/nftmesh/nftmesh/capture"
	"github.com/nftmesh/nftmesh/podinfo/meshpod"
	"github.com/nftmesh/nftmesh/testkit/capturetest"
)

// TestFakeAdd: Add, a pod's ADD in one call, against the in-memory kernel:
// the namespace checked before the pod is asked for, the plan from the
// namespace's addresses, applied for a pod in the mesh only; each failure
// names its step, and the pod source's error comes back unchanged.
func TestFakeAdd(t *testing.T) {
	ctx := context.Background()
	errPod := errors.New("pod lookup failed")
	notInMesh := func() (*meshpod.Pod, error) {
		pod := sidecarPod(false, nil)
		pod.Containers = pod.Containers[:1]
		return pod, nil
	}
	for _, tc := range []struct {
		name    string
		path    string
		setup   func(f *capturetest.Fake)
		pod     func(f *capturetest.Fake) (*meshpod.Pod, error)
		step    string // "" for success
		podNot  bool   // the pod source must not be called
		inMesh  bool
		applied bool
	}{
		{name: "in the mesh", path: podNS, inMesh: true, applied: true,
			pod: func(*capturetest.Fake) (*meshpod.Pod, error) { return sidecarPod(true, nil), nil }},
		{name: "not in the mesh", path: podNS,
			pod: func(*capturetest.Fake) (*meshpod.Pod, error) { return notInMesh() }},
		{name: "host's namespace: refused before the pod is asked for", path: "/run/netns/host", step: capture.StepOpen, podNot: true,
			setup: func(f *capturetest.Fake) {
				if err := f.AddHostNetns("/run/netns/host"); err != nil {
					t.Skip(err)
				}
			}},
		{name: "pod source fails", path: podNS, step: capture.StepPod,
			pod: func(*capturetest.Fake) (*meshpod.Pod, error) { return nil, errPod }},
		{name: "invalid annotation", path: podNS, step: capture.StepDecide, inMesh: true,
			pod: func(*capturetest.Fake) (*meshpod.Pod, error) {
				return sidecarPod(false, map[string]string{"traffic.sidecar.istio.io/excludeOutboundIPRanges": "10.0.0.0/33"}), nil
			}},
		{name: "missing namespace, not in the mesh: nothing to open", path: "/run/netns/missing",
			pod: func(*capturetest.Fake) (*meshpod.Pod, error) { return notInMesh() }},
		{name: "missing namespace, in the mesh: its addresses cannot be read", path: "/run/netns/missing", step: capture.StepAddrs, inMesh: true,
			pod: func(*capturetest.Fake) (*meshpod.Pod, error) { return sidecarPod(false, nil), nil }},
		{name: "namespace made during the lookup: opened again and applied", path: "/run/netns/late", inMesh: true, applied: true,
			pod: func(f *capturetest.Fake) (*meshpod.Pod, error) {
				f.AddNetns("/run/netns/late", podV4)
				return sidecarPod(false, nil), nil
			}},
		{name: "apply fails", path: podNS, step: capture.StepApply, inMesh: true,
			setup: func(f *capturetest.Fake) { f.FailApply("", errors.New("boom"), false) },
			pod:   func(*capturetest.Fake) (*meshpod.Pod, error) { return sidecarPod(false, nil), nil }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, pl, o := fake(t)
			if tc.setup != nil {
				tc.setup(f)
			}
			asked := 0
			a, err := pl.Add(ctx, tc.path, func() (*meshpod.Pod, error) {
				asked++
				if tc.pod == nil {
					t.Fatal("pod source called")
				}
				return tc.pod(f)
			}, o)
			if got := capture.PlanStep(err); got != tc.step || (tc.step == "") != (err == nil) {
				t.Fatalf("Add = %+v, %v (step %q); want step %q", a, err, got, tc.step)
			}
			if tc.step == capture.StepOpen && !errors.Is(err, capture.ErrHostNetns) {
				t.Errorf("Add(host) = %v, want ErrHostNetns", err)
			}
			if tc.step == capture.StepPod && (!errors.Is(err, errPod) || err.Error() != errPod.Error()) {
				t.Errorf("Add = %v, want the pod source's error unchanged", err)
			}
			if tc.step == capture.StepAddrs && !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("Add = %v, want ErrNotExist", err)
			}
			if want := 1; tc.podNot {
				if asked != 0 {
					t.Errorf("pod source called %d times, want none", asked)
				}
			} else if asked != want {
				t.Errorf("pod source called %d times, want %d", asked, want)
			}
			if a.InMesh != tc.inMesh || (tc.step == "" && a.Reason == "") {
				t.Errorf("Add decision = in mesh %t, reason %q; want in mesh %t", a.InMesh, a.Reason, tc.inMesh)
			}
			holds := len(f.Holds(tc.path, capture.NFTables).Tables) > 0
			if holds != tc.applied {
				t.Errorf("namespace holds our rules: %t, want %t (calls %v)", holds, tc.applied, f.Calls())
			}
			if tc.applied && (a.Backend != capture.NFTables || a.Rules == 0 || a.Rules != capture.RuleCount(a.Plan)) {
				t.Errorf("Add applied = %+v, want nftables and the plan's rule count", a.Applied)
			}
			if tc.step == capture.StepApply && a.Backend != capture.NFTables {
				t.Errorf("failed Add names backend %q, want the one chosen (nftables)", a.Backend)
			}
		})
	}
}
