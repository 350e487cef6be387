package cniconf

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/types/create"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/nftmesh/nftmesh/podinfo/meshpod"
	"github.com/nftmesh/nftmesh/redirect"
	"github.com/nftmesh/nftmesh/redirect/quote"
)

// Plugin config defaults.
const (
	DefaultAgentRunDir = "/var/run/nftmesh"
	DefaultAPITimeout  = 30 * time.Second
	// KubeconfigName is the file the agent writes into agent_run_dir.
	KubeconfigName = "kubeconfig"
	// AgentPodPrefix is the name prefix of the agent DaemonSet's pods. With
	// pod_namespace it lets the agent's own pod through before any client
	// exists: after a node reboot that very pod writes the kubeconfig.
	AgentPodPrefix = "nftmesh-agent-"
)

// Backend names accepted in the config.
const (
	BackendAuto           = redirect.BackendAuto
	BackendNftables       = redirect.BackendNFTables
	BackendIptablesLegacy = redirect.BackendLegacy
)

// Log levels accepted in the config.
var logLevels = []string{"debug", "info", "warn", "error", "none"}

// Config is the plugin's entry in the conflist. Unknown fields are ignored.
type Config struct {
	types.NetConf

	LogLevel          string        // debug|info|warn|error|none; default info
	ExcludeNamespaces []string      // namespaces never captured
	PodNamespace      string        // the agent's own namespace
	AgentRunDir       string        // where the agent keeps the kubeconfig and our log
	Kubeconfig        string        // default <AgentRunDir>/kubeconfig
	Backend           string        // auto|nftables|iptables-legacy; default auto
	APITimeout        time.Duration // bound on the pod lookup, retries included
	// Linkerd is the node's Linkerd settings (nil: meshpod.DefaultLinkerd).
	Linkerd *meshpod.LinkerdConfig

	// PrevResultJSON is the primary plugin's result exactly as passed
	// (NetConf.RawPrevResult stays nil): ParsePrevResult decodes it once,
	// and a plugin that changes nothing can print it back byte for byte.
	PrevResultJSON json.RawMessage
	prevResultAsIs bool // PrevResult was decoded from PrevResultJSON unchanged
}

// rawConfig is what the plugin reads: the shared wire fields, and Istio's
// older names, read when ours are absent, so an Istio conflist entry keeps
// its meaning when only the type is changed.
type rawConfig struct {
	types.NetConf
	// Shallower than NetConf's prevResult, so it takes the field, as bytes
	// rather than a map encoded again to parse.
	PrevResultJSON json.RawMessage `json:"prevResult,omitempty"`
	PluginSettings
	IstioLogLevel    *string `json:"plugin_log_level"`
	IstioAgentRunDir *string `json:"cni_agent_run_dir"`
}

// ConfigError is a problem with one field of the plugin config.
type ConfigError struct {
	Field  string
	Value  string
	Reason string
}

func (e *ConfigError) Error() string {
	if e.Value == "" {
		return fmt.Sprintf("plugin config field %q: %s", e.Field, e.Reason)
	}
	return fmt.Sprintf("plugin config field %q: %s %s", e.Field, quote.Value(e.Value), e.Reason)
}

// ParseConfig decodes and validates the plugin config (CNI stdin). Every
// problem is reported, joined; a wrong JSON type names the field.
func ParseConfig(stdin []byte) (*Config, error) {
	raw, err := decodeRaw(stdin)
	if err != nil {
		return nil, err
	}
	c := &Config{
		NetConf:           raw.NetConf,
		PrevResultJSON:    raw.PrevResultJSON,
		LogLevel:          "info",
		ExcludeNamespaces: raw.ExcludeNamespaces,
		PodNamespace:      raw.PodNamespace,
		AgentRunDir:       DefaultAgentRunDir,
		Backend:           BackendAuto,
		APITimeout:        DefaultAPITimeout,
		Linkerd:           raw.Linkerd,
	}
	var errs []error
	bad := func(field, value, format string, args ...any) {
		errs = append(errs, &ConfigError{Field: field, Value: value, Reason: fmt.Sprintf(format, args...)})
	}

	if v, field := pick(raw.LogLevel, "log_level", raw.IstioLogLevel, "plugin_log_level"); v != nil {
		lvl := strings.ToLower(strings.TrimSpace(*v))
		switch {
		case lvl == "":
		case lvl == "warning":
			c.LogLevel = "warn"
		case slices.Contains(logLevels, lvl):
			c.LogLevel = lvl
		default:
			bad(field, *v, "is not a log level (want one of %s)", strings.Join(logLevels, ", "))
		}
	}
	for _, ns := range c.ExcludeNamespaces {
		if ns == "" || strings.TrimSpace(ns) != ns {
			bad("exclude_namespaces", ns, "is not a namespace name")
		}
	}
	v, field := pick(raw.AgentRunDir, "agent_run_dir", raw.IstioAgentRunDir, "cni_agent_run_dir")
	c.AgentRunDir = absPath(v, field, c.AgentRunDir, bad)
	c.Kubeconfig = absPath(raw.Kubeconfig, "kubeconfig", filepath.Join(c.AgentRunDir, KubeconfigName), bad)
	if raw.Backend != nil && *raw.Backend != "" {
		switch *raw.Backend {
		case BackendAuto, BackendNftables, BackendIptablesLegacy:
			c.Backend = *raw.Backend
		default:
			bad("backend", *raw.Backend, "is not a backend (want auto, nftables or iptables-legacy)")
		}
	}
	if raw.APITimeout != nil && *raw.APITimeout != "" {
		d, err := time.ParseDuration(*raw.APITimeout)
		switch {
		case err != nil:
			bad("api_timeout", *raw.APITimeout, "is not a Go duration (e.g. 30s)")
		case d <= 0:
			bad("api_timeout", *raw.APITimeout, "is not positive")
		default:
			c.APITimeout = d
		}
	}
	if err := checkLinkerd(raw.Linkerd); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return c, nil
}

