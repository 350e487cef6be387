// Package scenarios is the one scenario table every backend test uses: golden
// renders (no root) and kernel tests with real traffic (root). Each case is a
// name plus annotations applied over the documented base spec, and the
// address families of the pod.
//
// Base: redirect.DefaultSpec() on a dual-stack pod (PodV4 then PodV6) whose
// sidecar is dual-stack (ISTIO_DUAL_STACK=true), so IPv6 is captured; proxy
// UID/GID 1337, REDIRECT mode. Addresses come from the documentation ranges.
package scenarios

import (
	"fmt"
	"net/netip"

	"github.com/nftmesh/nftmesh/podinfo/meshpod"
	"github.com/nftmesh/nftmesh/redirect"
)

// The pod's own addresses in every test topology (testkit/nettest gives
// them to the pod's interface as its Stack says): 198.18.0.0/15
// (benchmarking range) and a ULA.
var (
	PodV4 = netip.MustParseAddr("198.18.0.2")
	PodV6 = netip.MustParseAddr("fd00:6e74:7300::2")
)

// Stack is which address families the pod has, and the order its primary
// plugin gave them (its pod IPs' order).
type Stack uint8

const (
	// StackDual: PodV4, then PodV6 (the usual order). The zero value.
	StackDual Stack = iota
	// StackDualV6First: PodV6, then PodV4.
	StackDualV6First
	// StackIPv4: PodV4 only.
	StackIPv4
	// StackIPv6: PodV6 only.
	StackIPv6
)

func (st Stack) String() string {
	switch st {
	case StackDual:
		return "dual-stack"
	case StackDualV6First:
		return "dual-stack, IPv6 first"
	case StackIPv4:
		return "IPv4 only"
	case StackIPv6:
		return "IPv6 only"
	}
	return fmt.Sprintf("stack(%d)", uint8(st))
}

// Added lists the pod's addresses in the order they are added to its
// interface.
func (st Stack) Added() []netip.Addr {
	switch st {
	case StackDualV6First:
		return []netip.Addr{PodV6, PodV4}
	case StackIPv4:
		return []netip.Addr{PodV4}
	case StackIPv6:
		return []netip.Addr{PodV6}
	}
	return []netip.Addr{PodV4, PodV6}
}

// Listed is Added in the order the kernel lists the namespace's addresses
// (IPv4 first), the order Istio's IPv6 decision reads them in; the kernel
// tests check it against the kernel's own listing.
func (st Stack) Listed() []netip.Addr { return meshpod.KernelOrder(st.Added()) }

// Has4 reports whether the pod has an IPv4 address.
func (st Stack) Has4() bool { return st != StackIPv6 }

// Has6 reports whether the pod has an IPv6 address.
func (st Stack) Has6() bool { return st != StackIPv4 }

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
	// come from the proxy container, not annotations: UID/GID, DNS,
	// DualStack...). IPv6 is not for Mutate: it follows from Stack and
	// DualStack, as for a real pod.
	Mutate func(*redirect.Spec)
	// Stack is the pod's address families (StackDual if zero).
	Stack Stack
}

// Base is the spec every scenario starts from (before IPv6 is decided from
// the scenario's Stack).
func Base() redirect.Spec {
	s := redirect.DefaultSpec()
	s.DualStack = true
	return s
}

// Spec returns the scenario's validated spec, with IPv6 decided from the
// pod's addresses as the kernel lists them (meshpod.IPv6Capture).
func (sc Scenario) Spec() (redirect.Spec, error) {
	s, err := redirect.ParseAnnotations(Base(), sc.Annotations)
	if err != nil {
		return s, fmt.Errorf("scenario %s: %w", sc.Name, err)
	}
	if sc.Mutate != nil {
		sc.Mutate(&s)
	}
	s.IPv6 = meshpod.IPv6Capture(sc.Stack.Listed(), s.DualStack)
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
	{Name: "defaults", Doc: "an injected pod with no capture annotations, dual-stack, with a dual-stack sidecar (ISTIO_DUAL_STACK=true): IPv4 and IPv6 captured"},
	{Name: "ipv4-only", Doc: "defaults on a single-stack IPv4 pod",
		Stack: StackIPv4, Mutate: func(s *redirect.Spec) { s.DualStack = false }},
	{Name: "ipv4-only-dual-stack-sidecar", Doc: "a single-stack IPv4 pod with ISTIO_DUAL_STACK=true: its loopback and link-local IPv6 addresses do not count, IPv4 only",
		Stack: StackIPv4},
	{Name: "dual-stack-ipv4-sidecar", Doc: "a dual-stack pod (IPv4 first) whose sidecar is not dual-stack: IPv4 captured; IPv6 goes straight to its destination and no ::6",
		Mutate: func(s *redirect.Spec) { s.DualStack = false }},
	{Name: "dual-stack-ipv6-first-ipv4-sidecar", Doc: "a dual-stack pod given IPv6 first, sidecar not dual-stack: the kernel still lists IPv4 first, so IPv4 only",
		Stack: StackDualV6First, Mutate: func(s *redirect.Spec) { s.DualStack = false }},
	{Name: "ipv6-only", Doc: "a single-stack IPv6 pod whose sidecar is not dual-stack: its first address is IPv6, so IPv6 is captured (IPv4 rules too, for lo)",
		Stack: StackIPv6, Mutate: func(s *redirect.Spec) { s.DualStack = false }},
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
