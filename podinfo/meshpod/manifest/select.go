package manifest

import (
	"bufio"
	"bytes"
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

// MaxManifestSize caps what a manifest read takes in. The API server stores
// objects of at most 1.5 MiB, and YAML of such a Pod is not much larger; a
// cap keeps a mistaken path (/dev/zero, a log file) from filling memory.
const MaxManifestSize = 4 << 20

// ReadCapped reads r to its end, or fails naming what (a file name, or
// "standard input") once it passes MaxManifestSize.
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
	return ReadCapped(f, path)
}

// SelectPod finds the one Pod a manifest stream describes and returns its
// document (JSON or YAML, as found). The stream may hold several documents
// separated by "---" lines (kubectl's rule and reader), and List or PodList
// objects (`kubectl get pods -o yaml`); every Pod in them is a candidate.
// name ("NAME" or "NAMESPACE/NAME") picks one; without it there must be
// exactly one. Anything else is an error listing what was found, never a
// silent choice of the first.
//
// A stream of one document that is not a Pod keeps the single-manifest
// errors (no kind, wrong kind, wrong apiVersion).
func SelectPod(data []byte, name string) ([]byte, error) {
	docs, err := splitDocuments(data)
	if err != nil {
		return nil, err
	}
	var pods []candidate
	var others []string
	for i, doc := range docs {
		var head struct {
			typeHead
			Items []json.RawMessage `json:"items"`
		}
		if err := yaml.Unmarshal(doc, &head); err != nil {
			if len(docs) > 1 {
				return nil, fmt.Errorf("decoding manifest document %d: %w", i+1, err)
			}
			return nil, fmt.Errorf("decoding manifest: %w", err)
		}
		switch {
		case head.Kind == "List" || head.Kind == "PodList":
			if len(head.Items) == 0 {
				others = append(others, "an empty "+head.Kind)
			}
			for i, item := range head.Items {
				var ih typeHead
				if err := json.Unmarshal(item, &ih); err != nil {
					return nil, fmt.Errorf("decoding %s item %d: %w", head.Kind, i, err)
				}
				if head.Kind == "PodList" && ih.Kind == "" {
					// A PodList's items carry no kind of their own.
					ih.Kind, ih.APIVersion = "Pod", head.APIVersion
					var err error
					if item, err = withKind(item, ih.APIVersion); err != nil {
						return nil, fmt.Errorf("decoding %s item %d: %w", head.Kind, i, err)
					}
				}
				if ih.Kind == "Pod" {
					pods = append(pods, candidate{ih, item})
				} else {
					others = append(others, ih.describe())
				}
			}
		case head.Kind == "Pod" || len(docs) == 1:
			// A lone document goes to the decoder, which says what is wrong
			// with it (no kind, another kind, another apiVersion).
			pods = append(pods, candidate{head.typeHead, doc})
		default:
			others = append(others, head.describe())
		}
	}
	if len(docs) == 1 && len(pods) == 1 && name == "" {
		return pods[0].doc, nil
	}
	var match []candidate
	for _, p := range pods {
		if name == "" || p.matches(name) {
			match = append(match, p)
		}
	}
	switch {
	case len(match) == 1:
		return match[0].doc, nil
	case len(pods) == 0:
		found := "nothing"
		if len(others) > 0 {
			found = listOf(others)
		}
		return nil, fmt.Errorf("no Pod in the manifest (found %s)", found)
	case name == "":
		return nil, fmt.Errorf("the manifest holds %d Pods (%s): choose one by name", len(pods), podList(pods))
	case len(match) == 0:
		return nil, fmt.Errorf("no Pod named %s in the manifest (found %s)", quote.Value(name), podList(pods))
	default:
		return nil, fmt.Errorf("%d Pods are named %s (%s): choose one as NAMESPACE/NAME", len(match), quote.Value(name), podList(match))
	}
}

// typeHead is what SelectPod reads of each object.
type typeHead struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	} `json:"metadata"`
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

type candidate struct {
	head typeHead
	doc  []byte
}

func (c candidate) matches(name string) bool {
	if ns, n, ok := strings.Cut(name, "/"); ok {
		return c.head.Metadata.Namespace == ns && c.head.Metadata.Name == n
	}
	return c.head.Metadata.Name == name
}

// maxListed bounds how many objects an error lists.
const maxListed = 10

func podList(pods []candidate) string {
	refs := make([]string, len(pods))
	for i, p := range pods {
		refs[i] = quote.Value(p.head.ref())
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

// splitDocuments splits a YAML stream into its documents with kubectl's
// reader (apimachinery's YAMLReader: "---" lines), and drops documents
// that hold nothing (white space and comments). A stream with no document
// at all is one empty document, so that the decoder says what is missing.
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
		return [][]byte{data}, nil
	}
	return docs, nil
}
