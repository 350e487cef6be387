package installer

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/spf13/pflag"

	"github.com/nftmesh/nftmesh/installer/repair"
	"github.com/nftmesh/nftmesh/podinfo/meshpod"
)

var inCluster = map[string]string{"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}

func withEnv(extra map[string]string) func(string) (string, bool) {
	m := map[string]string{}
	for k, v := range inCluster {
		m[k] = v
	}
	for k, v := range extra {
		m[k] = v
	}
	return testEnv(m)
}

func TestParseConfigDefaults(t *testing.T) {
	c, err := ParseConfig(nil, withEnv(nil))
	if err != nil {
		t.Fatal(err)
	}
	want := &Config{
		CNIBinDirs: []string{"/host/opt/cni/bin"}, CNIConfDir: "/host/etc/cni/net.d", Chained: true,
		AgentRunDir: "/var/run/nftmesh", PluginBinary: "/opt/cni/bin/nftmesh-cni",
		ServiceAccountDir: "/var/run/secrets/kubernetes.io/serviceaccount", KubeAPIServer: "https://10.96.0.1:443",
		ExcludeNamespaces: []string{"kube-system"}, HealthAddr: ":8000", MetricsAddr: ":15014",
		Backend: "auto", LogLevel: zerolog.InfoLevel, LogFormat: "json", NetworkName: "nftmesh-cni", APITimeout: 30 * time.Second,
		ReinstallRate: 1, ReinstallBurst: 5, FightThreshold: 5, FightWindow: time.Minute,
		Repair: repair.Config{InitContainerName: "istio-validation", InitContainerExitCode: 126,
			SidecarAnnotation: "sidecar.istio.io/status", BrokenPodLabelKey: "cni.istio.io/uninitialized", BrokenPodLabelValue: "true",
			HostProc: "/host/proc"},
		RemoveNodeTaint: true, NodeTaintKey: "cni.istio.io/not-ready", PodEvents: true,
		Linkerd: LinkerdSettings{LinkerdConfig: meshpod.LinkerdConfig{IncomingProxyPort: 4143, OutgoingProxyPort: 4140, ProxyUID: 2102, ProxyGID: -1,
			InboundPortsToIgnore: []string{"4190", "4191"}}},
	}
	if !reflect.DeepEqual(c, want) {
		t.Errorf("defaults:\n got %+v\nwant %+v", c, want)
	}
	if c.KubeconfigPath() != "/var/run/nftmesh/kubeconfig" {
		t.Error(c.KubeconfigPath())
	}
	pc := c.PluginConf()
	if *pc.Kubeconfig != "/var/run/nftmesh/kubeconfig" || *pc.AgentRunDir != "/var/run/nftmesh" || *pc.APITimeout != "30s" || pc.CNIVersion != "" {
		t.Errorf("plugin conf %+v", pc)
	}
}

func TestParseConfigIstioEnvAndPrecedence(t *testing.T) {
	env := withEnv(map[string]string{
		"MOUNTED_CNI_NET_DIR":     "/host/etc/cni/multus/net.d",
		"CNI_NET_DIR":             "/ignored",
		"CNI_CONF_NAME":           "istio-cni.conf",
		"CHAINED_CNI_PLUGIN":      "false",
		"EXCLUDE_NAMESPACES":      "kube-system, istio-system",
		"POD_NAMESPACE":           "istio-system",
		"CNI_AGENT_RUN_DIR":       "/var/run/istio-cni",
		"MONITORING_PORT":         "9999",
		"FORCE_IPTABLES_BINARY":   "legacy",
		"LOG_LEVEL":               "warning",
		"REPAIR_ENABLED":          "true",
		"REPAIR_DELETE_PODS":      "true",
		"NODE_NAME":               "node-a",
		"NFTMESH_LOG_LEVEL":       "debug", // ours beats Istio's
		"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "6443",
	})
	c, err := ParseConfig([]string{"--metrics-addr", "127.0.0.1:1"}, env) // a flag beats both
	if err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		name      string
		got, want any
	}{
		{"conf dir", c.CNIConfDir, "/host/etc/cni/multus/net.d"},
		{"conf name", c.CNIConfFileName, "istio-cni.conf"},
		{"chained", c.Chained, false},
		{"exclude", c.ExcludeNamespaces, []string{"kube-system", "istio-system"}},
		{"pod ns", c.PodNamespace, "istio-system"},
		{"run dir", c.AgentRunDir, "/var/run/istio-cni"},
		{"metrics", c.MetricsAddr, "127.0.0.1:1"},
		{"backend", c.Backend, "iptables-legacy"},
		{"log level", c.LogLevel, zerolog.DebugLevel},
		{"repair mode", c.Repair.Mode(), repair.Delete},
		{"repair node", c.Repair.NodeName, "node-a"},
		{"server", c.KubeAPIServer, "https://[fd00::1]:6443"},
	}
	for _, ch := range checks {
		if !reflect.DeepEqual(ch.got, ch.want) {
			t.Errorf("%s = %v, want %v", ch.name, ch.got, ch.want)
		}
	}

	c, err = ParseConfig(nil, withEnv(map[string]string{"MONITORING_PORT": "9999", "NATIVE_NFTABLES": "true", "EXCLUDE_NAMESPACES": "", "LOG_LEVEL": "warning"}))
	if err != nil {
		t.Fatal(err)
	}
	if c.MetricsAddr != ":9999" || c.Backend != "nftables" || len(c.ExcludeNamespaces) != 0 || c.LogLevel != zerolog.WarnLevel {
		t.Errorf("%q %q %v %v", c.MetricsAddr, c.Backend, c.ExcludeNamespaces, c.LogLevel)
	}
	c, err = ParseConfig([]string{"--cni-bin-dir", "/a,/b", "--cni-bin-dir", "/c", "--cni-bin-dir", "/a"}, withEnv(map[string]string{"NFTMESH_CNI_BIN_DIR": "/x"}))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(c.CNIBinDirs, []string{"/a", "/b", "/c"}) {
		t.Errorf("bin dirs %v", c.CNIBinDirs)
	}
	c, err = ParseConfig([]string{"--chained=false"}, withEnv(nil))
	if err != nil || c.CNIConfFileName != DefaultStandaloneConfName || c.PluginConf().CNIVersion != StandaloneCNIVersion {
		t.Errorf("standalone default name: %v %+v", err, c)
	}
	c, err = ParseConfig([]string{"--service-account-dir="}, testEnv(nil))
	if err != nil || c.KubeAPIServer != "" {
		t.Errorf("outside a cluster without kubeconfig: %v", err)
	}
	c, err = ParseConfig([]string{"--repair-enabled", "--repair-pods", "--repair-delete-pods", "--node-name", "n"}, withEnv(nil))
	if err != nil || c.Repair.Mode() != repair.InPlace {
		t.Errorf("precedence: %v %v", err, c.Repair.Mode())
	}
}

