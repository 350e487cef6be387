package charts

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/rs/zerolog"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/yaml"

	"github.com/nftmesh/nftmesh/podinfo/cniconf"
	"github.com/nftmesh/nftmesh/podinfo/meshpod"
	"github.com/nftmesh/nftmesh/testkit/linkerdtest"
)

// linkerdValuesFile is linkerd2-cni's chart values file from the Linkerd
// reference (shared/oracles/linkerd beside the repository, or
// $NFTMESH_LINKERD_ORACLE); the test skips when it is absent.
func linkerdValuesFile(t testing.TB) string {
	t.Helper()
	dir, err := linkerdtest.OracleDir()
	if errors.Is(err, linkerdtest.ErrNoOracle) {
		t.Skipf("skipping: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "linkerd2-cni-values.yaml")
	if _, err := os.Stat(p); err != nil {
		t.Skipf("skipping: no linkerd2-cni values file in the Linkerd reference (%v; set %s)", err, linkerdtest.OracleEnv)
	}
	return p
}

// valuesFile writes values as a YAML file for -f.
func valuesFile(t testing.TB, values map[string]any) string {
	t.Helper()
	b, err := yaml.Marshal(values)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// linkerdEntry is the linkerd settings of the conflist entry the agent
// writes with the rendered configuration, as the plugin reads them.
func (r *rendered) linkerdEntry(t *testing.T) *meshpod.LinkerdConfig {
	t.Helper()
	cfg := r.agentConfig(t)
	pc, err := cniconf.ParseConfig(cfg.PluginConf().JSON())
	if err != nil {
		t.Fatalf("the plugin refuses the entry the agent writes: %v", err)
	}
	return pc.Linkerd
}

// linkerdRBAC reports whether the rendered RBAC grants the Linkerd reads:
// namespaces cluster-wide, and the default/kubernetes Service only.
func (r *rendered) linkerdRBAC(t *testing.T) (namespaces, service bool) {
	t.Helper()
	for _, cr := range r.Roles {
		for _, rule := range cr.Rules {
			if slices.Contains(rule.Resources, "namespaces") {
				namespaces = equalRule(rule, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"namespaces"}, Verbs: []string{"get", "list", "watch"}})
			}
			if slices.Contains(rule.Resources, "services") {
				t.Errorf("ClusterRole %s reads services: %+v", cr.Name, rule)
			}
		}
	}
	for _, role := range r.NSRoles {
		want := rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"services"}, ResourceNames: []string{"kubernetes"}, Verbs: []string{"get", "list", "watch"}}
		service = role.Namespace == "default" && len(role.Rules) == 1 && equalRule(role.Rules[0], want) && slices.Equal(role.Rules[0].ResourceNames, want.ResourceNames)
	}
	if service && (len(r.NSBindings) != 1 || r.NSBindings[0].Namespace != "default" || r.NSBindings[0].Subjects[0].Name != "nftmesh-agent") {
		t.Errorf("the Linkerd Role is not bound to the agent: %+v", r.NSBindings)
	}
	return namespaces, service
}

