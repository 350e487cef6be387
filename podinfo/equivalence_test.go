package podinfo

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/nftmesh/nftmesh/podinfo/meshpod"
	"github.com/nftmesh/nftmesh/podinfo/meshpod/manifest"
	"github.com/nftmesh/nftmesh/testkit/kubetest"
)

// parseManifest is ParsePod's twin without corev1: the Pod SelectPod
// chooses, decoded by meshpod.
func parseManifest(data []byte) (*meshpod.Pod, error) {
	data, err := manifest.SelectPod(data, "")
	if err != nil {
		return nil, err
	}
	return meshpod.DecodeManifest(data, func(b []byte, v any) error { return yaml.Unmarshal(b, v) })
}

// The CLI reads manifests with meshpod (no Kubernetes imports); the plugin
// decodes corev1.Pods. Both must decide the same.
func sameDecision(t *testing.T, name string, data []byte) {
	t.Helper()
	pod, perr := kubetest.ParsePod(data)
	mp, merr := parseManifest(data)
	if (perr == nil) != (merr == nil) {
		t.Fatalf("%s: corev1 decode err=%v, manifest decode err=%v", name, perr, merr)
	}
	if perr != nil {
		return
	}
	in1, r1, s1, e1 := FromPod(pod)
	in2, r2, s2, e2 := meshpod.Decide(mp)
	if in1 != in2 || r1 != r2 || !reflect.DeepEqual(s1, s2) || (e1 == nil) != (e2 == nil) || (e1 != nil && e1.Error() != e2.Error()) {
		t.Fatalf("%s: FromPod = (%t %q %+v %v), meshpod = (%t %q %+v %v)", name, in1, r1, s1, e1, in2, r2, s2, e2)
	}
}

func TestManifestDecisionMatchesCorev1(t *testing.T) {
	dir := filepath.Join("..", "testdata", "pods")
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		sameDecision(t, e.Name(), data)
	}
}

func FuzzManifestDecisionMatchesCorev1(f *testing.F) {
	dir := filepath.Join("..", "testdata", "pods")
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if data, err := os.ReadFile(filepath.Join(dir, e.Name())); err == nil {
			f.Add(data)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		// Only well-formed Pods: the two decoders may word decode errors
		// differently, but must agree on every Pod corev1 accepts.
		var pod corev1.Pod
		if json.Unmarshal(data, &pod) != nil {
			if _, err := kubetest.ParsePod(data); err != nil {
				return
			}
		}
		sameDecision(t, "fuzz", data)
	})
}
