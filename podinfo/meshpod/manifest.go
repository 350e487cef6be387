package meshpod

import (
	"encoding/json"
	"fmt"

	"sigs.k8s.io/yaml"

	"github.com/nftmesh/nftmesh/redirect/quote"
)

// The manifest mirror: the JSON names of the Pod fields Decide reads (and
// the UID), as `kubectl get pod -o yaml|json` prints them and the API server
// sends them. Other fields are ignored, as a
// non-strict decode of a corev1.Pod ignores unknown ones.
type manifest struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name        string            `json:"name"`
		Namespace   string            `json:"namespace"`
		UID         string            `json:"uid"`
		Labels      map[string]string `json:"labels"`
		Annotations map[string]string `json:"annotations"`
	} `json:"metadata"`
	Spec struct {
		InitContainers []manifestContainer `json:"initContainers"`
		Containers     []manifestContainer `json:"containers"`
	} `json:"spec"`
	Status struct {
		PodIP  string `json:"podIP"`
		PodIPs []struct {
			IP string `json:"ip"`
		} `json:"podIPs"`
	} `json:"status"`
}

type manifestContainer struct {
	Name string   `json:"name"`
	Args []string `json:"args"`
	Env  []struct {
		Name  string `json:"name"`
		Value string `json:"value"`
	} `json:"env"`
	SecurityContext *struct {
		RunAsUser  *int64 `json:"runAsUser"`
		RunAsGroup *int64 `json:"runAsGroup"`
	} `json:"securityContext"`
}

// ReadManifest reads the one Pod of a manifest file, YAML or JSON (see
// SelectPod for streams of several objects).
func ReadManifest(path string) (*Pod, error) { return ReadManifestNamed(path, "") }

// ReadManifestNamed reads the Pod called name ("NAME" or "NAMESPACE/NAME";
// "" for the only one) from a manifest file.
func ReadManifestNamed(path, name string) (*Pod, error) {
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
func ParseManifest(data []byte) (*Pod, error) { return ParseManifestNamed(data, "") }

// ParseManifestNamed decodes the Pod called name from a manifest stream.
func ParseManifestNamed(data []byte, name string) (*Pod, error) {
	data, err := SelectPod(data, name)
	if err != nil {
		return nil, err
	}
	var m manifest
	if err := yaml.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("decoding Pod: %w", err)
	}
	switch {
	case m.Kind == "":
		return nil, fmt.Errorf("manifest has no kind (want kind: Pod)")
	case m.Kind != "Pod":
		return nil, fmt.Errorf("manifest kind is %s (want Pod)", quote.Value(m.Kind))
	case m.APIVersion != "" && m.APIVersion != "v1":
		return nil, fmt.Errorf("manifest apiVersion is %s (want v1)", quote.Value(m.APIVersion))
	}
	return m.pod(), nil
}

// DecodeAPIPod decodes a Pod as the API server sends it (JSON, kind Pod,
// apiVersion v1) into the fields the capture decision reads, and its UID.
// Another kind or version is an error naming what came.
func DecodeAPIPod(body []byte) (p *Pod, uid string, err error) {
	// The kind first: another kind's fields need not fit a Pod's.
	var tm struct {
		Kind       string `json:"kind"`
		APIVersion string `json:"apiVersion"`
	}
	if err := json.Unmarshal(body, &tm); err != nil {
		return nil, "", fmt.Errorf("decoding the API server's answer: %w", err)
	}
	if tm.Kind != "Pod" || tm.APIVersion != "v1" {
		return nil, "", fmt.Errorf("the API server answered with a %s of apiVersion %s, not a v1 Pod", quote.Value(tm.Kind), quote.Value(tm.APIVersion))
	}
	var m manifest
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, "", fmt.Errorf("decoding the API server's Pod: %w", err)
	}
	return m.pod(), m.Metadata.UID, nil
}

// pod is the decision's view of a decoded manifest.
func (m *manifest) pod() *Pod {
	p := &Pod{
		Namespace:   m.Metadata.Namespace,
		Name:        m.Metadata.Name,
		Labels:      m.Metadata.Labels,
		Annotations: m.Metadata.Annotations,
	}
	conv := func(cs []manifestContainer) []Container {
		var out []Container
		for _, c := range cs {
			oc := Container{Name: c.Name, Args: c.Args}
			for _, e := range c.Env {
				oc.Env = append(oc.Env, EnvVar{Name: e.Name, Value: e.Value})
			}
			if c.SecurityContext != nil {
				oc.RunAsUser, oc.RunAsGroup = c.SecurityContext.RunAsUser, c.SecurityContext.RunAsGroup
			}
			out = append(out, oc)
		}
		return out
	}
	p.InitContainers = conv(m.Spec.InitContainers)
	p.Containers = conv(m.Spec.Containers)
	if m.Status.PodIP != "" {
		p.PodIPs = append(p.PodIPs, m.Status.PodIP)
	}
	for _, ip := range m.Status.PodIPs {
		p.PodIPs = append(p.PodIPs, ip.IP)
	}
	return p
}
