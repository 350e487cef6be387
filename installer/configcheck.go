package installer

import (
	"cmp"
	"net"
	"net/url"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/nftmesh/nftmesh/installer/repair"
)

// finish normalises and validates the parsed configuration, one named step
// per group of settings, in this order; the first problem is returned, and
// every error names the flag, where its value came from, and the value.
func (c *Config) finish(logLevel string, sources map[string]string, getenv func(string) (string, bool)) error {
	f := &finisher{c: c, sources: sources, getenv: getenv}
	for _, step := range []func() error{
		f.binDirs,
		f.dirsAndFiles,
		f.confFileName,
		f.namespaces,
		f.listenAddrs,
		f.backend,
		func() error { return f.logging(logLevel) },
		f.pluginEntry,
		f.reinstallThrottle,
		f.apiServer,
		f.repair,
		f.nodeTaint,
	} {
		if err := step(); err != nil {
			return err
		}
	}
	return nil
}

// finisher carries what every step needs: the config, where each flag's
// value came from, and the environment (for the API server's address).
type finisher struct {
	c       *Config
	sources map[string]string
	getenv  func(string) (string, bool)
}

func (f *finisher) bad(flag, value, reason string) error {
	return &ConfigError{Flag: flag, Source: f.sources[flag], Value: value, Reason: reason}
}

// valid is the flag's error for the complaints of a k8s validation
// function (prefixed by what), or nil when there are none.
func (f *finisher) valid(flag, value, what string, errs []string) error {
	if len(errs) == 0 {
		return nil
	}
	return f.bad(flag, value, what+strings.Join(errs, "; "))
}

// absPath makes *p absolute, refusing NUL bytes, the root directory and,
// unless mayBeEmpty, an empty value.
func (f *finisher) absPath(flag string, p *string, mayBeEmpty bool) error {
	if *p == "" {
		if mayBeEmpty {
			return nil
		}
		return f.bad(flag, *p, "must not be empty")
	}
	if strings.ContainsRune(*p, 0) {
		return f.bad(flag, *p, "contains a NUL byte")
	}
	a, err := filepath.Abs(*p)
	if err != nil {
		return f.bad(flag, *p, err.Error())
	}
	if a == "/" {
		return f.bad(flag, *p, "must not be the root directory")
	}
	*p = a
	return nil
}

// binDirs: at least one, absolute, without duplicates.
func (f *finisher) binDirs() error {
	c := f.c
	var bins []string
	for _, d := range c.CNIBinDirs {
		d = strings.TrimSpace(d)
		if d == "" {
			continue
		}
		if err := f.absPath("cni-bin-dir", &d, false); err != nil {
			return err
		}
		if !slices.Contains(bins, d) {
			bins = append(bins, d)
		}
	}
	if len(bins) == 0 {
		return f.bad("cni-bin-dir", strings.Join(c.CNIBinDirs, ","), "at least one bin dir is required")
	}
	c.CNIBinDirs = bins
	return nil
}

// dirsAndFiles: the other paths absolute, and the conf dir neither a bin
// dir nor the run dir.
func (f *finisher) dirsAndFiles() error {
	c := f.c
	for _, p := range []struct {
		flag  string
		v     *string
		empty bool
	}{
		{"cni-conf-dir", &c.CNIConfDir, false},
		{"agent-run-dir", &c.AgentRunDir, false},
		{"plugin-binary", &c.PluginBinary, false},
		{"service-account-dir", &c.ServiceAccountDir, true},
		{"kube-ca-file", &c.KubeCAFile, true},
	} {
		if err := f.absPath(p.flag, p.v, p.empty); err != nil {
			return err
		}
	}
	for _, d := range c.CNIBinDirs {
		if d == c.CNIConfDir {
			return f.bad("cni-conf-dir", c.CNIConfDir, "is also a --cni-bin-dir")
		}
	}
	if c.AgentRunDir == c.CNIConfDir {
		return f.bad("agent-run-dir", c.AgentRunDir, "must differ from --cni-conf-dir (the kubeconfig would be read as a CNI config)")
	}
	return nil
}

