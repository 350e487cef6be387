// Package manifest reads Pod manifests, YAML or JSON, as kubectl prints and
// reads them (sigs.k8s.io/yaml, documents split as kubectl splits a file),
// into the capture decision's view of a pod (package meshpod). It owns
// reading files and choosing a Pod among several documents; it does not
// decide anything about capture.
package manifest

import (
	"fmt"
	"slices"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/nftmesh/nftmesh/podinfo/meshpod"
	"github.com/nftmesh/nftmesh/redirect/quote"
)

// Object is what a workload reader chose from a manifest: the Pod, or a
// workload's pod template read as a pod of the workload's namespace and
// name (the template's own name and namespace, when it has them, win).
type Object struct {
	Pod  *meshpod.Pod
	Kind string // Pod, or a workload kind (WorkloadKinds)
	// Namespace and Name are the object's own (a workload's, not its
	// template's).
	Namespace, Name string
}

// Subject names the object in messages: "pod NAMESPACE/NAME", or for a
// workload "Deployment NAMESPACE/NAME".
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

// ParseWorkload reads what users have: a Pod, or the pod template of a
// Deployment, StatefulSet, DaemonSet, ReplicaSet, Job (spec.template) or
// CronJob (spec.jobTemplate.spec.template), as written or as `istioctl
// kube-inject` prints it. The stream is read as SelectPod reads it
// (documents, Lists), other kinds (Services, ServiceAccounts) skipped;
// name ("NAME", "NAMESPACE/NAME" or "KIND/NAME") picks among several, and
// without it there must be exactly one. Errors name the document, the
// kind and the field.
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

// unmarshalYAML is sigs.k8s.io/yaml's Unmarshal: YAML (or JSON) into the
// json tags, a number or boolean bound for a string field read as its
// text (an unquoted `sidecar.istio.io/inject: true`).
func unmarshalYAML(b []byte, v any) error { return yaml.Unmarshal(b, v) }
