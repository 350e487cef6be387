package installer

import (
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/rs/zerolog"
	"github.com/spf13/pflag"

	"github.com/nftmesh/nftmesh/installer/conflist"
	"github.com/nftmesh/nftmesh/installer/repair"
	"github.com/nftmesh/nftmesh/podinfo/cniconf"
	"github.com/nftmesh/nftmesh/redirect/quote"
)

// PluginName is the plugin's binary name and its conf "type".
const PluginName = conflist.PluginName

// StandaloneName is the plugin's companion binary, the whole plugin, which
// the PluginName front execs when the agent is not there (binarySources).
const StandaloneName = PluginName + "-standalone"

// DefaultStandaloneConfName is the file written in standalone (Multus) mode
// when no name is configured; the YYY prefix sorts it after primaries.
const DefaultStandaloneConfName = "YYY-nftmesh-cni.conf"

// LogFormats the agent writes its log in.
var LogFormats = []string{"json", "text"}

// Backends the plugin understands, by the names its config takes.
var Backends = []string{cniconf.BackendAuto, cniconf.BackendNftables, cniconf.BackendIptablesLegacy}

// Config is the agent's whole configuration. Paths are as the agent sees
// them (inside the DaemonSet pod: /host/...), except AgentRunDir, which the
// chart mounts at the same path on host and pod because the plugin reads
// the kubeconfig from there.
type Config struct {
	CNIBinDirs        []string
	CNIConfDir        string
	CNIConfFileName   string
	Chained           bool
	AgentRunDir       string
	PluginBinary      string
	ServiceAccountDir string
	KubeAPIServer     string
	KubeCAFile        string
	ExcludeNamespaces []string
	PodNamespace      string
	NodeName          string
	HealthAddr        string
	MetricsAddr       string
	Backend           string
	LogLevel          zerolog.Level
	LogFormat         string
	APITimeout        time.Duration
	// NetworkName is the standalone config's "name": Multus finds the
	// config of a NetworkAttachmentDefinition without one by this name.
	NetworkName string

	// ReinstallRate (per second) and ReinstallBurst throttle rewrites of
	// the CNI config; FightThreshold re-inserts within FightWindow are
	// reported as a fight with another component.
	ReinstallRate  float64
	ReinstallBurst int
	FightThreshold int
	FightWindow    time.Duration

	Repair repair.Config

	// RemoveNodeTaint: once the agent can program pods, it removes the
	// taints with NodeTaintKey from its own node (NodeName).
	RemoveNodeTaint bool
	NodeTaintKey    string
	// PodEvents: Events on pods whose capture failed, was repaired or
	// drifted.
	PodEvents bool

	// Linkerd is the node's settings for Linkerd pods (linkerd.go).
	Linkerd LinkerdSettings
}

// KubeconfigPath is where the plugin finds its kubeconfig.
func (c *Config) KubeconfigPath() string { return filepath.Join(c.AgentRunDir, cniconf.KubeconfigName) }

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
			Linkerd:           c.Linkerd.conf(),
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

// ConfigError is bad configuration: the flag, where its value came from,
// the value and why it is wrong.
type ConfigError struct {
	Flag   string
	Source string // "flag", or "env NAME"
	Value  string
	Reason string
}

func (e *ConfigError) Error() string {
	src := ""
	if e.Source != "" && e.Source != "flag" {
		src = " (from " + e.Source + ")"
	}
	return fmt.Sprintf("--%s%s %s: %s", e.Flag, src, quote.Value(e.Value), e.Reason)
}

// envAlias is a foreign (Istio) environment variable accepted for a flag;
// conv turns its value into the flag's syntax.
type envAlias struct {
	name string
	conv func(string) (string, error)
}