// linkerd2-cni's values file as it is installs the chart, and every key in
// it takes effect under nftmesh's name, or is named as ignored: the entry
// the agent writes holds linkerd2-cni's settings (its chart's defaults), the
// CNI dirs, backend, repair, log level and the DaemonSet's own settings are
// the file's, and the RBAC gives the Linkerd reads.
func TestLinkerdValuesFileTakesEffect(t *testing.T) {
	file := linkerdValuesFile(t)
	if out, err := runHelm(t, "lint", "--strict", chartDir, "-f", file); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	r := render(t, "-f", file)
	ds := r.ds(t)
	cfg := r.agentConfig(t)
	if !cfg.Linkerd.Enabled {
		t.Fatal("the Linkerd profile is off")
	}
	if got, want := *r.linkerdEntry(t), meshpod.DefaultLinkerd(); !equalLinkerd(got, want) {
		t.Errorf("conflist linkerd settings %+v, want linkerd2-cni's defaults %+v", got, want)
	}
	if cfg.Backend != "nftables" || cfg.Repair.Enabled || cfg.LogLevel != zerolog.InfoLevel {
		t.Errorf("backend %s (iptablesMode nft), repair %v (repairController off), log level %v", cfg.Backend, cfg.Repair.Enabled, cfg.LogLevel)
	}
	if hostPath(ds, "cni-conf-dir") != "/etc/cni/net.d" || hostPath(ds, "cni-bin-dir") != "/opt/cni/bin" {
		t.Errorf("CNI dirs %s %s", hostPath(ds, "cni-conf-dir"), hostPath(ds, "cni-bin-dir"))
	}
	spec := ds.Spec.Template.Spec
	if ds.Spec.RevisionHistoryLimit == nil || *ds.Spec.RevisionHistoryLimit != 10 || spec.PriorityClassName != "system-node-critical" || len(spec.InitContainers) != 0 ||
		len(spec.Tolerations) != 1 || spec.Tolerations[0].Operator != corev1.TolerationOpExists || spec.Containers[0].ImagePullPolicy != corev1.PullIfNotPresent ||
		*spec.Containers[0].SecurityContext.Privileged || ds.Spec.UpdateStrategy.RollingUpdate.MaxUnavailable.IntValue() != 1 {
		t.Errorf("DaemonSet settings from the file: revisionHistoryLimit %v, pod %+v", ds.Spec.RevisionHistoryLimit, spec)
	}
	if ns, svc := r.linkerdRBAC(t); !ns || !svc {
		t.Errorf("Linkerd RBAC: namespaces %v, default/kubernetes %v", ns, svc)
	}

	// Every key of the file is named in the install notes' lists, or is
	// one of the values both charts have under the same name.
	notes := ds.Annotations["nftmesh.io/mapped-values"] + "; " + ds.Annotations["nftmesh.io/ignored-values"]
	same := []string{"podLabels", "commonLabels", "tolerations", "updateStrategy", "imagePullSecrets", "privileged", "priorityClassName", "extraInitContainers", "revisionHistoryLimit", "resources"}
	var file0 map[string]any
	b, _ := os.ReadFile(file)
	if err := yaml.Unmarshal(b, &file0); err != nil {
		t.Fatal(err)
	}
	for k, v := range file0 {
		sub, _ := v.(map[string]any)
		switch {
		case k == "repairController" || k == "image":
			for kk := range sub {
				if !strings.Contains(notes, k+"."+kk) {
					t.Errorf("%s.%s is neither mapped nor ignored: %s", k, kk, notes)
				}
			}
		case slices.Contains(same, k):
		case !strings.Contains(notes, k):
			t.Errorf("%s is neither mapped nor ignored: %s", k, notes)
		}
	}
}

func equalLinkerd(a, b meshpod.LinkerdConfig) bool {
	return a.IncomingProxyPort == b.IncomingProxyPort && a.OutgoingProxyPort == b.OutgoingProxyPort &&
		a.ProxyUID == b.ProxyUID && a.ProxyGID == b.ProxyGID && a.IPv6 == b.IPv6 &&
		slices.Equal(a.PortsToRedirect, b.PortsToRedirect) && slices.Equal(a.SubnetsToIgnore, b.SubnetsToIgnore) &&
		slices.Equal(slices.Sorted(slices.Values(a.InboundPortsToIgnore)), slices.Sorted(slices.Values(b.InboundPortsToIgnore))) &&
		slices.Equal(a.OutboundPortsToIgnore, b.OutboundPortsToIgnore)
}

// linkerdOverrides are linkerd2-cni values other than its defaults, each
// one visible in what the chart renders.
var linkerdOverrides = map[string]any{
	"inboundProxyPort": 7143, "outboundProxyPort": 7140, "proxyAdminPort": 5191, "proxyControlPort": 5190,
	"proxyUID": 2103, "proxyGID": 2104, "ignoreInboundPorts": "25, 8000-8100", "ignoreOutboundPorts": "443,6000-6010",
	"portsToRedirect": "8080,9090", "disableIPv6": false,
	"destCNINetDir": "/etc/cni/custom.d", "destCNIBinDir": "/opt/custom/bin", "iptablesMode": "legacy",
	"logLevel": "trace", "repairController": map[string]any{"enabled": true},
	"priorityClassName": "mesh-critical", "commonLabels": map[string]any{"team": "mesh"}, "revisionHistoryLimit": 3,
	"extraInitContainers": []any{map[string]any{"name": "wait", "image": "busybox:1", "command": []any{"true"}}},
	"nodeAffinity":        map[string]any{"requiredDuringSchedulingIgnoredDuringExecution": map[string]any{"nodeSelectorTerms": []any{map[string]any{"matchExpressions": []any{map[string]any{"key": "mesh", "operator": "Exists"}}}}}},
	"image":               map[string]any{"pullPolicy": "Always"},
	"resources":           map[string]any{"cpu": map[string]any{"request": "50m", "limit": ""}, "memory": map[string]any{"request": "", "limit": "300Mi"}},
}

