// Package kubeconf encodes kubeconfig files as the plugin reads them.
package kubeconf

import (
	"bytes"
	"encoding/json"
	"fmt"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/yaml"
)

// JSON encodes cfg as a kubeconfig file in JSON, which kubectl and
// client-go read like the YAML form: the plugin reads it with the standard
// library's JSON decoder, so it links no YAML parser (whose start-up work
// every plugin run would pay).
func JSON(cfg clientcmdapi.Config) ([]byte, error) {
	y, err := clientcmd.Write(cfg)
	if err != nil {
		return nil, fmt.Errorf("encoding kubeconfig: %w", err)
	}
	j, err := yaml.YAMLToJSON(y)
	if err != nil {
		return nil, fmt.Errorf("encoding kubeconfig as JSON: %w", err)
	}
	var out bytes.Buffer
	if err := json.Indent(&out, j, "", "  "); err != nil {
		return nil, fmt.Errorf("encoding kubeconfig as JSON: %w", err)
	}
	out.WriteByte('\n')
	return out.Bytes(), nil
}
