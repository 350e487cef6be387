// Package manifest reads Pod and workload manifests, YAML or JSON, as
// kubectl does, into the capture decision's view of a pod (meshpod). It
// owns reading files and choosing among documents, and decides nothing.
package manifest

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
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

// Subject names the object in messages: "pod NS/NAME", "Deployment
// NS/NAME"; as kubectl does, NAME alone when the manifest gives no
// namespace (the pod's is then the one kubectl applies it to), and
// "(no metadata.name)" for an object without a name.
func (o Object) Subject() string {
	kind := o.Kind
	if kind == "Pod" {
		kind = "pod"
	}
	switch {
	case o.Name == "" && o.Namespace == "":
		return kind + " (no metadata.name)"
	case o.Name == "":
		return kind + " in namespace " + quote.Value(o.Namespace) + " (no metadata.name)"
	case o.Namespace == "":
		return kind + " " + o.Name
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
		return Object{}, fmt.Errorf("reading pod manifest %s: %w", path, Source(err, "the file"))
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

// unmarshalYAML is yaml.Unmarshal without options (a number or boolean
// bound for a string field reads as its text), its errors said in the
// manifest's terms: the field's path and what it holds against what it
// should, not Go's type names.
func unmarshalYAML(b []byte, v any) error {
	err := yaml.Unmarshal(b, v)
	if err == nil {
		return nil
	}
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return typeError(te, "the document")
	}
	msg := err.Error()
	for _, noise := range []string{"error converting YAML to JSON: ", "error unmarshaling JSON: ", "while decoding JSON: "} {
		msg = strings.TrimPrefix(msg, noise)
	}
	return errors.New(msg)
}

// typeError says which field holds a value of the wrong shape, and which
// shape it should have; whole names what Field "" (the top) is.
func typeError(te *json.UnmarshalTypeError, whole string) error {
	f := strings.TrimPrefix(te.Field, ".")
	if f == "" && te.Type.Kind() == reflect.Struct {
		return fmt.Errorf("%s is %s, not an object (several objects go in a kind: List's items, or in YAML documents separated by ---)", whole, jsonShape(te.Value))
	}
	return fmt.Errorf("%s is %s, want %s", cmp.Or(f, whole), jsonShape(te.Value), goShape(te.Type))
}

// jsonShape names a JSON value as UnmarshalTypeError.Value describes it
// ("array", "number -5", ...).
func jsonShape(v string) string {
	kind, _, _ := strings.Cut(v, " ")
	switch kind {
	case "array":
		return "a list"
	case "object":
		return "a map"
	case "number":
		return "a number"
	case "string":
		return "a string"
	case "bool":
		return "true or false"
	}
	return "a " + kind
}

// goShape names what a Go type takes, in the manifest's terms.
func goShape(t reflect.Type) string {
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a whole number"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Slice, reflect.Array:
		return "a list"
	case reflect.Map:
		if t.Elem().Kind() == reflect.String {
			return "a map of strings"
		}
		return "a map"
	}
	return "a map" // a struct: an object with named fields
}