// EnvName is the nftmesh environment variable for a flag.
func EnvName(flag string) string {
	return "NFTMESH_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// newFlagSet returns the agent's flags bound to c, which holds the
// defaults, and the log level's raw value.
func newFlagSet(c *Config) (*pflag.FlagSet, *string) {
	fs := pflag.NewFlagSet("nftmesh-agent", pflag.ContinueOnError)
	fs.SortFlags = false
	logLevel := new(string)
	rd := repair.DefaultConfig()
	fs.StringSliceVar(&c.CNIBinDirs, "cni-bin-dir", []string{"/host/opt/cni/bin"}, "host CNI bin dir to install "+PluginName+" into (repeatable, or comma-separated)")
	fs.StringVar(&c.CNIConfDir, "cni-conf-dir", "/host/etc/cni/net.d", "host CNI config dir")
	fs.StringVar(&c.CNIConfFileName, "cni-conf-file-name", "", "CNI config file to use instead of discovering the primary one (standalone: the file to write)")
	fs.BoolVar(&c.Chained, "chained", true, "insert into the primary CNI config (false: write a standalone config for Multus)")
	fs.StringVar(&c.NetworkName, "cni-network-name", PluginName, "standalone only: the config's network name, which Multus matches against the NetworkAttachmentDefinition pods reference")
	fs.StringVar(&c.AgentRunDir, "agent-run-dir", cniconf.DefaultAgentRunDir, "run dir shared with the plugin (kubeconfig, state, logs); same path on host and in the pod")
	fs.StringVar(&c.PluginBinary, "plugin-binary", "/opt/cni/bin/"+PluginName, "the "+PluginName+" binary to install; its companion "+StandaloneName+" is taken from the same directory")
	fs.StringVar(&c.ServiceAccountDir, "service-account-dir", "/var/run/secrets/kubernetes.io/serviceaccount", "service-account dir with token and ca.crt for the plugin's kubeconfig (empty: write no kubeconfig)")
	fs.StringVar(&c.KubeAPIServer, "kube-api-server", "", "API server URL for the plugin (default from KUBERNETES_SERVICE_HOST/PORT)")
	fs.StringVar(&c.KubeCAFile, "kube-ca-file", "", "CA bundle for the API server (default <service-account-dir>/ca.crt)")
	fs.StringSliceVar(&c.ExcludeNamespaces, "exclude-namespaces", []string{"kube-system"}, "namespaces whose pods the plugin never touches")
	fs.StringVar(&c.PodNamespace, "pod-namespace", "", "the agent's own namespace (the plugin skips the agent's pods)")
	fs.StringVar(&c.NodeName, "node-name", "", "this node's name")
	fs.StringVar(&c.HealthAddr, "health-addr", ":8000", "listen address for /healthz and /readyz (empty: off)")
	fs.StringVar(&c.MetricsAddr, "metrics-addr", ":15014", "listen address for /metrics (empty: off)")
	fs.StringVar(&c.Backend, "backend", "auto", "capture backend for the plugin: "+strings.Join(Backends, "|"))
	fs.StringVar(logLevel, "log-level", "info", "log level of the agent and the plugin: debug|info|warn|error, or Istio's scope:level list (the most verbose applies)")
	fs.StringVar(&c.LogFormat, "log-format", "json", "the agent's log lines: "+strings.Join(LogFormats, "|"))
	fs.DurationVar(&c.APITimeout, "api-timeout", 30*time.Second, "how long the plugin retries its pod lookup before failing")
	fs.Float64Var(&c.ReinstallRate, "reinstall-rate", 1, "max CNI config rewrites per second once the burst is used")
	fs.IntVar(&c.ReinstallBurst, "reinstall-burst", 5, "CNI config rewrites allowed at once")
	fs.IntVar(&c.FightThreshold, "fight-threshold", 5, "re-inserts within --fight-window that count as a fight with another component")
	fs.DurationVar(&c.FightWindow, "fight-window", time.Minute, "window for --fight-threshold")
	fs.BoolVar(&c.Repair.Enabled, "repair-enabled", false, "run the repair controller for pods that started without the plugin")
	fs.BoolVar(&c.Repair.RepairPods, "repair-pods", false, "repair broken pods in place (needs SYS_ADMIN, SYS_PTRACE and /proc)")
	fs.BoolVar(&c.Repair.DeletePods, "repair-delete-pods", false, "delete broken pods so their controller recreates them")
	fs.BoolVar(&c.Repair.LabelPods, "repair-label-pods", false, "label broken pods through pods/status")
	fs.StringVar(&c.Repair.NodeName, "repair-node-name", "", "node whose pods the repair controller watches (default --node-name)")
	fs.StringVar(&c.Repair.InitContainerName, "repair-init-container-name", rd.InitContainerName, "validation init container that detects a missing capture")
	fs.IntVar(&c.Repair.InitContainerExitCode, "repair-init-container-exit-code", rd.InitContainerExitCode, "exit code of a failed validation (0: any)")
	fs.StringVar(&c.Repair.InitContainerTerminationMessage, "repair-init-container-termination-message", "", "substring the validation's termination message must contain (empty: any)")
	fs.StringVar(&c.Repair.SidecarAnnotation, "repair-sidecar-annotation", rd.SidecarAnnotation, "annotation every repairable pod carries")
	fs.StringVar(&c.Repair.BrokenPodLabelKey, "repair-broken-pod-label-key", rd.BrokenPodLabelKey, "label set on broken pods in label mode")
	fs.StringVar(&c.Repair.BrokenPodLabelValue, "repair-broken-pod-label-value", rd.BrokenPodLabelValue, "value of that label")
	fs.StringVar(&c.Repair.LabelSelectors, "repair-label-selectors", "", "extra label selector for watched pods")
	fs.StringVar(&c.Repair.FieldSelectors, "repair-field-selectors", "", "extra field selector for watched pods")
	fs.BoolVar(&c.RemoveNodeTaint, "remove-node-taint", true, "once the plugin can program pods, remove --node-taint-key's taints (every effect) from this node (--node-name)")
	fs.StringVar(&c.NodeTaintKey, "node-taint-key", "cni.istio.io/not-ready", "the taint a node carries until its CNI capture is ready (Istio's name)")
	fs.BoolVar(&c.PodEvents, "pod-events", true, "record an Event on a pod whose capture failed, was repaired or drifted")
	fs.StringVar(&c.Repair.HostProc, "host-proc", rd.HostProc, "the host's /proc as mounted in the agent, where repair in place finds pod network namespaces (/proc outside a cluster)")
	addLinkerdFlags(fs, &c.Linkerd)

	return fs, logLevel
}

// envAliases are the environment variables, Istio's install-cni names, that
// stand in for a flag (flags and NFTMESH_<FLAG> win over them).
var envAliases = map[string][]envAlias{
	"cni-conf-dir":       {{name: "MOUNTED_CNI_NET_DIR"}, {name: "CNI_NET_DIR"}},
	"cni-conf-file-name": {{name: "CNI_CONF_NAME"}},
	"chained":            {{name: "CHAINED_CNI_PLUGIN"}},
	"agent-run-dir":      {{name: "CNI_AGENT_RUN_DIR"}},
	"kube-ca-file":       {{name: "KUBE_CA_FILE"}},
	"exclude-namespaces": {{name: "EXCLUDE_NAMESPACES"}},
	"pod-namespace":      {{name: "POD_NAMESPACE"}},
	"node-name":          {{name: "NODE_NAME"}},
	"metrics-addr":       {{name: "MONITORING_PORT", conv: portAddr}},
	"backend": {
		{name: "FORCE_IPTABLES_BINARY", conv: iptablesBinaryBackend},
		{name: "NATIVE_NFTABLES", conv: nativeNftablesBackend},
	},
	"log-level":                                 {{name: "LOG_LEVEL"}},
	"repair-enabled":                            {{name: "REPAIR_ENABLED", conv: boolish}},
	"repair-pods":                               {{name: "REPAIR_REPAIR_PODS", conv: boolish}},
	"repair-delete-pods":                        {{name: "REPAIR_DELETE_PODS", conv: boolish}},
	"repair-label-pods":                         {{name: "REPAIR_LABEL_PODS", conv: boolish}},
	"repair-node-name":                          {{name: "REPAIR_NODE_NAME"}},
	"repair-init-container-name":                {{name: "REPAIR_INIT_CONTAINER_NAME"}},
	"repair-init-container-exit-code":           {{name: "REPAIR_INIT_CONTAINER_EXIT_CODE"}},
	"repair-init-container-termination-message": {{name: "REPAIR_INIT_CONTAINER_TERMINATION_MESSAGE"}},
	"repair-sidecar-annotation":                 {{name: "REPAIR_SIDECAR_ANNOTATION"}},
	"repair-broken-pod-label-key":               {{name: "REPAIR_BROKEN_POD_LABEL_KEY"}},
	"repair-broken-pod-label-value":             {{name: "REPAIR_BROKEN_POD_LABEL_VALUE"}},
	"repair-label-selectors":                    {{name: "REPAIR_LABEL_SELECTORS"}},
	"repair-field-selectors":                    {{name: "REPAIR_FIELD_SELECTORS"}},
}

func boolish(v string) (string, error) {
	b, err := strconv.ParseBool(v)
	return strconv.FormatBool(b), err
}

func portAddr(v string) (string, error) {
	if _, err := strconv.ParseUint(v, 10, 16); err != nil {
		return "", fmt.Errorf("not a port number")
	}
	return ":" + v, nil
}

func iptablesBinaryBackend(v string) (string, error) {
	switch v {
	case "legacy":
		return cniconf.BackendIptablesLegacy, nil
	case "nft":
		// iptables-nft rules are nftables rules; our netlink backend writes those directly.
		return cniconf.BackendNftables, nil
	}
	return "", fmt.Errorf("want legacy or nft")
}

func nativeNftablesBackend(v string) (string, error) {
	b, err := strconv.ParseBool(v)
	if err != nil {
		return "", err
	}
	if b {
		return cniconf.BackendNftables, nil
	}
	return "", nil // false leaves the backend to other sources
}

// Usage returns the flag help text.
func Usage() string {
	var c Config
	fs, _ := newFlagSet(&c)
	return fs.FlagUsages()
}

// ParseConfig reads the configuration from args and the environment
// (getenv reports whether a variable is set). A flag wins over NFTMESH_<FLAG>,
// which wins over the Istio name. It touches no file. pflag.ErrHelp is
// returned for -h.
func ParseConfig(args []string, getenv func(string) (string, bool)) (*Config, error) {
	c := &Config{}
	fs, logLevel := newFlagSet(c)
	fs.SetOutput(io.Discard)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return nil, err
		}
		return nil, fmt.Errorf("parsing flags: %w", err)
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("parsing flags: unexpected argument %q", fs.Arg(0))
	}
	sources := map[string]string{}
	var firstErr error
	fs.VisitAll(func(f *pflag.Flag) {
		if firstErr != nil {
			return
		}
		if f.Changed {
			sources[f.Name] = "flag"
			return
		}
		cands := append([]envAlias{{name: EnvName(f.Name)}}, envAliases[f.Name]...)
		for _, a := range cands {
			v, ok := getenv(a.name)
			if !ok {
				continue
			}
			v = strings.TrimSpace(v)
			isSlice := f.Value.Type() == "stringSlice"
			if v == "" && !isSlice {
				continue // an empty variable rendered by a template means unset
			}
			if a.conv != nil {
				cv, err := a.conv(v)
				if err != nil {
					firstErr = &ConfigError{Flag: f.Name, Source: "env " + a.name, Value: v, Reason: err.Error()}
					return
				}
				if cv == "" {
					continue
				}
				v = cv
			}
			if isSlice && v == "" {
				if sv, ok := f.Value.(pflag.SliceValue); ok {
					_ = sv.Replace(nil)
				}
			} else if err := fs.Set(f.Name, v); err != nil {
				firstErr = &ConfigError{Flag: f.Name, Source: "env " + a.name, Value: v, Reason: unwrapPflag(err)}
				return
			}
			sources[f.Name] = "env " + a.name
			return
		}
	})
	if firstErr != nil {
		return nil, firstErr
	}
	if err := c.finish(*logLevel, sources, getenv); err != nil {
		return nil, err
	}
	if err := c.Linkerd.check(); err != nil {
		return nil, err
	}
	return c, nil
}

