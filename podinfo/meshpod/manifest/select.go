package manifest

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/nftmesh/nftmesh/redirect/quote"
)

// MaxManifestSize caps a manifest read (objects are at most 1.5 MiB), so
// a mistaken path (/dev/zero, a log file) cannot fill memory.
const MaxManifestSize = 4 << 20

// ReadCapped reads r to its end, or fails naming what once it passes
// MaxManifestSize.
func ReadCapped(r io.Reader, what string) ([]byte, error) {
	data, err := io.ReadAll(io.LimitReader(r, MaxManifestSize+1))
	if err != nil {
		return nil, fmt.Errorf("reading pod manifest %s: %w", what, err)
	}
	if len(data) > MaxManifestSize {
		return nil, fmt.Errorf("reading pod manifest %s: larger than the %d MiB cap on manifests", what, MaxManifestSize>>20)
	}
	return data, nil
}

// ReadManifestData reads a manifest file, capped at MaxManifestSize.
func ReadManifestData(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("reading pod manifest: %w", err)
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.IsDir() {
		return nil, fmt.Errorf("reading pod manifest %s: a directory, not a file", path)
	}
	return ReadCapped(f, path)
}

// SelectPod finds the one Pod of a manifest stream and returns its document
// as found. The stream may hold "---"-separated documents (kubectl's
// reader) and List or PodList objects; every Pod in them is a candidate.
// name ("NAME", "NAMESPACE/NAME" or "Pod/NAME") picks one, else there must
// be exactly one; anything else is an error listing what was found, never
// a silent choice. A lone document that is not a Pod is left to the Pod
// decoder's errors.
func SelectPod(data []byte, name string) ([]byte, error) {
	c, err := selectObject(data, name, false)
	if err != nil {
		return nil, err
	}
	return c.data, nil
}

// workloadGroups are the kinds that hold a pod template, with their API
// groups (extensions: old manifests, same template).
var workloadGroups = map[string][]string{
	"Deployment":  {"apps", "extensions"},
	"StatefulSet": {"apps"},
	"DaemonSet":   {"apps", "extensions"},
	"ReplicaSet":  {"apps", "extensions"},
	"Job":         {"batch"},
	"CronJob":     {"batch"},
}

// WorkloadKinds names workloadGroups' kinds, for help texts.
const WorkloadKinds = "Deployment, StatefulSet, DaemonSet, ReplicaSet, Job, CronJob"

// selectObject is SelectPod that, with workloads, also takes
// workloadGroups' kinds.
func selectObject(data []byte, name string, workloads bool) (candidate, error) {
	docs, err := splitDocuments(data)
	if err != nil {
		return candidate{}, err
	}
	var found []candidate
	var others []string
	for d, doc := range docs {
		where := ""
		if len(docs) > 1 {
			where = fmt.Sprintf("document %d", d+1)
		}
		// One struct, no embedding: only then does sigs.k8s.io/yaml read
		// `name: 1234` as text.
		var head typeHead
		if err := unmarshalHead(doc, &head, cmp.Or(where, "the manifest")); err != nil {
			return candidate{}, fmt.Errorf("decoding manifest%s: %w", prefixed(" ", where), err)
		}
		switch {
		case head.Kind == "List" || head.Kind == "PodList":
			f, o, err := listCandidates(head, where, workloads)
			if err != nil {
				return candidate{}, err
			}
			found, others = append(found, f...), append(others, o...)
		case len(docs) == 1 && !workloads, (&candidate{head: head}).wanted(workloads):
			// The Pod decoder says what is wrong with a lone document.
			found = append(found, candidate{head, doc, where})
		default:
			others = append(others, head.describe())
		}
	}
	if len(docs) == 1 && len(found) == 1 && name == "" {
		return found[0], nil
	}
	return pick(found, others, name, workloads)
}

// listCandidates splits a List's or PodList's items into candidates and
// descriptions of the others.
func listCandidates(head typeHead, where string, workloads bool) (found []candidate, others []string, err error) {
	if len(head.Items) == 0 {
		others = append(others, "an empty "+head.Kind)
	}
	for i, item := range head.Items {
		var ih typeHead
		err := unmarshalHead(item, &ih, "the item")
		if err == nil && head.Kind == "PodList" && ih.Kind == "" {
			// A PodList's items carry no kind of their own.
			ih.Kind, ih.APIVersion = "Pod", head.APIVersion
			item, err = withKind(item, ih.APIVersion)
		}
		if err != nil {
			return nil, nil, fmt.Errorf("decoding manifest%s: %s item %d: %w", prefixed(" ", where), head.Kind, i, err)
		}
		c := candidate{ih, item, strings.TrimPrefix(fmt.Sprintf("%s, %s item %d", where, head.Kind, i), ", ")}
		if c.wanted(workloads) {
			found = append(found, c)
		} else {
			others = append(others, ih.describe())
		}
	}
	return found, others, nil
}

// pick is the one object of found that name picks, or an error saying
// what the manifest holds.
func pick(found []candidate, others []string, name string, workloads bool) (candidate, error) {
	var match []candidate
	for _, c := range found {
		if name == "" || c.matches(name) {
			match = append(match, c)
		}
	}
	what, kinds := "Pod", ""
	if workloads {
		what, kinds = "Pod or workload", " ("+WorkloadKinds+")"
	}
	switch {
	case len(match) == 1:
		return match[0], nil
	case len(found) == 0:
		f := "nothing"
		if len(others) > 0 {
			f = listOf(others)
		}
		return candidate{}, fmt.Errorf("no %s%s in the manifest (found %s)", what, kinds, f)
	case name == "":
		return candidate{}, fmt.Errorf("the manifest holds %s (%s): choose one with --name NAME, NAMESPACE/NAME or KIND/NAME", count(found), candidateList(found))
	case len(match) == 0:
		return candidate{}, fmt.Errorf("no %s named %s in the manifest (found %s)", what, quote.Value(name), candidateList(found))
	default:
		return candidate{}, fmt.Errorf("%s are named %s (%s): choose one with --name NAMESPACE/NAME or --name KIND/NAME", count(match), quote.Value(name), candidateList(match))
	}
}

