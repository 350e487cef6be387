package charts

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ingressPorts sums up a NetworkPolicy's ingress rules, one per port:
// "PORT from [PEER ...]", a peer as ns{selector}, pod{selector}, both
// joined with +, or ip{cidr}; "PORT from anywhere" for a rule without
// peers.
func ingressPorts(np *networkingv1.NetworkPolicy) []string {
	var out []string
	for _, in := range np.Spec.Ingress {
		var peers []string
		for _, p := range in.From {
			var parts []string
			if p.NamespaceSelector != nil {
				parts = append(parts, "ns{"+metav1.FormatLabelSelector(p.NamespaceSelector)+"}")
			}
			if p.PodSelector != nil {
				parts = append(parts, "pod{"+metav1.FormatLabelSelector(p.PodSelector)+"}")
			}
			if p.IPBlock != nil {
				parts = append(parts, "ip{"+p.IPBlock.CIDR+"}")
			}
			peers = append(peers, strings.Join(parts, "+"))
		}
		from := "anywhere"
		if len(in.From) > 0 {
			from = "[" + strings.Join(peers, " ") + "]"
		}
		if len(in.Ports) == 0 {
			out = append(out, "any port from "+from)
		}
		for _, port := range in.Ports {
			out = append(out, fmt.Sprintf("%s from %s", port.Port.String(), from))
		}
	}
	return out
}

// global.networkPolicy.enabled lets in metrics scrapes only from the
// configured scrapers (by default pods in the namespace named monitoring)
// and nothing else: the node's probes of the health port pass whatever
// the policy, as Kubernetes documents. No scrapers means no rule at all,
// never a rule without peers (which would let everyone in). Before, both
// ports were open to every source.
func TestNetworkPolicyAdmitsOnlyScrapers(t *testing.T) {
	on := []string{"--set", "global.networkPolicy.enabled=true"}
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"default", nil, []string{"15014 from [ns{kubernetes.io/metadata.name=monitoring}]"}},
		{"namespace and pod", []string{"--set-json", `networkPolicy.metricsFrom=[{"namespaceSelector":{"matchLabels":{"kubernetes.io/metadata.name":"istio-system"}},"podSelector":{"matchLabels":{"app.kubernetes.io/name":"prometheus"}}}]`},
			[]string{"15014 from [ns{kubernetes.io/metadata.name=istio-system}+pod{app.kubernetes.io/name=prometheus}]"}},
		{"pods of the release namespace, and an address block", []string{"--set-json", `networkPolicy.metricsFrom=[{"podSelector":{"matchExpressions":[{"key":"app","operator":"In","values":["prometheus","vmagent"]}]}},{"ipBlock":{"cidr":"192.0.2.0/24"}}]`},
			[]string{"15014 from [pod{app in (prometheus,vmagent)} ip{192.0.2.0/24}]"}},
		{"another metrics port", []string{"--set", "metricsPort=9090"}, []string{"9090 from [ns{kubernetes.io/metadata.name=monitoring}]"}},
		{"no scrapers", []string{"--set-json", "networkPolicy.metricsFrom=[]"}, nil},
		{"scrapers null", []string{"--set", "networkPolicy.metricsFrom=null"}, nil},
		{"networkPolicy null", []string{"--set", "networkPolicy=null"}, nil},
		{"Istio's umbrella prefix", []string{"--set-json", `cni.networkPolicy.metricsFrom=[{"namespaceSelector":{"matchLabels":{"team":"obs"}}}]`}, []string{"15014 from [ns{team=obs}]"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := render(t, append(slices.Clone(on), tc.args...)...)
			if len(r.NetworkPolicies) != 1 {
				t.Fatalf("%d NetworkPolicies", len(r.NetworkPolicies))
			}
			np := r.NetworkPolicies[0]
			if got := ingressPorts(np); !slices.Equal(got, tc.want) {
				t.Errorf("ingress %q, want %q", got, tc.want)
			}
			if !slices.Equal(np.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}) || len(np.Spec.Egress) != 1 || len(np.Spec.Egress[0].To) != 0 {
				t.Errorf("policy types %v, egress %+v: want ingress isolated, all egress", np.Spec.PolicyTypes, np.Spec.Egress)
			}
		})
	}
	if r := render(t, "--set-json", `networkPolicy.metricsFrom=[{"podSelector":{}}]`); len(r.NetworkPolicies) != 0 {
		t.Error("a NetworkPolicy without global.networkPolicy.enabled")
	}
}

// A scraper entry the API server would refuse, or that would let everyone
// in, is refused at install, naming the entry.
func TestNetworkPolicyScrapersSchema(t *testing.T) {
	for _, tc := range []struct{ json, want string }{
		{`[{}]`, "metricsFrom/0"},
		{`[{"podSelector":{}},{"ipBlock":{"cidr":"10.0.0.0/8"},"podSelector":{}}]`, "metricsFrom/1"},
		{`[{"namespaceSelektor":{}}]`, "namespaceSelektor"},
		{`[{"podSelector":{"matchLabels":{"app":1}}}]`, "matchLabels"},
		{`[{"podSelector":{"matchExpressions":[{"key":"app","operator":"Equals"}]}}]`, "operator"},
		{`[{"ipBlock":{}}]`, "cidr"},
		{`{"podSelector":{}}`, "metricsFrom"},
	} {
		out, err := runHelm(t, "template", "nftmesh", chartDir, "--set", "global.networkPolicy.enabled=true", "--set-json", "networkPolicy.metricsFrom="+tc.json)
		if err == nil {
			t.Errorf("schema accepted metricsFrom=%s:\n%.300s", tc.json, out)
		} else if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("metricsFrom=%s: error does not name %s: %v", tc.json, tc.want, err)
		}
	}
}