func TestParseConfigBadInput(t *testing.T) {
	cases := []struct {
		name string
		args []string
		env  map[string]string
		flag string // the flag the error must name
		val  string // and the value
	}{
		{"relative root", []string{"--cni-conf-dir", "/"}, nil, "cni-conf-dir", "/"},
		{"empty conf dir", []string{"--cni-conf-dir="}, nil, "cni-conf-dir", ""},
		{"no bin dir", []string{"--cni-bin-dir="}, nil, "cni-bin-dir", ""},
		{"bin is conf", []string{"--cni-bin-dir", "/x", "--cni-conf-dir", "/x"}, nil, "cni-conf-dir", "/x"},
		{"run is conf", []string{"--agent-run-dir", "/x", "--cni-conf-dir", "/x"}, nil, "agent-run-dir", "/x"},
		{"conf name path", []string{"--cni-conf-file-name", "../10-x.conflist"}, nil, "cni-conf-file-name", "../10-x.conflist"},
		{"conf name ext", []string{"--cni-conf-file-name", "10-x.yaml"}, nil, "cni-conf-file-name", "10-x.yaml"},
		{"standalone list", []string{"--chained=false", "--cni-conf-file-name", "x.conflist"}, nil, "cni-conf-file-name", "x.conflist"},
		{"bad namespace", []string{"--exclude-namespaces", "kube-system,Bad_NS"}, nil, "exclude-namespaces", "Bad_NS"},
		{"bad namespace env", nil, map[string]string{"EXCLUDE_NAMESPACES": "a,-b"}, "exclude-namespaces", "-b"},
		{"bad pod ns", []string{"--pod-namespace", "UPPER"}, nil, "pod-namespace", "UPPER"},
		{"health addr", []string{"--health-addr", "8000"}, nil, "health-addr", "8000"},
		{"metrics port", []string{"--metrics-addr", ":99999"}, nil, "metrics-addr", ":99999"},
		{"monitoring port env", nil, map[string]string{"MONITORING_PORT": "http"}, "metrics-addr", "http"},
		{"backend", []string{"--backend", "nft"}, nil, "backend", "nft"},
		{"force binary env", nil, map[string]string{"FORCE_IPTABLES_BINARY": "auto"}, "backend", "auto"},
		{"native nft env", nil, map[string]string{"NATIVE_NFTABLES": "yes please"}, "backend", "yes please"},
		{"log level", []string{"--log-level", "trace"}, nil, "log-level", "trace"},
		{"log level env", nil, map[string]string{"NFTMESH_LOG_LEVEL": "loud"}, "log-level", "loud"},
		{"chained env", nil, map[string]string{"CHAINED_CNI_PLUGIN": "maybe"}, "chained", "maybe"},
		{"api timeout", []string{"--api-timeout", "0s"}, nil, "api-timeout", "0s"},
		{"api timeout env", nil, map[string]string{"NFTMESH_API_TIMEOUT": "soon"}, "api-timeout", "soon"},
		{"api timeout syntax", []string{"--api-timeout", "soon"}, nil, "api-timeout", "soon"},
		{"burst syntax", []string{"--reinstall-burst=many"}, nil, "reinstall-burst", "many"},
		{"chained syntax", []string{"--chained=maybe"}, nil, "chained", "maybe"},
		{"rate", []string{"--reinstall-rate", "0"}, nil, "reinstall-rate", "0"},
		{"rate NaN", []string{"--reinstall-rate", "NaN"}, nil, "reinstall-rate", "NaN"},
		{"burst", []string{"--reinstall-burst", "0"}, nil, "reinstall-burst", "0"},
		{"fight threshold", []string{"--fight-threshold", "-1"}, nil, "fight-threshold", "-1"},
		{"fight window", []string{"--fight-window", "-1s"}, nil, "fight-window", "-1s"},
		{"no api server", nil, map[string]string{"KUBERNETES_SERVICE_HOST": ""}, "kube-api-server", ""},
		{"api server url", []string{"--kube-api-server", "ftp://x"}, nil, "kube-api-server", "ftp://x"},
		{"api server port", nil, map[string]string{"KUBERNETES_SERVICE_PORT": "70000"}, "kube-api-server", "https://10.96.0.1:70000"},
		{"repair without node", []string{"--repair-enabled", "--repair-label-pods"}, nil, "repair-node-name", ""},
		{"repair exit code", []string{"--repair-enabled", "--node-name", "n", "--repair-init-container-exit-code", "300"}, nil, "repair-init-container-exit-code", "300"},
		{"repair label key", []string{"--repair-enabled", "--repair-broken-pod-label-key", "a b"}, nil, "repair-broken-pod-label-key", "a b"},
		{"repair label value", []string{"--repair-enabled", "--repair-broken-pod-label-value", "a b"}, nil, "repair-broken-pod-label-value", "a b"},
		{"repair selector", []string{"--repair-enabled", "--repair-label-selectors", "a in (("}, nil, "repair-label-selectors", "a in (("},
		{"repair field selector", []string{"--repair-enabled", "--repair-field-selectors", "a=b=c,,=="}, nil, "repair-field-selectors", "a=b=c,,=="},
		{"host proc empty", []string{"--repair-enabled", "--repair-pods", "--node-name", "n", "--host-proc", ""}, nil, "host-proc", ""},
		{"repair enabled env", nil, map[string]string{"REPAIR_ENABLED": "si"}, "repair-enabled", "si"},
		{"taint key", []string{"--node-taint-key", "cni.istio.io/not ready"}, nil, "node-taint-key", "cni.istio.io/not ready"},
		{"taint key empty", []string{"--node-taint-key="}, nil, "node-taint-key", ""},
		{"taint key env", nil, map[string]string{"NFTMESH_NODE_TAINT_KEY": "a/b/c"}, "node-taint-key", "a/b/c"},
		{"remove taint env", nil, map[string]string{"NFTMESH_REMOVE_NODE_TAINT": "sure"}, "remove-node-taint", "sure"},
		{"repair init name", []string{"--repair-enabled", "--repair-init-container-name", "Not_Valid"}, nil, "repair-init-container-name", "Not_Valid"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := ParseConfig(c.args, withEnv(c.env))
			if err == nil {
				t.Fatalf("accepted: %+v", cfg)
			}
			var ce *ConfigError
			if !errors.As(err, &ce) {
				t.Fatalf("error %q is not a ConfigError", err)
			}
			if ce.Flag != c.flag || ce.Value != c.val {
				t.Errorf("error names --%s %q, want --%s %q (%v)", ce.Flag, ce.Value, c.flag, c.val, err)
			}
			if !strings.Contains(err.Error(), "--"+c.flag) {
				t.Errorf("message %q does not name the flag", err)
			}
			for k := range c.env {
				if k != "KUBERNETES_SERVICE_HOST" && k != "KUBERNETES_SERVICE_PORT" && !strings.Contains(err.Error(), k) {
					t.Errorf("message %q does not name the variable %s", err, k)
				}
			}
		})
	}
	if _, err := ParseConfig([]string{"--no-such-flag"}, withEnv(nil)); err == nil {
		t.Error("unknown flag accepted")
	}
	if _, err := ParseConfig([]string{"stray"}, withEnv(nil)); err == nil {
		t.Error("stray argument accepted")
	}
	if _, err := ParseConfig([]string{"-h"}, withEnv(nil)); !errors.Is(err, pflag.ErrHelp) {
		t.Errorf("-h: %v", err)
	}
}

