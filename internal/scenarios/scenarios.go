// Package scenarios is the one scenario table every backend test uses: golden
// renders (no root) and kernel tests with real traffic (root). Each case is a
// name plus annotations applied over the documented base spec.
//
// Base spec: redirect.DefaultSpec() with IPv6 on (a dual-stack pod), proxy
// UID/GID 1337, REDIRECT mode. Addresses come from the documentation ranges.
package scenarios

import (
	"fmt"

	"github.com/nftmesh/nftmesh/redirect"
)

// Addresses the scenarios use (documentation ranges, never routed).
const (
	ExcludedV4 = "192.0.2.0/24"
	ExcludedV6 = "2001:db8:e::/48"
	IncludedV4 = "198.51.100.0/24"
	IncludedV6 = "2001:db8:1::/48"
)

// Scenario is one named capture configuration.
type Scenario struct {
	Name string
	// Doc says what the scenario exercises.
	Doc string
	// Annotations are applied over the base spec with redirect.ParseAnnotations.
	Annotations map[string]string
	// Mutate, if set, adjusts the spec after annotations (for settings that
	// come from the proxy container, not annotations: UID/GID, DNS, IPv6...).
	Mutate func(*redirect.Spec)
}

// Base is the spec every scenario starts from.
func Base() redirect.Spec {
	s := redirect.DefaultSpec()
	s.IPv6 = true
	return s
}

// Spec returns the scenario's validated spec.
func (sc Scenario) Spec() (redirect.Spec, error) {
	s, err := redirect.ParseAnnotations(Base(), sc.Annotations)
	if err != nil {
		return s, fmt.Errorf("scenario %s: %w", sc.Name, err)
	}
	if sc.Mutate != nil {
		sc.Mutate(&s)
	}
	if err := s.Validate(); err != nil {
		return s, fmt.Errorf("scenario %s: %w", sc.Name, err)
	}
	return s, nil
}

// Plan builds the scenario's plan.
func (sc Scenario) Plan() (redirect.Plan, error) {
	s, err := sc.Spec()
	if err != nil {
		return redirect.Plan{}, err
	}
	return redirect.Build(s)
}

// All is the scenario table.
var All = []Scenario{
	{Name: "defaults", Doc: "an injected pod with no capture annotations, dual-stack"},
	{Name: "ipv4-only", Doc: "defaults on a single-stack IPv4 pod",
		Mutate: func(s *redirect.Spec) { s.IPv6 = false }},
	{Name: "include-inbound-ports", Doc: "only listed inbound ports captured; excludes ignored",
		Annotations: map[string]string{
			redirect.AnnotationIncludeInboundPorts: "8080,9090",
			redirect.AnnotationExcludeInboundPorts: "9091",
		}},
	{Name: "exclude-inbound-ports", Doc: "all inbound but the listed ports (plus 15020, 15021, 15090)",
		Annotations: map[string]string{redirect.AnnotationExcludeInboundPorts: "8081,8082"}},
	{Name: "no-inbound", Doc: "includeInboundPorts empty: no inbound capture",
		Annotations: map[string]string{redirect.AnnotationIncludeInboundPorts: ""}},
	{Name: "exclude-cidrs", Doc: "outbound to excluded v4 and v6 ranges goes direct",
		Annotations: map[string]string{redirect.AnnotationExcludeOutboundIPRanges: ExcludedV4 + "," + ExcludedV6}},
	{Name: "include-cidrs", Doc: "only outbound to included v4 and v6 ranges is captured",
		Annotations: map[string]string{redirect.AnnotationIncludeOutboundIPRanges: IncludedV4 + "," + IncludedV6}},
	{Name: "include-loopback-cidr", Doc: "including a loopback range drops the app-to-app-over-lo bypass",
		Annotations: map[string]string{redirect.AnnotationIncludeOutboundIPRanges: "127.0.0.0/8," + IncludedV4}},
	{Name: "include-outbound-ports", Doc: "outbound to listed TCP ports captured whatever the destination",
		Annotations: map[string]string{
			redirect.AnnotationIncludeOutboundIPRanges: "",
			redirect.AnnotationIncludeOutboundPorts:    "5432,6379",
		}},
	{Name: "exclude-outbound-ports", Doc: "listed outbound ports (tcp and udp) go direct; replaces the default 15020",
		Annotations: map[string]string{redirect.AnnotationExcludeOutboundPorts: "3306,11211"}},
	{Name: "custom-uid-gid", Doc: "proxy runs as UID 2001 / GID 2002",
		Mutate: func(s *redirect.Spec) { s.ProxyUIDs = []uint32{2001}; s.ProxyGIDs = []uint32{2002} }},
	{Name: "dns-capture", Doc: "ISTIO_META_DNS_CAPTURE: port 53 to 15053 and conntrack zones",
		Mutate: func(s *redirect.Spec) { s.CaptureDNS = true }},
	{Name: "tproxy", Doc: "TPROXY inbound interception with policy routing",
		Annotations: map[string]string{redirect.AnnotationInterceptionMode: "TPROXY"}},
	{Name: "tproxy-include-ports", Doc: "TPROXY with an explicit inbound port list",
		Annotations: map[string]string{
			redirect.AnnotationInterceptionMode:    "TPROXY",
			redirect.AnnotationIncludeInboundPorts: "8080",
		}},
	{Name: "exclude-interfaces", Doc: "traffic in or out of the listed interfaces is not captured",
		Annotations: map[string]string{redirect.AnnotationExcludeInterfaces: "veth-x,net1"}},
	{Name: "reroute-interfaces", Doc: "inbound on virtual interfaces is treated as outbound",
		Annotations: map[string]string{redirect.AnnotationRerouteVirtualInterfaces: "tap0,veth-vm"}},
	{Name: "drop-invalid", Doc: "INVALID_DROP: conntrack-invalid packets dropped in mangle",
		Mutate: func(s *redirect.Spec) { s.DropInvalid = true }},
}

// ByName returns the named scenario.
func ByName(name string) (Scenario, bool) {
	for _, sc := range All {
		if sc.Name == name {
			return sc, true
		}
	}
	return Scenario{}, false
}
