package meshpod

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/nftmesh/nftmesh/redirect"
)

func linkerdPod(annotations map[string]string) *Pod {
	return &Pod{Namespace: "emojivoto", Name: "web", Annotations: annotations,
		InitContainers: []Container{{Name: "linkerd-network-validator"}},
		Containers:     []Container{{Name: "web-svc"}, {Name: LinkerdProxyContainer}}}
}

func TestLinkerdSelection(t *testing.T) {
	native := &Pod{Namespace: "a", Name: "b", InitContainers: []Container{{Name: LinkerdProxyContainer}}, Containers: []Container{{Name: "app"}}}
	withInit := linkerdPod(nil)
	withInit.InitContainers = append(withInit.InitContainers, Container{Name: LinkerdInitContainer})
	// linkerd-cni looks for linkerd-init among init containers only.
	initAsApp := linkerdPod(nil)
	initAsApp.Containers = append(initAsApp.Containers, Container{Name: LinkerdInitContainer})
	for _, tc := range []struct {
		name   string
		pod    *Pod
		in     bool
		reason string
	}{
		{"cni-mode", linkerdPod(nil), true, ReasonLinkerdInMesh},
		{"native-sidecar", native, true, ReasonLinkerdInMesh},
		{"linkerd-init", withInit, false, ReasonLinkerdInit},
		{"linkerd-init-not-init", initAsApp, true, ReasonLinkerdInMesh},
		{"no-proxy", &Pod{Containers: []Container{{Name: "app"}}}, false, ReasonNoProxy},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in, reason, spec, err := Decide(tc.pod)
			if err != nil || in != tc.in || reason != tc.reason {
				t.Fatalf("Decide = %v %q %v, want %v %q", in, reason, err, tc.in, tc.reason)
			}
			if in && (spec.InboundPort() != 4143 || spec.OutboundPort() != 4140 || !slices.Equal(spec.ProxyUIDs, []uint32{2102}) || len(spec.ProxyGIDs) != 0) {
				t.Fatalf("spec = %+v, want linkerd-cni's defaults", spec)
			}
		})
	}
}

func TestBothProxiesRefused(t *testing.T) {
	p := linkerdPod(nil)
	p.Containers = append(p.Containers, Container{Name: ProxyContainer})
	in, reason, _, err := Decide(p)
	if !in || reason != ReasonBothProxies || err == nil || !strings.Contains(err.Error(), "istio-proxy and a linkerd-proxy") {
		t.Fatalf("Decide = %v %q %v, want a refusal naming both proxies", in, reason, err)
	}
}

func TestLinkerdPrecedence(t *testing.T) {
	node := DefaultLinkerd()
	node.OutboundPortsToIgnore = []string{"25"}
	node.SubnetsToIgnore = []string{"10.0.0.0/8"}
	node.ProxyGID = 2103
	p := linkerdPod(map[string]string{
		AnnotationLinkerdSkipInboundPorts:  "22,8100-8102",
		AnnotationLinkerdSkipOutboundPorts: "5432",
		AnnotationLinkerdProxyUID:          "", // empty: the namespace's applies
	})
	p.NamespaceAnnotations = map[string]string{
		AnnotationLinkerdProxyUID:          "3000",
		AnnotationLinkerdSkipOutboundPorts: "9999", // the pod's wins
		AnnotationLinkerdSkipSubnets:       " 192.168.0.0/16 ,fd00::/8",
	}
	p.Linkerd = &node
	p.Labels = map[string]string{LabelLinkerdControlPlane: "destination"}
	spec, err := LinkerdSpec(node, p)
	if err != nil {
		t.Fatal(err)
	}
	// Inbound skips add to the node's, outbound ones replace them, the
	// control plane also skips the API server's (fallback) ports.
	if want := []uint16{4190, 4191, 22, 8100, 8101, 8102}; !slices.Equal(spec.InboundPortsExclude, want) {
		t.Errorf("inbound excluded %v, want %v", spec.InboundPortsExclude, want)
	}
	if want := []uint16{5432, 443, 6443}; !slices.Equal(spec.OutboundPortsExclude, want) {
		t.Errorf("outbound excluded %v, want %v", spec.OutboundPortsExclude, want)
	}
	want := []netip.Prefix{netip.MustParsePrefix("192.168.0.0/16"), netip.MustParsePrefix("fd00::/8")}
	if !slices.Equal(spec.InboundSourcesExclude, want) {
		t.Errorf("sources excluded %v, want %v", spec.InboundSourcesExclude, want)
	}
	if !slices.Equal(spec.ProxyUIDs, []uint32{3000}) || !slices.Equal(spec.ProxyGIDs, []uint32{2103}) {
		t.Errorf("owners %v/%v, want 3000/2103", spec.ProxyUIDs, spec.ProxyGIDs)
	}
	if LinkerdNeedsNamespace(p) {
		t.Error("namespace annotations already known, yet asked for")
	}
	p.NamespaceAnnotations = nil
	if !LinkerdNeedsNamespace(p) {
		t.Error("a pod lacking overrides must have its namespace read")
	}
}