// FuzzParseConfig: arbitrary flags and environment never panic, and an
// accepted config always satisfies the invariants the installer relies on.
func FuzzParseConfig(f *testing.F) {
	f.Add("--cni-bin-dir\x00/a\x00--chained=false", "EXCLUDE_NAMESPACES=a,b\x00CNI_CONF_NAME=x.conf")
	f.Add("--kube-api-server\x00http://[::1]:80", "MONITORING_PORT=1")
	f.Add("", "KUBERNETES_SERVICE_HOST=::1\x00KUBERNETES_SERVICE_PORT=0")
	f.Add("--repair-enabled\x00--repair-label-pods", "NODE_NAME=n\x00REPAIR_FIELD_SELECTORS=a!=b")
	f.Fuzz(func(t *testing.T, args, env string) {
		var argv []string
		if args != "" {
			argv = strings.Split(args, "\x00")
		}
		m := map[string]string{}
		for _, kv := range strings.Split(env, "\x00") {
			if k, v, ok := strings.Cut(kv, "="); ok {
				m[k] = v
			}
		}
		c, err := ParseConfig(argv, testEnv(m))
		if err != nil {
			return
		}
		if len(c.CNIBinDirs) == 0 || c.CNIConfDir == "" || c.AgentRunDir == "" || c.CNIConfDir == c.AgentRunDir {
			t.Fatalf("accepted incomplete config %+v", c)
		}
		if !c.Chained && c.CNIConfFileName == "" {
			t.Fatal("standalone without a file name")
		}
		if c.ServiceAccountDir != "" && c.KubeAPIServer == "" {
			t.Fatal("kubeconfig without a server")
		}
		if c.Repair.Mode() != repair.None && c.Repair.NodeName == "" {
			t.Fatal("repair without a node")
		}
		_ = c.PluginConf().JSON()
	})
}

