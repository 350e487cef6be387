package installer

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/nftmesh/nftmesh/installer/repair"
)

// The checks of the flag table: each says why the value is bad, or "".

// absPath makes the path absolute, refusing an empty one, NUL bytes and
// the root directory.
func absPath(p *string) string {
	a, err := filepath.Abs(*p)
	switch {
	case *p == "":
		return "must not be empty"
	case strings.ContainsRune(*p, 0):
		return "contains a NUL byte"
	case err != nil:
		return err.Error()
	case a == "/":
		return "must not be the root directory"
	}
	*p = a
	return ""
}

func notEmpty(p *string) string {
	if *p == "" {
		return "must not be empty"
	}
	return ""
}

// unlessEmpty lets an empty value (off, or a default found later) pass.
func unlessEmpty(check func(*string) string) func(*string) string {
	return func(p *string) string {
		if *p == "" {
			return ""
		}
		return check(p)
	}
}

// k8sName is a Kubernetes validation function's complaints, prefixed by what.
func k8sName(what string, valid func(string) []string) func(*string) string {
	return func(p *string) string {
		if errs := valid(*p); len(errs) > 0 {
			return what + strings.Join(errs, "; ")
		}
		return ""
	}
}

// parses is a parser's error (a selector's).
func parses[T any](parse func(string) (T, error)) func(*string) string {
	return func(p *string) string {
		if _, err := parse(*p); err != nil {
			return err.Error()
		}
		return ""
	}
}

func oneOf(names []string) func(*string) string {
	return func(p *string) string {
		if !slices.Contains(names, *p) {
			return "must be one of " + strings.Join(names, ", ")
		}
		return ""
	}
}

// within refuses a number outside [lo, hi] (and NaN) with reason.
func within[T int | float64 | time.Duration](lo, hi T, reason string) func(*T) string {
	return func(p *T) string {
		if !(*p >= lo && *p <= hi) {
			return reason
		}
		return ""
	}
}

// listenAddr: host:port with a port that fits.
func listenAddr(p *string) string {
	_, port, err := net.SplitHostPort(*p)
	if err != nil {
		return "not host:port"
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || (n == 0 && port != "0") {
		return "port is not a number between 0 and 65535"
	}
	return ""
}

// setLevel parses the level of the agent and the plugin (Istio's
// scope:level lists included) into c.
func (c *Config) setLevel(p *string) string {
	lvl, err := ParseLogLevel(*p)
	if err != nil {
		return err.Error()
	}
	c.LogLevel = lvl
	return ""
}

// typeReasons say what a value pflag could not parse is not, by the flag's
// type: pflag's own errors repeat the whole value.
var typeReasons = map[string]string{
	"bool":     "not true or false",
	"duration": "not a duration (such as 30s or 2m)",
	"int":      "not an integer",
	"float64":  "not a number",
}

// refused is a ConfigError for a value pflag refused, from source.
func refused(err error, source string) error {
	var ive *pflag.InvalidValueError
	if !errors.As(err, &ive) {
		return fmt.Errorf("parsing flags: %w", err)
	}
	f := ive.GetFlag()
	reason, ok := typeReasons[f.Value.Type()]
	if !ok {
		reason = ive.Unwrap().Error()
	}
	return &ConfigError{Flag: f.Name, Source: source, Value: ive.GetValue(), Reason: reason}
}

// finish applies the rules across flags once the table's checks passed, in
// this order; the first problem is returned, naming the flag, where its
// value came from, and the value.
func (c *Config) finish(sources map[string]string, getenv func(string) (string, bool)) error {
	f := &finisher{c: c, sources: sources, getenv: getenv}
	for _, step := range []func() error{f.binDirs, f.dirs, f.confFileName, f.namespaces, f.apiServer, f.repair} {
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

// binDirs: at least one, absolute, without duplicates.
func (f *finisher) binDirs() error {
	c := f.c
	var bins []string
	for _, d := range c.CNIBinDirs {
		if d = strings.TrimSpace(d); d == "" {
			continue
		}
		if r := absPath(&d); r != "" {
			return f.bad("cni-bin-dir", d, r)
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

// dirs: the conf dir neither a bin dir nor the run dir.
func (f *finisher) dirs() error {
	c := f.c
	if slices.Contains(c.CNIBinDirs, c.CNIConfDir) {
		return f.bad("cni-conf-dir", c.CNIConfDir, "is also a --cni-bin-dir")
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

// namespaces: excluded namespaces are namespace names, without
// duplicates; the list is never nil (the plugin's entry writes [] for none).
func (f *finisher) namespaces() error {
	ns := []string{}
	for _, n := range f.c.ExcludeNamespaces {
		if n = strings.TrimSpace(n); n == "" {
			continue
		}
		if r := k8sName("not a namespace name: ", validation.IsDNS1123Label)(&n); r != "" {
			return f.bad("exclude-namespaces", n, r)
		}
		if !slices.Contains(ns, n) {
			ns = append(ns, n)
		}
	}
	f.c.ExcludeNamespaces = ns
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

// repair: the node defaults to --node-name, and a controller that acts
// needs it. With --linkerd it also repairs Linkerd pods whose validator
// failed.
func (f *finisher) repair() error {
	r := &f.c.Repair
	r.Linkerd = f.c.Linkerd.Enabled
	if r.NodeName == "" {
		r.NodeName = f.c.NodeName
		f.sources["repair-node-name"] = f.sources["node-name"]
	}
	if r.Enabled && r.Mode() != repair.None && r.NodeName == "" {
		return f.bad("repair-node-name", "", "the repair controller needs this node's name (NODE_NAME or --node-name)")
	}
	return nil
}
