package installer

import (
	"github.com/nftmesh/nftmesh/podinfo/cniconf"
)

// StandaloneCNIVersion is the cniVersion of the standalone file; 0.3.1 is
// what Istio writes there and what every Multus release accepts.
const StandaloneCNIVersion = "0.3.1"

// PluginConf returns our entry for this configuration, in the wire form the
// plugin reads. In a list the cniVersion comes from the list, so it is only
// set for the standalone file.
func (c *Config) PluginConf() cniconf.PluginConf {
	str := func(s string) *string { return &s }
	pc := cniconf.PluginConf{
		Name: PluginName,
		Type: PluginName,
		PluginSettings: cniconf.PluginSettings{
			LogLevel:          str(c.LogLevel.String()),
			ExcludeNamespaces: append([]string{}, c.ExcludeNamespaces...),
			PodNamespace:      c.PodNamespace,
			AgentRunDir:       str(c.AgentRunDir),
			Kubeconfig:        str(c.KubeconfigPath()),
			Backend:           str(c.Backend),
			APITimeout:        str(c.APITimeout.String()),
		},
	}
	if !c.Chained {
		pc.CNIVersion = StandaloneCNIVersion
		if c.NetworkName != "" {
			pc.Name = c.NetworkName
		}
	}
	return pc
}