func TestParseLogLevelIstioForms(t *testing.T) {
	good := []struct {
		in   string
		want zerolog.Level
	}{
		{"info", zerolog.InfoLevel},
		{"WARNING", zerolog.WarnLevel},
		{"default:info", zerolog.InfoLevel},
		{"default:info,cni-plugin:debug", zerolog.DebugLevel},
		{"cni:warn, default:error", zerolog.WarnLevel},
		{"default:none", zerolog.ErrorLevel},
		{"default:fatal,install:error", zerolog.ErrorLevel},
		{"error,repair:info", zerolog.InfoLevel},
	}
	for _, g := range good {
		got, err := ParseLogLevel(g.in)
		if err != nil || got != g.want {
			t.Errorf("ParseLogLevel(%q) = %v, %v; want %v", g.in, got, err, g.want)
		}
	}
	bad := []struct{ in, names string }{
		{"", "empty"},
		{"  ", "empty"},
		{"trace", `"trace"`},
		{"default:loud", `"loud"`},
		{"default:info,", `item ""`},
		{":info", `scope ""`},
		{"my scope:info", `"my scope"`},
		{"default:info:debug", `"info:debug"`},
		{strings.Repeat("x", 500) + ":info", "..."},
	}
	for _, b := range bad {
		_, err := ParseLogLevel(b.in)
		if err == nil {
			t.Errorf("ParseLogLevel(%q) accepted", b.in)
			continue
		}
		if !strings.Contains(err.Error(), b.names) || len(err.Error()) > 300 {
			t.Errorf("ParseLogLevel(%q): %q should name %s, bounded", b.in, err, b.names)
		}
	}
	// Through the agent's configuration, as the chart passes it.
	c, err := ParseConfig(nil, withEnv(map[string]string{"NFTMESH_LOG_LEVEL": "default:info,cni-plugin:debug"}))
	if err != nil || c.LogLevel != zerolog.DebugLevel || *c.PluginConf().LogLevel != "debug" {
		t.Errorf("scope form through the environment: %v %+v", err, c)
	}
}