// decodeRaw decodes the plugin config; a wrong JSON type names the field.
func decodeRaw(stdin []byte) (rawConfig, error) {
	var raw rawConfig
	if err := json.Unmarshal(stdin, &raw); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			field := strings.TrimPrefix(strings.TrimPrefix(te.Field, "NetConf."), "PluginSettings.")
			kind := te.Type.Kind().String()
			return raw, &ConfigError{Field: field, Reason: fmt.Sprintf("has the wrong type (got a JSON %s, want %s)", te.Value, cmp.Or(jsonKinds[kind], "a "+kind))}
		}
		return raw, fmt.Errorf("decoding plugin config: %w", err)
	}
	return raw, nil
}

// absPath is *v cleaned when set, else dflt; a relative path is bad.
func absPath(v *string, field, dflt string, bad func(field, value, format string, args ...any)) string {
	if v == nil || *v == "" {
		return dflt
	}
	if !filepath.IsAbs(*v) {
		bad(field, *v, "is not an absolute path")
		return dflt
	}
	return filepath.Clean(*v)
}

// pick returns ours when set, else the Istio alias, with the field name used.
func pick(ours *string, oursName string, alias *string, aliasName string) (*string, string) {
	if ours != nil {
		return ours, oursName
	}
	return alias, aliasName
}

// jsonKinds name the JSON a field of a Go kind wants (pointers are to
// strings).
var jsonKinds = map[string]string{"string": "a string", "ptr": "a string", "slice": "an array", "map": "an object", "struct": "an object", "bool": "a boolean"}

// SkipBeforeLookup returns why the pod needs no lookup at all ("" when it
// does), before any Kubernetes client is built. The agent's own pods are
// known by name prefix and pod_namespace (no pod_namespace, no match).
func (c *Config) SkipBeforeLookup(a K8sArgs) string {
	switch {
	case a.PodNamespace == "" || a.PodName == "":
		return meshpod.ReasonNotKubernetes
	case slices.Contains(c.ExcludeNamespaces, a.PodNamespace):
		return meshpod.ReasonExcludedNamespace
	case c.PodNamespace != "" && a.PodNamespace == c.PodNamespace && strings.HasPrefix(a.PodName, AgentPodPrefix):
		return meshpod.ReasonAgentPod
	}
	return ""
}

// ParsePrevResult decodes the prevResult, if any, into c.PrevResult as
// version.ParsePrevResult does. The usual result, which names its own
// version, is decoded once from the runtime's bytes; any other goes
// through the library (which supplies a missing version).
func (c *Config) ParsePrevResult() error {
	raw := bytes.TrimSpace(c.PrevResultJSON)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil
	}
	if res, err := create.Create(c.CNIVersion, raw); err == nil && res.Version() != "" {
		c.PrevResult, c.prevResultAsIs = res, true
		return nil
	}
	if err := json.Unmarshal(raw, &c.RawPrevResult); err != nil {
		return fmt.Errorf("could not parse prevResult: %w", err)
	}
	return version.ParsePrevResult(&c.NetConf)
}

// PrevResultUnchanged is the prevResult as passed when it can be printed as
// the plugin's own result: parsed as it is, of the config's cniVersion.
// Otherwise nil, and the caller prints c.PrevResult converted.
func (c *Config) PrevResultUnchanged() []byte {
	if !c.prevResultAsIs || c.PrevResult.Version() != c.CNIVersion {
		return nil
	}
	return bytes.TrimSpace(c.PrevResultJSON)
}

// checkLinkerd refuses Linkerd settings no pod could be captured with, so
// a bad entry shows at install rather than at a Linkerd pod's start.
func checkLinkerd(l *meshpod.LinkerdConfig) error {
	if l == nil {
		return nil
	}
	if _, err := meshpod.LinkerdSpec(*l, &meshpod.Pod{}); err != nil {
		return &ConfigError{Field: "linkerd", Reason: err.Error()}
	}
	return nil
}
