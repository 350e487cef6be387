package manifest

import (
	"encoding/json"
	"fmt"

	"github.com/nftmesh/nftmesh/internal/yamljson"
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
	if name == "" {
		if pod, ok := parseLonePod(data); ok {
			return pod, nil
		}
	}
	data, err := SelectPod(data, name)
	if err != nil {
		return nil, err
	}
	return meshpod.DecodeManifest(data, unmarshalYAML)
}

// unmarshalYAML decodes YAML as sigs.k8s.io/yaml's Unmarshal does
// (numbers and booleans bound for string fields become their text) without
// linking a YAML library whose initialisation every run of the CLI would
// pay.
func unmarshalYAML(b []byte, v any) error { return yamljson.Unmarshal(b, v) }

// parseLonePod decodes a stream of one Pod document with one YAML parse
// where the general path (SelectPod reading each document's head, then the
// decoder) takes two, half of an apply --pod's time. ok is false, and the
// general path decides and reports, unless the result is provably the
// same:
//
//   - unmarshalYAML converts YAML to JSON guided by the target's field
//     types, turning a number or boolean bound for a string field into a
//     string, then decodes the JSON. SelectPod's head gets no such
//     conversion (decodeHead decodes the unguided JSON), so decoding the
//     JSON of yamljson.ToJSON into the same head gives what SelectPod's
//     decode gives.
//   - The Pod decoded from that unguided JSON is the guided decode's Pod
//     whenever it decodes: the guide changes only a number or boolean
//     bound for a string field, which fails the unguided decode.
func parseLonePod(data []byte) (*meshpod.Pod, bool) {
	docs := splitDocuments(data)
	if len(docs) != 1 {
		return nil, false
	}
	j, err := yamljson.ToJSON(docs[0])
	if err != nil {
		return nil, false
	}
	var head struct {
		typeHead
		Items []json.RawMessage `json:"items"`
	}
	if json.Unmarshal(j, &head) != nil || head.Kind == "List" || head.Kind == "PodList" {
		return nil, false
	}
	pod, err := meshpod.DecodeManifest(j, json.Unmarshal)
	return pod, err == nil
}
