package kubetest

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/nftmesh/nftmesh/podinfo/meshpod/manifest"
	"github.com/nftmesh/nftmesh/redirect/quote"
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
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(data, &tm); err != nil {
		return nil, fmt.Errorf("decoding manifest: %w", err)
	}
	switch {
	case tm.Kind == "":
		return nil, fmt.Errorf("manifest has no kind (want kind: Pod)")
	case tm.Kind != "Pod":
		return nil, fmt.Errorf("manifest kind is %s (want Pod)", quote.Value(tm.Kind))
	case tm.APIVersion != "" && tm.APIVersion != "v1":
		return nil, fmt.Errorf("manifest apiVersion is %s (want v1)", quote.Value(tm.APIVersion))
	}
	var pod corev1.Pod
	if err := yaml.Unmarshal(data, &pod); err != nil {
		return nil, fmt.Errorf("decoding Pod: %w", err)
	}
	return &pod, nil
}