// FuzzParseLogLevel: any string is a level or an error naming what is
// wrong, never a panic or a level the plugin would not accept.
func FuzzParseLogLevel(f *testing.F) {
	for _, s := range []string{"info", "default:info,cni-plugin:debug", "a:none", ",", ":", "x:y:z"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		l, err := ParseLogLevel(s)
		if err != nil {
			if len(err.Error()) > 400 {
				t.Fatalf("unbounded error: %d bytes", len(err.Error()))
			}
			return
		}
		switch l {
		case zerolog.DebugLevel, zerolog.InfoLevel, zerolog.WarnLevel, zerolog.ErrorLevel:
		default:
			t.Fatalf("ParseLogLevel(%q) = %v", s, l)
		}
	})
}

func TestStandaloneNetworkName(t *testing.T) {
	c, err := ParseConfig([]string{"--chained=false"}, withEnv(map[string]string{"NFTMESH_CNI_NETWORK_NAME": "istio-cni"}))
	if err != nil {
		t.Fatal(err)
	}
	if pc := c.PluginConf(); pc.Name != "istio-cni" || pc.Type != PluginName {
		t.Errorf("standalone conf name %q type %q, want istio-cni %s", pc.Name, pc.Type, PluginName)
	}
	c, err = ParseConfig(nil, withEnv(map[string]string{"NFTMESH_CNI_NETWORK_NAME": "istio-cni"}))
	if err != nil {
		t.Fatal(err)
	}
	if pc := c.PluginConf(); pc.Name != PluginName {
		t.Errorf("chained entry renamed to %q", pc.Name)
	}
	for _, bad := range []string{"", "Istio_CNI", "default/istio-cni", strings.Repeat("a", 254)} {
		if _, err := ParseConfig([]string{"--cni-network-name", bad}, withEnv(nil)); err == nil || !strings.Contains(err.Error(), "--cni-network-name") {
			t.Errorf("network name %q: %v", bad, err)
		}
	}
	for _, bad := range []string{"yaml", "JSON", ""} {
		if _, err := ParseConfig([]string{"--log-format", bad}, withEnv(nil)); err == nil || !strings.Contains(err.Error(), "--log-format") {
			t.Errorf("log format %q: %v", bad, err)
		}
	}
}

// TestConfigErrorBounded: a huge bad value is named by its flag and quoted
// by its start, not echoed whole into the log, whether a check or pflag's
// own parsing refused it, from a flag or from a variable.
func TestConfigErrorBounded(t *testing.T) {
	huge := strings.Repeat("n", 1<<20)
	for _, c := range []struct {
		flag string
		args []string
		env  map[string]string
	}{
		{"backend", []string{"--backend", huge}, nil},
		{"api-timeout", []string{"--api-timeout", huge}, nil},
		{"api-timeout", nil, map[string]string{"NFTMESH_API_TIMEOUT": huge}},
		{"reinstall-burst", []string{"--reinstall-burst", huge}, nil},
		{"repair-enabled", nil, map[string]string{"REPAIR_ENABLED": huge}},
		{"backend", nil, map[string]string{"NATIVE_NFTABLES": huge}},
		{"chained", nil, map[string]string{"CHAINED_CNI_PLUGIN": huge}},
		{"repair-label-selectors", []string{"--repair-enabled", "--repair-label-selectors", "a in ((" + huge}, nil},
		{"repair-field-selectors", []string{"--repair-enabled", "--repair-field-selectors", "a=b=c," + huge}, nil},
		{"exclude-namespaces", nil, map[string]string{"EXCLUDE_NAMESPACES": "a,\"" + huge}},
	} {
		_, err := ParseConfig(c.args, withEnv(c.env))
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Flag != c.flag {
			t.Errorf("--%s: error is not a ConfigError naming the flag: %.300v", c.flag, err)
			continue
		}
		if msg := err.Error(); len(msg) > 1024 || !strings.Contains(msg, "--"+c.flag) || !strings.Contains(msg, "bytes cut)") {
			t.Errorf("--%s: error is %d bytes: %.300s", c.flag, len(msg), msg)
		}
	}
}
