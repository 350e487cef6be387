package cniconf

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nftmesh/nftmesh/podinfo/meshpod"
)

func TestParseConfigDefaults(t *testing.T) {
	c, err := ParseConfig([]byte(`{"cniVersion":"1.0.0","name":"k8s-pod-network","type":"nftmesh-cni","some_future_field":{"x":1}}`))
	if err != nil {
		t.Fatal(err)
	}
	if c.LogLevel != "info" || c.AgentRunDir != DefaultAgentRunDir || c.Kubeconfig != DefaultAgentRunDir+"/kubeconfig" ||
		c.Backend != BackendAuto || c.APITimeout != DefaultAPITimeout || c.Type != "nftmesh-cni" || c.CNIVersion != "1.0.0" {
		t.Fatalf("defaults: %+v", c)
	}
}

func TestParseConfigValues(t *testing.T) {
	tests := []struct {
		name string
		in   string
		ok   func(*Config) bool
	}{
		{"all fields", `{"type":"nftmesh-cni","log_level":"debug","exclude_namespaces":["kube-system","istio-system"],
			"pod_namespace":"nftmesh","agent_run_dir":"/run/x","backend":"nftables","api_timeout":"2s"}`,
			func(c *Config) bool {
				return c.LogLevel == "debug" && len(c.ExcludeNamespaces) == 2 && c.PodNamespace == "nftmesh" &&
					c.AgentRunDir == "/run/x" && c.Kubeconfig == "/run/x/kubeconfig" && c.Backend == "nftables" && c.APITimeout == 2*time.Second
			}},
		{"explicit kubeconfig", `{"agent_run_dir":"/run/x","kubeconfig":"/etc/k/config"}`,
			func(c *Config) bool { return c.Kubeconfig == "/etc/k/config" && c.AgentRunDir == "/run/x" }},
		{"istio aliases", `{"plugin_log_level":"warning","cni_agent_run_dir":"/var/run/istio-cni"}`,
			func(c *Config) bool { return c.LogLevel == "warn" && c.AgentRunDir == "/var/run/istio-cni" }},
		{"ours win over aliases", `{"log_level":"error","plugin_log_level":"debug","agent_run_dir":"/a","cni_agent_run_dir":"/b"}`,
			func(c *Config) bool { return c.LogLevel == "error" && c.AgentRunDir == "/a" }},
		{"empty strings keep defaults", `{"log_level":"","agent_run_dir":"","backend":"","api_timeout":"","kubeconfig":""}`,
			func(c *Config) bool {
				return c.LogLevel == "info" && c.AgentRunDir == DefaultAgentRunDir && c.Backend == BackendAuto && c.APITimeout == DefaultAPITimeout
			}},
		{"iptables-legacy", `{"backend":"iptables-legacy"}`, func(c *Config) bool { return c.Backend == BackendIptablesLegacy }},
		{"null fields", `{"log_level":null,"exclude_namespaces":null}`, func(c *Config) bool { return c.LogLevel == "info" }},
		{"prevResult kept raw", `{"prevResult":{"cniVersion":"1.0.0","ips":[]}}`, func(c *Config) bool {
			return string(c.PrevResultJSON) == `{"cniVersion":"1.0.0","ips":[]}` && c.RawPrevResult == nil
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := ParseConfig([]byte(tt.in))
			if err != nil {
				t.Fatal(err)
			}
			if !tt.ok(c) {
				t.Fatalf("unexpected config %+v", c)
			}
		})
	}
}

