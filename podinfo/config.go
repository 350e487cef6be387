package podinfo

import (
	"github.com/nftmesh/nftmesh/podinfo/cniconf"
)

// The plugin config and CNI_ARGS live in package cniconf, which the plugin
// links without Kubernetes' packages; these names keep podinfo's callers
// as they were.

// Plugin config defaults and names.
const (
	DefaultAgentRunDir = cniconf.DefaultAgentRunDir
	DefaultAPITimeout  = cniconf.DefaultAPITimeout
	KubeconfigName     = cniconf.KubeconfigName
	AgentPodPrefix     = cniconf.AgentPodPrefix

	BackendAuto           = cniconf.BackendAuto
	BackendNftables       = cniconf.BackendNftables
	BackendIptablesLegacy = cniconf.BackendIptablesLegacy
)

type (
	// Config is the plugin's entry in the conflist.
	Config = cniconf.Config
	// ConfigError is a problem with one field of the plugin config.
	ConfigError = cniconf.ConfigError
	// K8sArgs are the pod identity kubelet passes in CNI_ARGS.
	K8sArgs = cniconf.K8sArgs
	// PluginConf is the plugin's entry as the agent writes it.
	PluginConf = cniconf.PluginConf
	// PluginSettings are the plugin's own fields of that entry.
	PluginSettings = cniconf.PluginSettings
)

// ParseConfig decodes and validates the plugin config (see cniconf).
func ParseConfig(stdin []byte) (*Config, error) { return cniconf.ParseConfig(stdin) }

// ParseK8sArgs reads CNI_ARGS (see cniconf).
func ParseK8sArgs(cniArgs string) (K8sArgs, error) { return cniconf.ParseK8sArgs(cniArgs) }