// typeHead is what the selection reads of each object.
type typeHead struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	} `json:"metadata"`
	Items []json.RawMessage `json:"items"`
}

func (h typeHead) ref() string {
	if h.Metadata.Namespace == "" {
		return h.Metadata.Name
	}
	return h.Metadata.Namespace + "/" + h.Metadata.Name
}

func (h typeHead) describe() string {
	kind := h.Kind
	if kind == "" {
		kind = "an object without kind"
	}
	if h.Metadata.Name == "" {
		return quote.TextN(kind, 64)
	}
	return quote.TextN(kind, 64) + " " + quote.Value(h.ref())
}

// candidate is an object the selection may choose, with where it is in
// the stream ("document 2", "List item 0"; "" for a lone document).
type candidate struct {
	head  typeHead
	data  []byte
	where string
}

func (c *candidate) wanted(workloads bool) bool {
	if c.head.Kind == "Pod" {
		return true
	}
	_, ok := workloadGroups[c.head.Kind]
	return workloads && ok
}

// matches reports whether name names c (KIND/NAME in any case).
func (c candidate) matches(name string) bool {
	if first, n, ok := strings.Cut(name, "/"); ok {
		return n == c.head.Metadata.Name && (first == c.head.Metadata.Namespace || strings.EqualFold(first, c.head.Kind))
	}
	return c.head.Metadata.Name == name
}

func (c candidate) String() string { return c.head.describe() + prefixed(" ", "("+c.where+")") }

// prefixed is p+s, or "" when s is empty or "()".
func prefixed(p, s string) string {
	if s == "" || s == "()" {
		return ""
	}
	return p + s
}

// maxListed bounds how many objects an error lists.
const maxListed = 10

// count is "2 Pods", or with other kinds among them "3 objects".
func count(cs []candidate) string {
	for _, c := range cs {
		if c.head.Kind != "Pod" {
			return fmt.Sprintf("%d objects", len(cs))
		}
	}
	return fmt.Sprintf("%d Pods", len(cs))
}

// candidateList lists cs: Pods by NAMESPACE/NAME alone when all are Pods,
// else each with its kind.
func candidateList(cs []candidate) string {
	all := count(cs) == fmt.Sprintf("%d Pods", len(cs))
	refs := make([]string, len(cs))
	for i, c := range cs {
		refs[i] = quote.Value(c.head.ref())
		if !all {
			refs[i] = c.head.describe()
		}
	}
	return listOf(refs)
}

func listOf(items []string) string {
	if len(items) <= maxListed {
		return strings.Join(items, ", ")
	}
	return strings.Join(items[:maxListed], ", ") + fmt.Sprintf(" and %d more", len(items)-maxListed)
}

// withKind adds kind Pod and apiVersion to a PodList item.
func withKind(item json.RawMessage, apiVersion string) (json.RawMessage, error) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(item, &obj); err != nil {
		return nil, err
	}
	if obj == nil {
		return nil, errors.New("item is not an object")
	}
	obj["kind"] = json.RawMessage(`"Pod"`)
	if apiVersion != "" {
		v, _ := json.Marshal(apiVersion)
		obj["apiVersion"] = v
	}
	return json.Marshal(obj)
}

// unmarshalHead reads an object's typeHead; whole names the object in an
// error about its shape (a list or a string where an object belongs).
func unmarshalHead(data []byte, head *typeHead, whole string) error {
	err := yaml.Unmarshal(data, head)
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return typeError(te, whole)
	}
	if err != nil {
		return unmarshalYAML(data, head) // its error, in the same words
	}
	return nil
}

// EmptyError is a manifest with no object in it: no bytes, only
// whitespace, or only comments, "---" separators and nulls.
type EmptyError struct {
	Size  int  // bytes read
	Blank bool // only whitespace
	// What names the input: "the manifest" unless Source says otherwise.
	What string
}

func (e *EmptyError) Error() string {
	what := cmp.Or(e.What, "the manifest")
	switch {
	case e.Size == 0:
		return what + " is empty"
	case e.Blank:
		return what + " holds only whitespace"
	}
	return what + " holds no object (only comments, --- separators or null)"
}

// Source names the input err is about in an *EmptyError ("the file",
// "standard input"), so that it says which input is empty.
func Source(err error, what string) error {
	if ee := (*EmptyError)(nil); errors.As(err, &ee) {
		ee.What = what
	}
	return err
}

// splitDocuments splits a YAML stream with kubectl's reader and drops empty
// documents; a stream of none is an *EmptyError.
func splitDocuments(data []byte) ([][]byte, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var docs [][]byte
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("splitting manifest documents: %w", err)
		}
		if j, err := yaml.YAMLToJSON(doc); err == nil && string(j) == "null" {
			continue
		}
		docs = append(docs, doc)
	}
	if len(docs) == 0 {
		return nil, &EmptyError{Size: len(data), Blank: len(bytes.TrimSpace(data)) == 0}
	}
	return docs, nil
}