func TestLinkerdPortsToRedirect(t *testing.T) {
	node := DefaultLinkerd()
	node.PortsToRedirect = []int{8080, 4191, 9090}
	spec, err := LinkerdSpec(node, linkerdPod(map[string]string{AnnotationLinkerdSkipInboundPorts: "9090"}))
	if err != nil {
		t.Fatal(err)
	}
	if spec.InboundPorts.All || !slices.Equal(spec.InboundPorts.Ports, []uint16{8080}) {
		t.Fatalf("inbound ports %v, want only 8080 (4191 and 9090 are ignored first)", spec.InboundPorts)
	}
}

func TestLinkerdBadSettings(t *testing.T) {
	for _, tc := range []struct {
		name       string
		node       func(*LinkerdConfig)
		key, value string
		want       string
	}{
		{"skip-inbound-word", nil, AnnotationLinkerdSkipInboundPorts, "22,http", `annotation config.linkerd.io/skip-inbound-ports: "http" is not a port`},
		{"skip-inbound-space", nil, AnnotationLinkerdSkipInboundPorts, "22, 23", `" 23" is not a port`},
		{"skip-outbound-zero", nil, AnnotationLinkerdSkipOutboundPorts, "0", `skip-outbound-ports: "0" is not a port`},
		{"skip-outbound-big", nil, AnnotationLinkerdSkipOutboundPorts, "65536", `"65536" is not a port`},
		{"skip-outbound-reversed", nil, AnnotationLinkerdSkipOutboundPorts, "9000-8000", `"9000-8000" is not a port range`},
		{"skip-outbound-3parts", nil, AnnotationLinkerdSkipOutboundPorts, "1-2-3", `"1-2-3" is not a port`},
		{"skip-outbound-huge", nil, AnnotationLinkerdSkipOutboundPorts, "1-65535", `"1-65535" takes the list past 4096 ports`},
		{"skip-subnets", nil, AnnotationLinkerdSkipSubnets, "10.0.0.0/8,10.0.0.300/8", `skip-subnets: "10.0.0.300/8" is not a CIDR`},
		{"proxy-uid-word", nil, AnnotationLinkerdProxyUID, "root", `proxy-uid: "root" is not an integer`},
		{"proxy-uid-zero", nil, AnnotationLinkerdProxyUID, "0", `proxy-uid: "0" is not a proxy user id`},
		{"proxy-gid-big", nil, AnnotationLinkerdProxyGID, "4294967296", `proxy-gid: "4294967296" is not a group id`},
		{"node-port", func(c *LinkerdConfig) { c.IncomingProxyPort = 70000 }, "", "", `field linkerd incoming-proxy-port: "70000" is not a port`},
		{"node-ignore", func(c *LinkerdConfig) { c.InboundPortsToIgnore = []string{"x"} }, "", "", `field linkerd inbound-ports-to-ignore: "x"`},
		{"node-redirect", func(c *LinkerdConfig) { c.PortsToRedirect = []int{-1} }, "", "", `field linkerd ports-to-redirect: "-1"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			node := DefaultLinkerd()
			if tc.node != nil {
				tc.node(&node)
			}
			p := linkerdPod(nil)
			if tc.key != "" {
				p.Annotations = map[string]string{tc.key: tc.value}
			}
			p.Linkerd = &node
			in, reason, _, err := Decide(p)
			if !in || reason != ReasonLinkerdInvalid || err == nil {
				t.Fatalf("Decide = %v %q %v, want a refusal (fail closed)", in, reason, err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not say %q", err, tc.want)
			}
		})
	}
}

// FuzzLinkerdAnnotations: any annotation values give a spec that builds,
// or an error naming an annotation; never a panic, never a spec that
// fails to build.
func FuzzLinkerdAnnotations(f *testing.F) {
	f.Add("22,8100-8102", "5432", "10.0.0.0/8", "2102", "-1")
	f.Add("1-65535", "0", "::/0, 1.2.3.4/32", "x", "4294967296")
	f.Add("", "", "", "", "")
	f.Fuzz(func(t *testing.T, in, out, subnets, uid, gid string) {
		p := linkerdPod(map[string]string{
			AnnotationLinkerdSkipInboundPorts: in, AnnotationLinkerdSkipOutboundPorts: out,
			AnnotationLinkerdSkipSubnets: subnets, AnnotationLinkerdProxyUID: uid, AnnotationLinkerdProxyGID: gid,
		})
		ok, _, spec, err := Decide(p)
		if !ok {
			t.Fatal("a linkerd-proxy pod was skipped")
		}
		if err != nil {
			if !strings.Contains(err.Error(), "config.linkerd.io/") {
				t.Fatalf("error names no annotation: %v", err)
			}
			if len(err.Error()) > 8<<10 {
				t.Fatalf("error of %d bytes", len(err.Error()))
			}
			return
		}
		if _, err := redirect.Build(spec); err != nil {
			t.Fatalf("decided spec does not build: %v", err)
		}
	})
}

// TestLinkerdPlan pins the rules a Linkerd pod gets: linkerd-cni's
// PROXY_INIT_REDIRECT and PROXY_INIT_OUTPUT, in the model's chains (no
// Istio tunnel or agent port exception, no proxy-over-lo inbound capture,
// no ::6 on lo).
func TestLinkerdPlan(t *testing.T) {
	node := DefaultLinkerd()
	node.IPv6, node.ProxyGID = true, 5
	spec, err := LinkerdSpec(node, linkerdPod(map[string]string{AnnotationLinkerdSkipSubnets: "10.0.0.0/8,fd00::/8"}))
	if err != nil {
		t.Fatal(err)
	}
	plan, err := redirect.Build(spec)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"set inbound-exclude-ports inet_service { 4190-4191 }",
		"chain nat-prerouting { type nat hook prerouting priority -100 }",
		"rule nat-prerouting: l4proto tcp -> jump nat-istio-inbound",
		"chain nat-output { type nat hook output priority -100 }",
		"rule nat-output: -> jump nat-istio-output",
		"chain nat-istio-redirect",
		"rule nat-istio-redirect: l4proto tcp -> redirect to :4140",
		"chain nat-istio-in-redirect",
		"rule nat-istio-in-redirect: l4proto tcp -> redirect to :4143",
		"chain nat-istio-inbound",
		"rule nat-istio-inbound: ipv4 l4proto tcp saddr 10.0.0.0/8 -> return",
		"rule nat-istio-inbound: ipv6 l4proto tcp saddr fd00::/8 -> return",
		"rule nat-istio-inbound: l4proto tcp dport @inbound-exclude-ports -> return",
		"rule nat-istio-inbound: l4proto tcp -> jump nat-istio-in-redirect",
		"chain nat-istio-output",
		"rule nat-istio-output: skuid 2102 -> return",
		"rule nat-istio-output: skgid 5 -> return",
		`rule nat-istio-output: oifname "lo" -> return`,
		"rule nat-istio-output: ipv4 daddr 127.0.0.1/32 -> return",
		"rule nat-istio-output: ipv6 daddr ::1/128 -> return",
		"rule nat-istio-output: ipv4 -> jump nat-istio-redirect",
		"rule nat-istio-output: ipv6 -> jump nat-istio-redirect",
	}
	if got := redirect.Describe(plan); !slices.Equal(got, want) {
		t.Fatalf("plan:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if len(plan.LoopbackAddrs) != 0 {
		t.Fatalf("loopback addresses %v, want none (no passthrough source)", plan.LoopbackAddrs)
	}
}
