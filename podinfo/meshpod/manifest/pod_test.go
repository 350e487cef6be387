package manifest

import (
	"fmt"

	"github.com/nftmesh/nftmesh/podinfo/meshpod"
)

// The Pod-only readers: the CLI reads --pod with ReadWorkload; these read
// a stream as SelectPod chooses, as the corev1 reader (testkit/kubetest's ParsePod)
// does, for the tests of that choice.

// ReadManifest reads the one Pod of a manifest file, YAML or JSON (see
// SelectPod for streams of several objects).
func ReadManifest(path string) (*meshpod.Pod, error) { return ReadManifestNamed(path, "") }

// ReadManifestNamed reads the Pod called name ("NAME" or "NAMESPACE/NAME";
// "" for the only one) from a manifest file.
func ReadManifestNamed(path, name string) (*meshpod.Pod, error) {
	data, err := ReadManifestData(path)
	if err != nil {
		return nil, err
	}
	pod, err := ParseManifestNamed(data, name)
	if err != nil {
		return nil, fmt.Errorf("reading pod manifest %s: %w", path, err)
	}
	return pod, nil
}

// ParseManifest decodes the one Pod of a manifest, YAML or JSON. Any other
// kind, or a document without a kind, is an error naming what was found.
func ParseManifest(data []byte) (*meshpod.Pod, error) { return ParseManifestNamed(data, "") }

// ParseManifestNamed decodes the Pod called name from a manifest stream.
func ParseManifestNamed(data []byte, name string) (*meshpod.Pod, error) {
	data, err := SelectPod(data, name)
	if err != nil {
		return nil, err
	}
	return meshpod.DecodeManifest(data, unmarshalYAML)
}