func TestParseConfigBadInput(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want []string
	}{
		{"not json", `{"type":`, []string{"decoding plugin config"}},
		{"not an object", `[1,2]`, []string{"decoding plugin config"}},
		{"log_level wrong type", `{"log_level":3}`, []string{`"log_level"`, "number", "a string"}},
		{"exclude_namespaces wrong type", `{"exclude_namespaces":"kube-system"}`, []string{`"exclude_namespaces"`, "an array"}},
		{"exclude_namespaces item wrong type", `{"exclude_namespaces":[1]}`, []string{"exclude_namespaces"}},
		{"api_timeout as number", `{"api_timeout":30}`, []string{`"api_timeout"`, "number"}},
		{"backend wrong type", `{"backend":true}`, []string{`"backend"`, "bool"}},
		{"pod_namespace wrong type", `{"pod_namespace":{}}`, []string{`"pod_namespace"`}},
		{"cniVersion wrong type", `{"cniVersion":1}`, []string{`"cniVersion"`}},
		{"unknown log level", `{"log_level":"verbose"}`, []string{`"log_level"`, `"verbose"`}},
		{"unknown alias log level", `{"plugin_log_level":"loud"}`, []string{`"plugin_log_level"`, `"loud"`}},
		{"unknown backend", `{"backend":"ebpf"}`, []string{`"backend"`, `"ebpf"`}},
		{"bad duration", `{"api_timeout":"30"}`, []string{`"api_timeout"`, `"30"`, "duration"}},
		{"zero duration", `{"api_timeout":"0s"}`, []string{`"api_timeout"`, "positive"}},
		{"negative duration", `{"api_timeout":"-1s"}`, []string{`"api_timeout"`, "positive"}},
		{"relative run dir", `{"agent_run_dir":"run/nftmesh"}`, []string{`"agent_run_dir"`, `"run/nftmesh"`}},
		{"relative kubeconfig", `{"kubeconfig":"kubeconfig"}`, []string{`"kubeconfig"`}},
		{"empty namespace", `{"exclude_namespaces":["kube-system",""]}`, []string{`"exclude_namespaces"`}},
		{"every problem at once", `{"backend":"x","api_timeout":"y","log_level":"z"}`, []string{`"backend"`, `"api_timeout"`, `"log_level"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := ParseConfig([]byte(tt.in))
			if err == nil {
				t.Fatalf("ParseConfig = %+v, want an error", c)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %s", err, w)
				}
			}
		})
	}
	var ce *ConfigError
	if _, err := ParseConfig([]byte(`{"backend":"x"}`)); !errors.As(err, &ce) || ce.Field != "backend" {
		t.Errorf("error is not a *ConfigError for backend: %v", err)
	}
}

func TestSkipBeforeLookup(t *testing.T) {
	c, err := ParseConfig([]byte(`{"exclude_namespaces":["kube-system"],"pod_namespace":"nftmesh"}`))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		ns, name, want string
	}{
		{"", "", meshpod.ReasonNotKubernetes},
		{"shop", "", meshpod.ReasonNotKubernetes},
		{"", "web", meshpod.ReasonNotKubernetes},
		{"kube-system", "coredns-1", meshpod.ReasonExcludedNamespace},
		{"nftmesh", "nftmesh-agent-x7k2p", meshpod.ReasonAgentPod},
		{"nftmesh", "other-pod", ""},
		{"shop", "nftmesh-agent-x7k2p", ""},
		{"shop", "web-1", ""},
	}
	for _, tt := range tests {
		if got := c.SkipBeforeLookup(K8sArgs{PodNamespace: tt.ns, PodName: tt.name}); got != tt.want {
			t.Errorf("SkipBeforeLookup(%s/%s) = %q, want %q", tt.ns, tt.name, got, tt.want)
		}
	}
	noNS, _ := ParseConfig([]byte(`{}`))
	if got := noNS.SkipBeforeLookup(K8sArgs{PodNamespace: "default", PodName: "nftmesh-agent-1"}); got != "" {
		t.Errorf("without pod_namespace the agent prefix alone must not skip, got %q", got)
	}
}

func TestParseK8sArgs(t *testing.T) {
	a, err := ParseK8sArgs("IgnoreUnknown=1;K8S_POD_NAMESPACE=shop;K8S_POD_NAME=web-1;K8S_POD_INFRA_CONTAINER_ID=abc123;K8S_POD_UID=u-1;FOO=bar=baz")
	if err != nil {
		t.Fatal(err)
	}
	if a != (K8sArgs{PodNamespace: "shop", PodName: "web-1", PodUID: "u-1", InfraContainerID: "abc123"}) {
		t.Fatalf("got %+v", a)
	}
	if a, err := ParseK8sArgs(""); err != nil || a != (K8sArgs{}) {
		t.Fatalf("empty: %+v %v", a, err)
	}
	if a, err := ParseK8sArgs("K8S_POD_NAME=x;;"); err != nil || a.PodName != "x" {
		t.Fatalf("empty pairs: %+v %v", a, err)
	}
	for _, bad := range []string{"K8S_POD_NAME", "a=b;junk", "K8S_POD_NAME=a;K8S_POD_NAME=b"} {
		if _, err := ParseK8sArgs(bad); err == nil || !strings.Contains(err.Error(), "CNI_ARGS") {
			t.Errorf("ParseK8sArgs(%q) error = %v, want a CNI_ARGS error", bad, err)
		}
	}
}

func FuzzParseConfig(f *testing.F) {
	f.Add([]byte(`{"type":"nftmesh-cni","log_level":"debug","exclude_namespaces":["a"],"api_timeout":"2s","backend":"nftables"}`))
	f.Add([]byte(`{"api_timeout":"-5m","agent_run_dir":"x","kubeconfig":3}`))
	f.Add([]byte(`{"prevResult":{"ips":[{"address":"10.0.0.2/24"}]}}`))
	f.Fuzz(func(t *testing.T, in []byte) {
		c, err := ParseConfig(in)
		if err != nil {
			if c != nil {
				t.Fatal("config returned with an error")
			}
			return
		}
		if c.APITimeout <= 0 || c.AgentRunDir == "" || c.Kubeconfig == "" || c.Backend == "" || c.LogLevel == "" {
			t.Fatalf("accepted config with an unusable field: %+v", c)
		}
	})
}

func FuzzParseK8sArgs(f *testing.F) {
	f.Add("IgnoreUnknown=1;K8S_POD_NAMESPACE=a;K8S_POD_NAME=b")
	f.Add("=;==;K8S_POD_UID=")
	f.Fuzz(func(t *testing.T, in string) {
		a, err := ParseK8sArgs(in)
		if err != nil && a != (K8sArgs{}) {
			t.Fatal("partial args returned with an error")
		}
	})
}

// TestPrevResult: the prevResult is decoded once from the bytes the runtime
// gave, as a result of the config's version, and printed back unchanged
// only when it already says that version.
func TestPrevResult(t *testing.T) {
	for _, tc := range []struct {
		name, conf string
		wantErr    bool
		parsed     bool
		unchanged  string
	}{
		{"none", `{"cniVersion":"1.0.0"}`, false, false, ""},
		{"null", `{"cniVersion":"1.0.0","prevResult":null}`, false, false, ""},
		{"same version", `{"cniVersion":"1.0.0","prevResult":{"cniVersion":"1.0.0","ips":[{"address":"10.1.0.5/24"}]}}`, false, true,
			`{"cniVersion":"1.0.0","ips":[{"address":"10.1.0.5/24"}]}`},
		{"0.4.0 config", `{"cniVersion":"0.4.0","prevResult":{"cniVersion":"0.4.0","ips":[{"version":"4","address":"10.1.0.5/24"}]}}`, false, true,
			`{"cniVersion":"0.4.0","ips":[{"version":"4","address":"10.1.0.5/24"}]}`},
		{"no version in the result", `{"cniVersion":"1.0.0","prevResult":{"ips":[{"address":"10.1.0.5/24"}]}}`, false, true, ""},
		{"another version", `{"cniVersion":"1.1.0","prevResult":{"cniVersion":"1.0.0","ips":[]}}`, false, true, ""},
		{"not an address", `{"cniVersion":"1.0.0","prevResult":{"cniVersion":"1.0.0","ips":[{"address":"nope"}]}}`, true, false, ""},
		{"not an object", `{"cniVersion":"1.0.0","prevResult":[1,2]}`, true, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := ParseConfig([]byte(tc.conf))
			if err != nil {
				t.Fatal(err)
			}
			err = c.ParsePrevResult()
			if (err != nil) != tc.wantErr {
				t.Fatalf("ParsePrevResult = %v, want error %t", err, tc.wantErr)
			}
			if (c.PrevResult != nil) != tc.parsed {
				t.Fatalf("PrevResult = %v, want parsed %t", c.PrevResult, tc.parsed)
			}
			if got := string(c.PrevResultUnchanged()); got != tc.unchanged {
				t.Fatalf("PrevResultUnchanged = %q, want %q", got, tc.unchanged)
			}
		})
	}
}

func TestParseConfigLinkerd(t *testing.T) {
	c, err := ParseConfig([]byte(`{"cniVersion":"1.0.0","name":"k8s-pod-network","type":"nftmesh-cni",
		"linkerd":{"incoming-proxy-port":4143,"outgoing-proxy-port":4140,"proxy-uid":2102,"ipv6":true,
		"inbound-ports-to-ignore":["4190","4191","8100-8102"],"subnets-to-ignore":["10.0.0.0/8"]}}`))
	if err != nil {
		t.Fatal(err)
	}
	// Keys left out keep linkerd2-cni's chart defaults (proxy-gid -1: none).
	if l := c.Linkerd; l == nil || !l.IPv6 || l.ProxyGID != -1 || len(l.InboundPortsToIgnore) != 3 {
		t.Fatalf("linkerd settings %+v", c.Linkerd)
	}
	_, err = ParseConfig([]byte(`{"cniVersion":"1.0.0","name":"n","type":"nftmesh-cni","linkerd":{"outgoing-proxy-port":0,"subnets-to-ignore":["10.0.0/8"]}}`))
	for _, want := range []string{`plugin config field "linkerd"`, `linkerd outgoing-proxy-port: "0" is not a port`, `linkerd subnets-to-ignore: "10.0.0/8" is not a CIDR`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v does not say %s", err, want)
		}
	}
}