// confFileName: a plain file name with an extension the runtime reads (one
// that holds a single plugin when standalone), defaulted when standalone.
func (f *finisher) confFileName() error {
	c := f.c
	n := c.CNIConfFileName
	if n == "" {
		if !c.Chained {
			c.CNIConfFileName = DefaultStandaloneConfName
		}
		return nil
	}
	if n != filepath.Base(n) || n == "." || n == ".." || strings.ContainsRune(n, 0) {
		return f.bad("cni-conf-file-name", n, "must be a file name, not a path")
	}
	allowed := []string{".conf", ".conflist", ".json"}
	if !c.Chained {
		allowed = []string{".conf", ".json"} // the standalone file holds one plugin, not a list
	}
	if !slices.Contains(allowed, filepath.Ext(n)) {
		return f.bad("cni-conf-file-name", n, "must end in "+strings.Join(allowed, ", "))
	}
	return nil
}

// namespaces: excluded namespaces and the agent's own are namespace names;
// the excluded list is never nil (the plugin's entry writes [] for none).
func (f *finisher) namespaces() error {
	c := f.c
	ns := []string{}
	for _, n := range c.ExcludeNamespaces {
		n = strings.TrimSpace(n)
		if n == "" {
			continue
		}
		if err := f.valid("exclude-namespaces", n, "not a namespace name: ", validation.IsDNS1123Label(n)); err != nil {
			return err
		}
		if !slices.Contains(ns, n) {
			ns = append(ns, n)
		}
	}
	c.ExcludeNamespaces = ns
	if c.PodNamespace == "" {
		return nil
	}
	return f.valid("pod-namespace", c.PodNamespace, "not a namespace name: ", validation.IsDNS1123Label(c.PodNamespace))
}

// listenAddrs: host:port with a port that fits, or empty (off).
func (f *finisher) listenAddrs() error {
	for _, a := range []struct{ flag, v string }{{"health-addr", f.c.HealthAddr}, {"metrics-addr", f.c.MetricsAddr}} {
		if a.v == "" {
			continue
		}
		_, port, err := net.SplitHostPort(a.v)
		if err != nil {
			return f.bad(a.flag, a.v, "not host:port")
		}
		if p, err := strconv.ParseUint(port, 10, 16); err != nil || (p == 0 && port != "0") {
			return f.bad(a.flag, a.v, "port is not a number between 0 and 65535")
		}
	}
	return nil
}

// backend: one the plugin knows.
func (f *finisher) backend() error {
	if !slices.Contains(Backends, f.c.Backend) {
		return f.bad("backend", f.c.Backend, "must be one of "+strings.Join(Backends, ", "))
	}
	return nil
}

// logging: the level of the agent and the plugin (Istio's scope:level
// lists included) and the format of the agent's lines.
func (f *finisher) logging(logLevel string) error {
	c := f.c
	lvl, err := ParseLogLevel(logLevel)
	if err != nil {
		return f.bad("log-level", logLevel, err.Error())
	}
	c.LogLevel = lvl
	if !slices.Contains(LogFormats, c.LogFormat) {
		return f.bad("log-format", c.LogFormat, "must be one of "+strings.Join(LogFormats, ", "))
	}
	return nil
}

// pluginEntry: the standalone entry's network name and the plugin's API
// timeout.
func (f *finisher) pluginEntry() error {
	c := f.c
	if err := f.valid("cni-network-name", c.NetworkName, "not a NetworkAttachmentDefinition name: ", validation.IsDNS1123Subdomain(c.NetworkName)); err != nil {
		return err
	}
	if c.APITimeout <= 0 || c.APITimeout > 10*time.Minute {
		return f.bad("api-timeout", c.APITimeout.String(), "must be between 0 and 10m")
	}
	return nil
}

// reinstallThrottle: the rewrite rate limit and the fight detector's
// threshold and window.
func (f *finisher) reinstallThrottle() error {
	c := f.c
	if !(c.ReinstallRate > 0) || c.ReinstallRate > 1e6 {
		return f.bad("reinstall-rate", strconv.FormatFloat(c.ReinstallRate, 'g', -1, 64), "must be a positive number of rewrites per second")
	}
	if c.ReinstallBurst < 1 {
		return f.bad("reinstall-burst", strconv.Itoa(c.ReinstallBurst), "must be at least 1")
	}
	if c.FightThreshold < 1 {
		return f.bad("fight-threshold", strconv.Itoa(c.FightThreshold), "must be at least 1")
	}
	if c.FightWindow <= 0 {
		return f.bad("fight-window", c.FightWindow.String(), "must be positive")
	}
	return nil
}