// Values other than linkerd2-cni's defaults, over its file, each reach
// what they configure.
func TestLinkerdValuesOverrides(t *testing.T) {
	file := linkerdValuesFile(t)
	r := render(t, "-f", file, "-f", valuesFile(t, linkerdOverrides))
	ds := r.ds(t)
	cfg := r.agentConfig(t)
	want := meshpod.LinkerdConfig{IncomingProxyPort: 7143, OutgoingProxyPort: 7140, ProxyUID: 2103, ProxyGID: 2104,
		PortsToRedirect: []int{8080, 9090}, InboundPortsToIgnore: []string{"5191", "5190", "25", "8000-8100"},
		OutboundPortsToIgnore: []string{"443", "6000-6010"}, IPv6: true}
	if got := *r.linkerdEntry(t); !equalLinkerd(got, want) {
		t.Errorf("conflist linkerd settings %+v, want %+v", got, want)
	}
	if hostPath(ds, "cni-conf-dir") != "/etc/cni/custom.d" || hostPath(ds, "cni-bin-dir") != "/opt/custom/bin" {
		t.Errorf("CNI dirs %s %s", hostPath(ds, "cni-conf-dir"), hostPath(ds, "cni-bin-dir"))
	}
	if cfg.Backend != "iptables-legacy" || cfg.LogLevel != zerolog.DebugLevel || !cfg.Repair.Enabled || !cfg.Repair.DeletePods || cfg.Repair.RepairPods {
		t.Errorf("backend %s, log level %v, repair %+v", cfg.Backend, cfg.LogLevel, cfg.Repair)
	}
	spec := ds.Spec.Template.Spec
	c := spec.Containers[0]
	if spec.PriorityClassName != "mesh-critical" || ds.Spec.RevisionHistoryLimit == nil || *ds.Spec.RevisionHistoryLimit != 3 ||
		len(spec.InitContainers) != 1 || spec.InitContainers[0].Name != "wait" || c.ImagePullPolicy != corev1.PullAlways ||
		spec.Affinity == nil || spec.Affinity.NodeAffinity == nil || spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		t.Errorf("DaemonSet settings: %+v", spec)
	}
	if c.Resources.Requests.Cpu().Cmp(resource.MustParse("50m")) != 0 || c.Resources.Limits.Memory().Cmp(resource.MustParse("300Mi")) != 0 ||
		c.Resources.Requests.Memory().Cmp(resource.MustParse("100Mi")) != 0 {
		t.Errorf("resources %+v (the empty entries keep nftmesh's defaults)", c.Resources)
	}
	for _, o := range []map[string]string{ds.Labels, r.SA[0].Labels, r.ConfigMaps[0].Labels, r.Roles[0].Labels, r.NSRoles[0].Labels} {
		if o["team"] != "mesh" {
			t.Errorf("commonLabels missing on an object: %v", o)
		}
	}
}

// linkerd.enabled alone turns on linkerd2-cni's defaults and the Linkerd
// reads; without it (nor linkerd2-cni's values) the agent has neither.
func TestLinkerdEnabledValue(t *testing.T) {
	on := render(t, "--set", "linkerd.enabled=true")
	if !on.agentConfig(t).Linkerd.Enabled || !equalLinkerd(*on.linkerdEntry(t), meshpod.DefaultLinkerd()) {
		t.Errorf("linkerd.enabled=true: %+v", on.agentConfig(t).Linkerd)
	}
	if ns, svc := on.linkerdRBAC(t); !ns || !svc {
		t.Errorf("linkerd.enabled=true: RBAC namespaces %v, service %v", ns, svc)
	}
	off := render(t)
	if off.agentConfig(t).Linkerd.Enabled || off.linkerdEntry(t) != nil || len(off.NSRoles) != 0 {
		t.Errorf("default: Linkerd on (%+v) or its Role rendered (%d)", off.agentConfig(t).Linkerd, len(off.NSRoles))
	}
	if ns, _ := off.linkerdRBAC(t); ns {
		t.Error("default: namespaces readable")
	}
	if notes := renderNotes(t, "--set", "linkerd.enabled=true"); !strings.Contains(notes, "Linkerd pods: captured on the node settings below") || !strings.Contains(notes, "  incoming-proxy-port: 4143\n") {
		t.Errorf("install notes with linkerd.enabled=true:\n%s", notes)
	}
	if notes := renderNotes(t); !strings.Contains(notes, "Linkerd pods: linkerd2-cni's default settings, and no namespace reads") {
		t.Errorf("install notes by default:\n%s", notes)
	}
	// Istio's logLevel is still ignored while the profile is off.
	if got := render(t, "--set", "logLevel=debug").ds(t).Annotations["nftmesh.io/ignored-values"]; !strings.Contains(got, "logLevel (Istio's") {
		t.Errorf("logLevel without the Linkerd profile: %q", got)
	}
}

