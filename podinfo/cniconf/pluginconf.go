package cniconf

import (
	"encoding/json"

	"github.com/nftmesh/nftmesh/podinfo/meshpod"
)

// PluginSettings are nftmesh-cni's own fields of its conflist entry, one
// definition for the agent that writes them (PluginConf) and the plugin
// that reads them (ParseConfig). The names are istio-cni's, so an existing
// chained config keeps working. A nil field is absent (the default
// applies); the agent sets every one.
type PluginSettings struct {
	LogLevel          *string  `json:"log_level"`
	ExcludeNamespaces []string `json:"exclude_namespaces"`
	PodNamespace      string   `json:"pod_namespace"`
	AgentRunDir       *string  `json:"agent_run_dir"`
	Kubeconfig        *string  `json:"kubeconfig"`
	Backend           *string  `json:"backend"`
	APITimeout        *string  `json:"api_timeout"`
	// Linkerd is the node's settings for Linkerd pods, with linkerd-cni's
	// key and names; absent: linkerd2-cni's chart defaults.
	Linkerd *meshpod.LinkerdConfig `json:"linkerd,omitempty"`
}

// PluginConf is the plugin's whole entry as the agent writes it (in a list
// without cniVersion, which the list has).
type PluginConf struct {
	CNIVersion string `json:"cniVersion,omitempty"`
	Name       string `json:"name"`
	Type       string `json:"type"`
	PluginSettings
}

// JSON is the entry's encoding; it cannot fail for this struct.
func (p PluginConf) JSON() json.RawMessage {
	b, err := json.Marshal(p)
	if err != nil {
		panic(err) // only strings: unreachable
	}
	return b
}
