package podinfo

import (
	"github.com/nftmesh/nftmesh/podinfo/cniconf"
	"github.com/nftmesh/nftmesh/podinfo/podget"
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

// SessionFilePrefix starts the names of the plugin's TLS session files in
// the agent's run dir (see podget).
const SessionFilePrefix = podget.SessionFilePrefix

// RemoveTLSSessions deletes the plugin's TLS session files in dir (see
// podget).
func RemoveTLSSessions(dir string) error { return podget.RemoveTLSSessions(dir) }