// Bad linkerd2-cni values stop the install, each named with its value.
func TestLinkerdValuesRefused(t *testing.T) {
	for _, c := range []struct {
		values map[string]any
		want   string
	}{
		{map[string]any{"inboundProxyPort": 0}, "inboundProxyPort=0: not a port (1-65535)"},
		{map[string]any{"outboundProxyPort": 70000}, "outboundProxyPort=70000: not a port"},
		{map[string]any{"proxyUID": 0}, "proxyUID=0: must be 1 or more"},
		{map[string]any{"proxyGID": 0}, "proxyGID=0: nftmesh exempts a proxy GID of 1 or more"},
		{map[string]any{"ignoreOutboundPorts": "http"}, "ignoreOutboundPorts=http: not a comma-separated list of ports and ranges"},
		{map[string]any{"ignoreInboundPorts": "9000-8000"}, "ignoreInboundPorts=9000-8000: 9000-8000 is not a port or an ascending range"},
		{map[string]any{"ignoreInboundPorts": "0"}, "ignoreInboundPorts=0: 0 is not a port"},
		{map[string]any{"ignoreOutboundPorts": "1-4096,5000"}, "ignoreOutboundPorts=1-4096,5000: more than 4096 ports"},
		{map[string]any{"ignoreInboundPorts": "1-4095"}, "ignoreInboundPorts=1-4095: more than 4096 ports"},
		{map[string]any{"portsToRedirect": "80-90"}, "portsToRedirect=80-90: not a comma-separated list of ports (e.g. 80,8080)"},
		{map[string]any{"iptablesMode": "xtables"}, "iptablesMode=xtables: linkerd2-cni's modes are nft, legacy and plain"},
		{map[string]any{"iptablesMode": "legacy", "backend": "nftables"}, "iptablesMode=legacy and backend=nftables"},
		{map[string]any{"destCNINetDir": "/a", "cniConfDir": "/b"}, "destCNINetDir=/a and cniConfDir=/b: the same host directory"},
		{map[string]any{"proxyUID": 2102, "linkerd": map[string]any{"enabled": false}}, "linkerd.enabled=false with linkerd2-cni's values (proxyUID)"},
		{map[string]any{"linkerd": map[string]any{"enabled": true}, "logLevel": "verbose"}, "logLevel=verbose: linkerd2-cni's levels are"},
		{map[string]any{"nodeAffinity": map[string]any{}, "affinity": map[string]any{"nodeAffinity": map[string]any{"x": 1}}, "proxyUID": 2102}, ""},
		{map[string]any{"image": map[string]any{"name": "x", "repository": "y"}}, "image.repository/image.tag: nftmesh's image values moved"},
		{map[string]any{"repairController": map[string]any{"enabeld": true}}, "repairController.enabeld: unknown key; did you mean repairController.enabled?"},
	} {
		out, err := runHelm(t, "template", "nftmesh", chartDir, "-f", valuesFile(t, c.values))
		if c.want == "" { // an empty nodeAffinity is nothing to map: accepted
			if err != nil {
				t.Errorf("%v: %v", c.values, err)
			}
			continue
		}
		if msg := helmError(t, out, err); !strings.Contains(msg, c.want) {
			t.Errorf("%v: refusal %q, want %q", c.values, msg, c.want)
		}
	}
}

// FuzzLinkerdPortList: whatever a port list value holds, the chart either
// refuses it by name or renders a setting the agent accepts and the plugin
// reads back as the list given (spaces dropped): never a value that stops
// the agent at start.
func FuzzLinkerdPortList(f *testing.F) {
	for _, s := range []string{"", "443", "25, 8000-8100", "http", "9000-8000", "0", "65536", "1-65535", ",", "80,,81", "-1", "٣"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		values := map[string]any{"ignoreOutboundPorts": s, "linkerd": map[string]any{"enabled": true}}
		if _, err := yaml.Marshal(values); err != nil {
			return // no values file can hold it (control characters)
		}
		file := valuesFile(t, values)
		out, err := runHelm(t, "template", "nftmesh", chartDir, "--namespace", agentNS, "-f", file)
		if err != nil {
			if msg := helmError(t, out, err); !strings.Contains(msg, "- ignoreOutboundPorts=") {
				t.Fatalf("%q: refused without naming it: %s", s, msg)
			}
			return
		}
		r := render(t, "-f", file)
		got := r.linkerdEntry(t).OutboundPortsToIgnore
		var want []string
		if s = strings.Join(strings.Fields(s), ""); s != "" {
			want = strings.Split(s, ",")
		}
		if !slices.Equal(got, want) {
			t.Fatalf("%q: the plugin reads %q", s, got)
		}
	})
}
