// Package manifest reads Pod manifests, YAML or JSON, as kubectl prints and
// reads them (sigs.k8s.io/yaml, documents split as kubectl splits a file),
// into the capture decision's view of a pod (package meshpod). It owns
// reading files and choosing a Pod among several documents; it does not
// decide anything about capture.
package manifest

import (
	"fmt"

	"sigs.k8s.io/yaml"

	"github.com/nftmesh/nftmesh/podinfo/meshpod"
)

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

// unmarshalYAML is sigs.k8s.io/yaml's Unmarshal: YAML (or JSON) into the
// json tags, a number or boolean bound for a string field read as its
// text (an unquoted `sidecar.istio.io/inject: true`).
func unmarshalYAML(b []byte, v any) error { return yaml.Unmarshal(b, v) }
