package manifest_test

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/nftmesh/nftmesh/podinfo"
	"github.com/nftmesh/nftmesh/podinfo/meshpod"
	"github.com/nftmesh/nftmesh/podinfo/meshpod/manifest"
	"github.com/nftmesh/nftmesh/testkit/istiotest"
)

// TestParseWorkloadKubeInject: `istioctl kube-inject` output as it is (a
// ServiceAccount, a Service and the injected Deployment, in documents) is
// read: the Deployment's pod template decides exactly as the same
// template decoded into corev1 types (k8s.io/api, the plugin's decoder)
// does, in the mesh for every injected workload and out of it for the one
// the injector left alone.
func TestParseWorkloadKubeInject(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(istiotest.TestdataDir(), "injected", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no injected workloads: %v", err)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			o, err := manifest.ReadWorkload(f, "")
			if err != nil {
				t.Fatal(err)
			}
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			objs, err := istiotest.SplitManifests(data)
			if err != nil {
				t.Fatal(err)
			}
			var want *corev1.Pod
			for _, obj := range objs {
				if obj.Kind == "Deployment" {
					meta, spec, err := istiotest.PodTemplate(obj)
					if err != nil {
						t.Fatal(err)
					}
					want = &corev1.Pod{ObjectMeta: meta, Spec: spec}
					want.Namespace, want.Name = o.Namespace, obj.Name
				}
			}
			if want == nil || o.Kind != "Deployment" || o.Name != want.Name {
				t.Fatalf("read %s from %s", o.Subject(), f)
			}
			in1, r1, s1, e1 := podinfo.FromPod(want)
			in2, r2, s2, e2 := meshpod.Decide(o.Pod)
			if in1 != in2 || r1 != r2 || !reflect.DeepEqual(s1, s2) || (e1 == nil) != (e2 == nil) {
				t.Errorf("corev1: (%t %q %+v %v); read by the CLI: (%t %q %+v %v)", in1, r1, s1, e1, in2, r2, s2, e2)
			}
			if wantIn := filepath.Base(f) != "no-inject.yaml"; in2 != wantIn || e2 != nil {
				t.Errorf("in the mesh: %t (%v), want %t", in2, e2, wantIn)
			}
		})
	}
}
