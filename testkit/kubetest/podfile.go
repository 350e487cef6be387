package kubetest

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/nftmesh/nftmesh/podinfo/meshpod"
	"github.com/nftmesh/nftmesh/podinfo/meshpod/manifest"
)

// ReadPodFile reads the one Pod of a manifest file (test fixtures) (ParsePod), capped at
// manifest.MaxManifestSize.
func ReadPodFile(path string) (*corev1.Pod, error) {
	data, err := manifest.ReadManifestData(path)
	if err != nil {
		return nil, err
	}
	pod, err := ParsePod(data)
	if err != nil {
		return nil, fmt.Errorf("reading pod manifest %s: %w", path, err)
	}
	return pod, nil
}

// ParsePod decodes the one Pod of a manifest, YAML or JSON, chosen as
// manifest.SelectPod chooses it; anything else is an error naming it.
func ParsePod(data []byte) (*corev1.Pod, error) {
	data, err := manifest.SelectPod(data, "")
	if err != nil {
		return nil, err
	}
	// The kind and apiVersion checks are the product's own.
	if _, err := meshpod.DecodeManifest(data, func(b []byte, v any) error { return yaml.Unmarshal(b, v) }); err != nil {
		return nil, err
	}
	var pod corev1.Pod
	if err := yaml.Unmarshal(data, &pod); err != nil {
		return nil, fmt.Errorf("decoding Pod: %w", err)
	}
	return &pod, nil
}
