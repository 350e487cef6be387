package meshpod

import (
	"encoding/json"
	"fmt"

	"github.com/nftmesh/nftmesh/redirect/quote"
)

// manifest mirrors the Pod fields Decide reads (and the UID) by their JSON
// names; other fields are ignored, as a non-strict corev1.Pod decode does.
type manifest struct {
	APIVersion string  `json:"apiVersion"`
	Kind       string  `json:"kind"`
	Metadata   podMeta `json:"metadata"`
	Spec       podSpec `json:"spec"`
	Status     struct {
		PodIP  string `json:"podIP"`
		PodIPs []struct {
			IP string `json:"ip"`
		} `json:"podIPs"`
	} `json:"status"`
}

type podMeta struct {
	Name        string            `json:"name"`
	Namespace   string            `json:"namespace"`
	UID         string            `json:"uid"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
}

type podSpec struct {
	InitContainers []manifestContainer `json:"initContainers"`
	Containers     []manifestContainer `json:"containers"`
}

// podTemplate is a workload's pod template (named fields, not embedded, so
// sigs.k8s.io/yaml's guided decode reads an unquoted `inject: true` as
// text).
type podTemplate struct {
	Metadata podMeta `json:"metadata"`
	Spec     podSpec `json:"spec"`
}

// workload holds spec.template, or a CronJob's
// spec.jobTemplate.spec.template.
type workload struct {
	Spec struct {
		Template    *podTemplate `json:"template"`
		JobTemplate *struct {
			Spec struct {
				Template *podTemplate `json:"template"`
			} `json:"spec"`
		} `json:"jobTemplate"`
	} `json:"spec"`
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

// DecodeManifest decodes one Pod document with unmarshal (JSON, or YAML
// into the json tags) and checks it is a v1 Pod, naming what was found
// otherwise. Package manifest reads files and chooses among documents.
func DecodeManifest(data []byte, unmarshal func([]byte, any) error) (*Pod, error) {
	var m manifest
	if err := unmarshal(data, &m); err != nil {
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

// DecodeTemplate decodes a workload document's pod template with
// unmarshal (with jobTemplate, a CronJob's). The Pod has the template's
// metadata; a missing namespace or name is the caller's to fill in (the
// workload's). No template is an error naming the field.
func DecodeTemplate(data []byte, jobTemplate bool, unmarshal func([]byte, any) error) (*Pod, error) {
	var w workload
	if err := unmarshal(data, &w); err != nil {
		return nil, fmt.Errorf("decoding pod template: %w", err)
	}
	t, field := w.Spec.Template, "spec.template"
	if jobTemplate {
		t, field = nil, "spec.jobTemplate.spec.template"
		if w.Spec.JobTemplate != nil {
			t = w.Spec.JobTemplate.Spec.Template
		}
	}
	if t == nil {
		return nil, fmt.Errorf("no pod template: %s is missing", field)
	}
	m := manifest{Metadata: t.Metadata, Spec: t.Spec}
	return m.pod(), nil
}

// DecodeAPIPod decodes a v1 Pod as the API server sends it (JSON) into the
// decision's fields and its UID; anything else is an error naming it.
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
