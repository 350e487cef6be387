package cniconf

import "encoding/json"

// PluginSettings are nftmesh-cni's own fields of its conflist entry, by
// their wire names: the node agent writes them (PluginConf) and the plugin
// reads them (ParseConfig), so both sides share this one definition. The
// names are istio-cni's, so an existing chained config keeps working; the
// plugin ignores unknown fields. A nil field is absent from the entry (the
// plugin's default applies); the agent sets every one.
type PluginSettings struct {
	LogLevel          *string  `json:"log_level"`
	ExcludeNamespaces []string `json:"exclude_namespaces"`
	PodNamespace      string   `json:"pod_namespace"`
	AgentRunDir       *string  `json:"agent_run_dir"`
	Kubeconfig        *string  `json:"kubeconfig"`
	Backend           *string  `json:"backend"`
	APITimeout        *string  `json:"api_timeout"`
}

// PluginConf is the plugin's whole entry as the agent writes it. In a list
// the cniVersion comes from the list, so it is left out there.
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
		panic(err) // only strings, string pointers and a string slice: unreachable
	}
	return b
}
