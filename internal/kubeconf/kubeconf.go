// Package kubeconf holds what nftmesh's Kubernetes API clients share: the
// kubeconfig file the agent writes for the plugin (JSON) and Guard, the
// transport wrapper that keeps credentials out of errors and logs.
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
// client-go (so the plugin) read like the YAML form. It stays JSON because
// plugins before the switch to client-go read only JSON: during an upgrade
// the old standalone plugin may still run beside the new agent.
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
