// Package manifest reads Pod and workload manifests, YAML or JSON, as
// kubectl does, into the capture decision's view of a pod (meshpod). It
// owns reading files and choosing among documents, and decides nothing.
package manifest

import (
	"fmt"
	"slices"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/nftmesh/nftmesh/podinfo/meshpod"
	"github.com/nftmesh/nftmesh/redirect/quote"
)

// Object is what a workload reader chose: the Pod, or a workload's pod
// template as a pod of the workload's namespace and name (unless the
// template has its own).
type Object struct {
	Pod             *meshpod.Pod
	Kind            string // Pod, or one of WorkloadKinds
	Namespace, Name string // the object's own, not its template's
}

// Subject names the object in messages: "pod NS/NAME", "Deployment NS/NAME".
func (o Object) Subject() string {
	kind := o.Kind
	if kind == "Pod" {
		kind = "pod"
	}
	return kind + " " + o.Namespace + "/" + o.Name
}

// ReadWorkload reads the Pod or workload called name ("" for the only one;
// see ParseWorkload) from a manifest file.
func ReadWorkload(path, name string) (Object, error) {
	data, err := ReadManifestData(path)
	if err != nil {
		return Object{}, err
	}
	o, err := ParseWorkload(data, name)
	if err != nil {
		return Object{}, fmt.Errorf("reading pod manifest %s: %w", path, err)
	}
	return o, nil
}

// ParseWorkload reads a Pod, or the pod template of one of WorkloadKinds,
// as written or as `istioctl kube-inject` prints it. The stream is read as
// SelectPod reads it, other kinds skipped; name ("NAME", "NAMESPACE/NAME"
// or "KIND/NAME") picks among several, else there must be exactly one.
// Errors name the document, the kind and the field.
func ParseWorkload(data []byte, name string) (Object, error) {
	c, err := selectObject(data, name, true)
	if err != nil {
		return Object{}, err
	}
	o := Object{Kind: c.head.Kind, Namespace: c.head.Metadata.Namespace, Name: c.head.Metadata.Name}
	if c.head.Kind == "Pod" {
		if o.Pod, err = meshpod.DecodeManifest(c.data, unmarshalYAML); err != nil {
			return Object{}, fmt.Errorf("%s: %w", c, err)
		}
		return o, nil
	}
	if v := c.head.APIVersion; v != "" {
		group, _, _ := strings.Cut(v, "/")
		if !strings.Contains(v, "/") || !slices.Contains(workloadGroups[c.head.Kind], group) {
			return Object{}, fmt.Errorf("%s: apiVersion is %s (want %s/v1)", c, quote.Value(v), workloadGroups[c.head.Kind][0])
		}
	}
	if o.Pod, err = meshpod.DecodeTemplate(c.data, c.head.Kind == "CronJob", unmarshalYAML); err != nil {
		return Object{}, fmt.Errorf("%s: %w", c, err)
	}
	if o.Pod.Namespace == "" {
		o.Pod.Namespace = o.Namespace
	}
	if o.Pod.Name == "" {
		o.Pod.Name = o.Name
	}
	return o, nil
}

// unmarshalYAML is yaml.Unmarshal without options: a number or boolean
// bound for a string field reads as its text.
func unmarshalYAML(b []byte, v any) error { return yaml.Unmarshal(b, v) }