func unwrapPflag(err error) string {
	s := err.Error()
	if i := strings.LastIndex(s, ": "); i >= 0 {
		return s[i+2:]
	}
	return s
}

// istioLevels maps every level name an Istio log flag accepts to ours.
// nftmesh always reports its errors, so Istio's none and fatal become error.
var istioLevels = map[string]zerolog.Level{
	"debug":   zerolog.DebugLevel,
	"info":    zerolog.InfoLevel,
	"warn":    zerolog.WarnLevel,
	"warning": zerolog.WarnLevel,
	"error":   zerolog.ErrorLevel,
	"fatal":   zerolog.ErrorLevel,
	"none":    zerolog.ErrorLevel,
}

// maxLevelItem bounds the bytes of a bad value quoted in an error: quoting
// may spell each byte as four characters (\xNN), and an error names two.
const maxLevelItem = 24

// ParseLogLevel reads the level of the agent and the plugin: debug, info,
// warn (or warning), error, or Istio's scope form as its charts write it,
// scope:level pairs separated by commas (default:info,cni-plugin:debug),
// where an item without a scope stands for the default scope. nftmesh has
// one level for all of its logging, so the most verbose level named for any
// scope applies: whoever asked for debug on one scope sees debug lines.
func ParseLogLevel(s string) (zerolog.Level, error) {
	if strings.TrimSpace(s) == "" {
		return zerolog.NoLevel, fmt.Errorf("is empty")
	}
	best := zerolog.Disabled
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		scope, name, scoped := strings.Cut(item, ":")
		if !scoped {
			name, scope = scope, "default"
		}
		if !scopeName.MatchString(scope) {
			return zerolog.NoLevel, fmt.Errorf("item %s: scope %s is not a scope name (letters, digits, '-', '_', '.')", bound(item), bound(scope))
		}
		lvl, ok := istioLevels[strings.ToLower(strings.TrimSpace(name))]
		if !ok {
			return zerolog.NoLevel, fmt.Errorf("item %s: %s is not a level (want debug, info, warn, error, or Istio's fatal or none)", bound(item), bound(name))
		}
		best = min(best, lvl)
	}
	return best, nil
}

var scopeName = regexp.MustCompile(`^[a-zA-Z0-9._-]{1,64}$`)

// bound quotes a piece of a bad value for an error, bounded.
func bound(s string) string { return quote.ValueN(s, maxLevelItem) }
