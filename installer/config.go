package installer

import (
	"errors"
	"fmt"
	"io"
	"math"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/rs/zerolog"
	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"

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

// EnvName is the nftmesh environment variable for a flag.
func EnvName(flag string) string {
	return "NFTMESH_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// flagDef is one row of the agent's flag table.
type flagDef struct {
	name  string
	bind  func(fs *pflag.FlagSet)
	istio []string      // Istio's variables for the flag, after NFTMESH_<FLAG>
	check func() string // why the bound value is bad ("": it is fine); it may normalise it
	only  func() bool   // check only when this holds (nil: always)
}

// flagType is what pflag binds a row to.
type flagType interface {
	string | []string | bool | int | []int | float64 | time.Duration
}

// fl is a row binding the flag name to *p with default def; checks judge
// the value in turn, the first reason stops.
func fl[T flagType](p *T, name string, def T, usage string, checks ...func(*T) string) flagDef {
	d := flagDef{name: name, bind: func(fs *pflag.FlagSet) {
		switch p := any(p).(type) { // every flagType, so one case always binds
		case *string:
			fs.StringVar(p, name, any(def).(string), usage)
		case *[]string:
			fs.StringSliceVar(p, name, any(def).([]string), usage)
		case *bool:
			fs.BoolVar(p, name, any(def).(bool), usage)
		case *int:
			fs.IntVar(p, name, any(def).(int), usage)
		case *[]int:
			fs.IntSliceVar(p, name, any(def).([]int), usage)
		case *float64:
			fs.Float64Var(p, name, any(def).(float64), usage)
		case *time.Duration:
			fs.DurationVar(p, name, any(def).(time.Duration), usage)
		}
	}}
	if len(checks) > 0 {
		d.check = func() string {
			for _, c := range checks {
				if r := c(p); r != "" {
					return r
				}
			}
			return ""
		}
	}
	return d
}

func (d flagDef) env(istio ...string) flagDef { d.istio = istio; return d }

func (d flagDef) when(cond func() bool) flagDef { d.only = cond; return d }

func newFlagSet(defs []flagDef) *pflag.FlagSet {
	fs := pflag.NewFlagSet("nftmesh-agent", pflag.ContinueOnError)
	fs.SortFlags = false
	fs.SetOutput(io.Discard)
	for _, d := range defs {
		d.bind(fs)
	}
	return fs
}

// fromEnv sets the flag from the first of its variables that is set,
// unless the command line set it, and says where its value came from.
func (d flagDef) fromEnv(fs *pflag.FlagSet, getenv func(string) (string, bool)) (source string, err error) {
	f := fs.Lookup(d.name)
	if f.Changed {
		return "flag", nil
	}
	for _, name := range append([]string{EnvName(d.name)}, d.istio...) {
		v, ok := getenv(name)
		v = strings.TrimSpace(v)
		if !ok || v == "" && f.Value.Type() != "stringSlice" {
			continue // an empty variable rendered by a template means unset; an empty list is a list
		}
		if conv := envConv[name]; conv != nil {
			cv, err := conv(v)
			if err != nil {
				return "", &ConfigError{Flag: d.name, Source: "env " + name, Value: v, Reason: err.Error()}
			}
			if cv == "" {
				continue
			}
			v = cv
		}
		if err := fs.Set(d.name, v); err != nil {
			return "", refused(err, "env "+name)
		}
		return "env " + name, nil
	}
	return "", nil
}

// flagTables make the agent's flag table, in the order help lists them. A
// feature with flags of its own keeps its table in its own file and adds
// it here (and its cross-flag rules to finish).
var flagTables = []func(*Config) []flagDef{agentFlags, linkerdFlags}

func allFlags(c *Config) (defs []flagDef) {
	for _, t := range flagTables {
		defs = append(defs, t(c)...)
	}
	return defs
}

// agentFlags is the install job's table: each row binds a flag to its
// Config field with its default and help, names the Istio install-cni
// variables that stand in for it (env) and the checks its value must pass,
// when it matters. Cross-flag rules are finish's.
func agentFlags(c *Config) []flagDef {
	rd := repair.DefaultConfig()
	repairOn := func() bool { return c.Repair.Enabled }
	return []flagDef{
		fl(&c.CNIBinDirs, "cni-bin-dir", []string{"/host/opt/cni/bin"}, "host CNI bin dir to install "+PluginName+" into (repeatable, or comma-separated)"),
		fl(&c.CNIConfDir, "cni-conf-dir", "/host/etc/cni/net.d", "host CNI config dir", absPath).env("MOUNTED_CNI_NET_DIR", "CNI_NET_DIR"),
		fl(&c.CNIConfFileName, "cni-conf-file-name", "", "CNI config file to use instead of discovering the primary one (standalone: the file to write)").env("CNI_CONF_NAME"),
		fl(&c.Chained, "chained", true, "insert into the primary CNI config (false: write a standalone config for Multus)").env("CHAINED_CNI_PLUGIN"),
		fl(&c.NetworkName, "cni-network-name", PluginName, "standalone only: the config's network name, which Multus matches against the NetworkAttachmentDefinition pods reference",
			k8sName("not a NetworkAttachmentDefinition name: ", validation.IsDNS1123Subdomain)),
		fl(&c.AgentRunDir, "agent-run-dir", cniconf.DefaultAgentRunDir, "run dir shared with the plugin (kubeconfig, state, logs); same path on host and in the pod", absPath).env("CNI_AGENT_RUN_DIR"),
		fl(&c.PluginBinary, "plugin-binary", "/opt/cni/bin/"+PluginName, "the "+PluginName+" binary to install; its companion "+StandaloneName+" is taken from the same directory", absPath),
		fl(&c.ServiceAccountDir, "service-account-dir", "/var/run/secrets/kubernetes.io/serviceaccount", "service-account dir with token and ca.crt for the plugin's kubeconfig (empty: write no kubeconfig)", unlessEmpty(absPath)),
		fl(&c.KubeAPIServer, "kube-api-server", "", "API server URL for the plugin (default from KUBERNETES_SERVICE_HOST/PORT)"),
		fl(&c.KubeCAFile, "kube-ca-file", "", "CA bundle for the API server (default <service-account-dir>/ca.crt)", unlessEmpty(absPath)).env("KUBE_CA_FILE"),
		fl(&c.ExcludeNamespaces, "exclude-namespaces", []string{"kube-system"}, "namespaces whose pods the plugin never touches").env("EXCLUDE_NAMESPACES"),
		fl(&c.PodNamespace, "pod-namespace", "", "the agent's own namespace (the plugin skips the agent's pods)", unlessEmpty(k8sName("not a namespace name: ", validation.IsDNS1123Label))).env("POD_NAMESPACE"),
		fl(&c.NodeName, "node-name", "", "this node's name").env("NODE_NAME"),
		fl(&c.HealthAddr, "health-addr", ":8000", "listen address for /healthz and /readyz (empty: off)", unlessEmpty(listenAddr)),
		fl(&c.MetricsAddr, "metrics-addr", ":15014", "listen address for /metrics (empty: off)", unlessEmpty(listenAddr)).env("MONITORING_PORT"),
		fl(&c.Backend, "backend", "auto", "capture backend for the plugin: "+strings.Join(Backends, "|"), oneOf(Backends)).env("FORCE_IPTABLES_BINARY", "NATIVE_NFTABLES"),
		fl(new(string), "log-level", "info", "log level of the agent and the plugin: debug|info|warn|error, or Istio's scope:level list (the most verbose applies)", c.setLevel).env("LOG_LEVEL"),
		fl(&c.LogFormat, "log-format", "json", "the agent's log lines: "+strings.Join(LogFormats, "|"), oneOf(LogFormats)),
		fl(&c.APITimeout, "api-timeout", 30*time.Second, "how long the plugin retries its pod lookup before failing", within(time.Nanosecond, 10*time.Minute, "must be between 0 and 10m")),
		fl(&c.ReinstallRate, "reinstall-rate", 1, "max CNI config rewrites per second once the burst is used", within(math.SmallestNonzeroFloat64, 1e6, "must be a positive number of rewrites per second")),
		fl(&c.ReinstallBurst, "reinstall-burst", 5, "CNI config rewrites allowed at once", within(1, math.MaxInt, "must be at least 1")),
		fl(&c.FightThreshold, "fight-threshold", 5, "re-inserts within --fight-window that count as a fight with another component", within(1, math.MaxInt, "must be at least 1")),
		fl(&c.FightWindow, "fight-window", time.Minute, "window for --fight-threshold", within(time.Nanosecond, math.MaxInt64, "must be positive")),
		fl(&c.Repair.Enabled, "repair-enabled", false, "run the repair controller for pods that started without the plugin").env("REPAIR_ENABLED"),
		fl(&c.Repair.RepairPods, "repair-pods", false, "repair broken pods in place (needs SYS_ADMIN, SYS_PTRACE and /proc)").env("REPAIR_REPAIR_PODS"),
		fl(&c.Repair.DeletePods, "repair-delete-pods", false, "delete broken pods so their controller recreates them").env("REPAIR_DELETE_PODS"),
		fl(&c.Repair.LabelPods, "repair-label-pods", false, "label broken pods through pods/status").env("REPAIR_LABEL_PODS"),
		fl(&c.Repair.NodeName, "repair-node-name", "", "node whose pods the repair controller watches (default --node-name)").env("REPAIR_NODE_NAME"),
		fl(&c.Repair.InitContainerName, "repair-init-container-name", rd.InitContainerName, "validation init container that detects a missing capture",
			notEmpty, k8sName("", validation.IsDNS1123Label)).env("REPAIR_INIT_CONTAINER_NAME").when(repairOn),
		fl(&c.Repair.InitContainerExitCode, "repair-init-container-exit-code", rd.InitContainerExitCode, "exit code of a failed validation (0: any)",
			within(0, 255, "must be between 0 and 255")).env("REPAIR_INIT_CONTAINER_EXIT_CODE").when(repairOn),
		fl(&c.Repair.InitContainerTerminationMessage, "repair-init-container-termination-message", "", "substring the validation's termination message must contain (empty: any)").env("REPAIR_INIT_CONTAINER_TERMINATION_MESSAGE"),
		fl(&c.Repair.SidecarAnnotation, "repair-sidecar-annotation", rd.SidecarAnnotation, "annotation every repairable pod carries",
			k8sName("", validation.IsQualifiedName)).env("REPAIR_SIDECAR_ANNOTATION").when(repairOn),
		fl(&c.Repair.BrokenPodLabelKey, "repair-broken-pod-label-key", rd.BrokenPodLabelKey, "label set on broken pods in label mode",
			k8sName("", validation.IsQualifiedName)).env("REPAIR_BROKEN_POD_LABEL_KEY").when(repairOn),
		fl(&c.Repair.BrokenPodLabelValue, "repair-broken-pod-label-value", rd.BrokenPodLabelValue, "value of that label",
			k8sName("", validation.IsValidLabelValue)).env("REPAIR_BROKEN_POD_LABEL_VALUE").when(repairOn),
		fl(&c.Repair.LabelSelectors, "repair-label-selectors", "", "extra label selector for watched pods", parses(func(s string) (labels.Selector, error) { return labels.Parse(s) })).env("REPAIR_LABEL_SELECTORS").when(repairOn),
		fl(&c.Repair.FieldSelectors, "repair-field-selectors", "", "extra field selector for watched pods", parses(fields.ParseSelector)).env("REPAIR_FIELD_SELECTORS").when(repairOn),
		fl(&c.RemoveNodeTaint, "remove-node-taint", true, "once the plugin can program pods, remove --node-taint-key's taints (every effect) from this node (--node-name)"),
		fl(&c.NodeTaintKey, "node-taint-key", "cni.istio.io/not-ready", "the taint a node carries until its CNI capture is ready (Istio's name)",
			k8sName("", validation.IsQualifiedName)).when(func() bool { return c.RemoveNodeTaint }),
		fl(&c.PodEvents, "pod-events", true, "record an Event on a pod whose capture failed, was repaired or drifted"),
		fl(&c.Repair.HostProc, "host-proc", rd.HostProc, "the host's /proc as mounted in the agent, where repair in place finds pod network namespaces (/proc outside a cluster)",
			absPath).when(func() bool { return c.Repair.Enabled && c.Repair.Mode() == repair.InPlace }),
	}
}

// envConv turns an Istio variable's value into its flag's syntax ("": skip
// the variable).
var envConv = map[string]func(string) (string, error){
	"MONITORING_PORT": portAddr, "FORCE_IPTABLES_BINARY": iptablesBinaryBackend, "NATIVE_NFTABLES": nativeNftablesBackend,
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
		return "", errors.New(typeReasons["bool"])
	}
	if b {
		return cniconf.BackendNftables, nil
	}
	return "", nil // false leaves the backend to other sources
}

// Usage returns the flag help text.
func Usage() string {
	return newFlagSet(allFlags(&Config{})).FlagUsages()
}

// ParseConfig reads the configuration from args and the environment
// (getenv reports whether a variable is set). A flag wins over NFTMESH_<FLAG>,
// which wins over the Istio name. It touches no file. pflag.ErrHelp is
// returned for -h.
func ParseConfig(args []string, getenv func(string) (string, bool)) (*Config, error) {
	c := &Config{}
	defs := allFlags(c)
	fs := newFlagSet(defs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return nil, err
		}
		return nil, refused(err, "flag")
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("parsing flags: unexpected argument %s", quote.Value(fs.Arg(0)))
	}
	sources := map[string]string{}
	for _, d := range defs {
		src, err := d.fromEnv(fs, getenv)
		if err != nil {
			return nil, err
		}
		sources[d.name] = src
	}
	for _, d := range defs {
		if d.check == nil || d.only != nil && !d.only() {
			continue
		}
		v := fs.Lookup(d.name).Value.String()
		if r := d.check(); r != "" {
			return nil, &ConfigError{Flag: d.name, Source: sources[d.name], Value: v, Reason: r}
		}
	}
	if err := c.finish(sources, getenv); err != nil {
		return nil, err
	}
	if err := c.Linkerd.check(); err != nil {
		return nil, err
	}
	return c, nil
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