// apiServer: with a kubeconfig to write, the API server's URL, by default
// from the in-cluster service variables.
func (f *finisher) apiServer() error {
	c := f.c
	if c.ServiceAccountDir == "" {
		return nil
	}
	if c.KubeAPIServer == "" {
		host, _ := f.getenv("KUBERNETES_SERVICE_HOST")
		port, _ := f.getenv("KUBERNETES_SERVICE_PORT")
		proto, _ := f.getenv("KUBERNETES_SERVICE_PROTOCOL")
		host, port, proto = strings.TrimSpace(host), strings.TrimSpace(port), strings.TrimSpace(proto)
		if host == "" {
			return f.bad("kube-api-server", "", "no API server for the plugin's kubeconfig: set KUBERNETES_SERVICE_HOST (and _PORT) or --kube-api-server, or set --service-account-dir= to write no kubeconfig")
		}
		if port == "" {
			port = "443"
		}
		if proto == "" {
			proto = "https"
		}
		// JoinHostPort brackets an IPv6 host.
		c.KubeAPIServer = proto + "://" + net.JoinHostPort(strings.Trim(host, "[]"), port)
		f.sources["kube-api-server"] = "env KUBERNETES_SERVICE_HOST"
	}
	u, err := url.Parse(c.KubeAPIServer)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.Hostname() == "" {
		return f.bad("kube-api-server", c.KubeAPIServer, "not an http(s) URL with a host")
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.ParseUint(p, 10, 16); err != nil || n == 0 {
			return f.bad("kube-api-server", c.KubeAPIServer, "port is not a number between 1 and 65535")
		}
	}
	return nil
}

// repair: the node defaults to --node-name; an enabled controller needs
// it, and names, selectors and (in place) the host's /proc that Kubernetes
// and the kernel accept.
func (f *finisher) repair() error {
	r := &f.c.Repair
	if r.NodeName == "" {
		r.NodeName = f.c.NodeName
		f.sources["repair-node-name"] = f.sources["node-name"]
	}
	if !r.Enabled {
		return nil
	}
	if r.Mode() != repair.None && r.NodeName == "" {
		return f.bad("repair-node-name", "", "the repair controller needs this node's name (NODE_NAME or --node-name)")
	}
	if r.InitContainerName == "" {
		return f.bad("repair-init-container-name", "", "must not be empty")
	}
	if err := f.valid("repair-init-container-name", r.InitContainerName, "", validation.IsDNS1123Label(r.InitContainerName)); err != nil {
		return err
	}
	if r.InitContainerExitCode < 0 || r.InitContainerExitCode > 255 {
		return f.bad("repair-init-container-exit-code", strconv.Itoa(r.InitContainerExitCode), "must be between 0 and 255")
	}
	if err := cmp.Or(
		f.valid("repair-sidecar-annotation", r.SidecarAnnotation, "", validation.IsQualifiedName(r.SidecarAnnotation)),
		f.valid("repair-broken-pod-label-key", r.BrokenPodLabelKey, "", validation.IsQualifiedName(r.BrokenPodLabelKey)),
		f.valid("repair-broken-pod-label-value", r.BrokenPodLabelValue, "", validation.IsValidLabelValue(r.BrokenPodLabelValue)),
	); err != nil {
		return err
	}
	if _, err := labels.Parse(r.LabelSelectors); err != nil {
		return f.bad("repair-label-selectors", r.LabelSelectors, err.Error())
	}
	if _, err := fields.ParseSelector(r.FieldSelectors); err != nil {
		return f.bad("repair-field-selectors", r.FieldSelectors, err.Error())
	}
	if r.Mode() == repair.InPlace {
		return f.absPath("host-proc", &r.HostProc, false)
	}
	return nil
}

// nodeTaint: the key is a taint key Kubernetes accepts (a qualified name).
func (f *finisher) nodeTaint() error {
	if !f.c.RemoveNodeTaint {
		return nil
	}
	return f.valid("node-taint-key", f.c.NodeTaintKey, "", validation.IsQualifiedName(f.c.NodeTaintKey))
}
