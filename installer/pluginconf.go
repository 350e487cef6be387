package installer

import (
	"encoding/json"
)

// PluginConf is the nftmesh-cni entry the agent inserts. The field names
// are the contract with the plugin (Istio's istio-cni names, so an
// existing chained config keeps working); the plugin ignores unknown fields.
type PluginConf struct {
	CNIVersion        string   `json:"cniVersion,omitempty"`
	Name              string   `json:"name"`
	Type              string   `json:"type"`
	LogLevel          string   `json:"log_level"`
	ExcludeNamespaces []string `json:"exclude_namespaces"`
	PodNamespace      string   `json:"pod_namespace"`
	AgentRunDir       string   `json:"agent_run_dir"`
	Kubeconfig        string   `json:"kubeconfig"`
	Backend           string   `json:"backend"`
	APITimeout        string   `json:"api_timeout"`
}

// StandaloneCNIVersion is the cniVersion of the standalone file; 0.3.1 is
// what Istio writes there and what every Multus release accepts.
const StandaloneCNIVersion = "0.3.1"

// PluginConf returns our entry for this configuration. In a list the
// cniVersion comes from the list, so it is only set for the standalone file.
func (c *Config) PluginConf() PluginConf {
	pc := PluginConf{
		Name:              PluginName,
		Type:              PluginName,
		LogLevel:          c.LogLevel.String(),
		ExcludeNamespaces: append([]string{}, c.ExcludeNamespaces...),
		PodNamespace:      c.PodNamespace,
		AgentRunDir:       c.AgentRunDir,
		Kubeconfig:        c.KubeconfigPath(),
		Backend:           c.Backend,
		APITimeout:        c.APITimeout.String(),
	}
	if !c.Chained {
		pc.CNIVersion = StandaloneCNIVersion
		if c.NetworkName != "" {
			pc.Name = c.NetworkName
		}
	}
	return pc
}

// JSON is the entry's encoding; it cannot fail for this struct.
func (p PluginConf) JSON() json.RawMessage {
	b, err := json.Marshal(p)
	if err != nil {
		panic(err) // only strings and a string slice: unreachable
	}
	return b
}
