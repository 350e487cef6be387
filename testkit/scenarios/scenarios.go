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
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nftmesh/nftmesh/netlab"
	"github.com/nftmesh/nftmesh/podinfo/meshpod"
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
	// come from the proxy container, not annotations: UID/GID, DNS,
	// DualStack...). IPv6 is not for Mutate: it follows from Stack and
	// DualStack, as for a real pod.
	Mutate func(*redirect.Spec)
	// Stack is the pod's address families (StackDual if zero).
	Stack netlab.Stack
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
	s.IPv6 = meshpod.IPv6Capture(meshpod.KernelOrder(sc.Stack.Added()), s.DualStack)
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
		Stack: netlab.StackIPv4, Mutate: func(s *redirect.Spec) { s.DualStack = false }},
	{Name: "ipv4-only-dual-stack-sidecar", Doc: "a single-stack IPv4 pod with ISTIO_DUAL_STACK=true: its loopback and link-local IPv6 addresses do not count, IPv4 only",
		Stack: netlab.StackIPv4},
	{Name: "dual-stack-ipv4-sidecar", Doc: "a dual-stack pod (IPv4 first) whose sidecar is not dual-stack: IPv4 captured; IPv6 goes straight to its destination and no ::6",
		Mutate: func(s *redirect.Spec) { s.DualStack = false }},
	{Name: "dual-stack-ipv6-first-ipv4-sidecar", Doc: "a dual-stack pod given IPv6 first, sidecar not dual-stack: the kernel still lists IPv4 first, so IPv4 only",
		Stack: netlab.StackDualV6First, Mutate: func(s *redirect.Spec) { s.DualStack = false }},
	{Name: "ipv6-only", Doc: "a single-stack IPv6 pod whose sidecar is not dual-stack: its first address is IPv6, so IPv6 is captured (IPv4 rules too, for lo)",
		Stack: netlab.StackIPv6, Mutate: func(s *redirect.Spec) { s.DualStack = false }},
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

// MustPlan is the named scenario's plan, failing the test when there is no
// such scenario or it does not build.
func MustPlan(t testing.TB, name string) redirect.Plan {
	t.Helper()
	sc, ok := ByName(name)
	if !ok {
		t.Fatalf("no scenario %s", name)
	}
	p, err := sc.Plan()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// Large are the largest port annotations a pod can carry (the API admits
// 256 KiB of annotations in all: some 45,500 distinct ports as text), and
// the most rules annotations can make (interface lists, each name a rule,
// at redirect.MaxInterfaces), kept out of All: each backend's kernel test
// applies and checks every one within LargeApplyBound, in a real namespace.
var Large = []Scenario{
	{Name: "exclude-inbound-ports-1-45341", Doc: "excludeInboundPorts 1,2,...,45341 (255 KiB), as in issue 29's review: one range once merged",
		Annotations: map[string]string{redirect.AnnotationExcludeInboundPorts: portList(portRange(1, 45341))}},
	{Name: "exclude-43000-random-inbound-ports", Doc: "excludeInboundPorts with 43,000 ports drawn at random (250 KiB), unsorted",
		Annotations: map[string]string{redirect.AnnotationExcludeInboundPorts: portList(randomPorts(43000))}},
	{Name: "exclude-every-other-inbound-port", Doc: "excludeInboundPorts with the 32,768 odd ports (187 KiB): no two adjacent, the most ranges a port set can need",
		Annotations: map[string]string{redirect.AnnotationExcludeInboundPorts: portList(oddPorts())}},
	{Name: "tproxy-most-interfaces", Doc: "TPROXY with redirect.MaxInterfaces excluded and as many rerouted interfaces: some 7,000 rules",
		Annotations: map[string]string{
			redirect.AnnotationInterceptionMode:         "TPROXY",
			redirect.AnnotationExcludeInterfaces:        interfaceList("x", redirect.MaxInterfaces),
			redirect.AnnotationRerouteVirtualInterfaces: interfaceList("v", redirect.MaxInterfaces),
		}},
}

// LargeApplyBound is what applying a Large scenario may take on a loaded
// test machine: a small share of the plugin's 30 s budget for kernel work,
// itself well inside the 4 minutes kubelet gives a pod sandbox's creation.
const LargeApplyBound = 5 * time.Second

// randomPorts is n distinct ports of 1-65535 in random order, the same on
// every run.
func randomPorts(n int) []uint16 {
	perm := rand.New(rand.NewPCG(29, 4)).Perm(65535)
	out := make([]uint16, n)
	for i := range out {
		out[i] = uint16(perm[i] + 1)
	}
	return out
}

func portRange(from, to int) []uint16 {
	var out []uint16
	for p := from; p <= to; p++ {
		out = append(out, uint16(p))
	}
	return out
}

func oddPorts() []uint16 {
	var out []uint16
	for p := 1; p < 65536; p += 2 {
		out = append(out, uint16(p))
	}
	return out
}

func interfaceList(prefix string, n int) string {
	names := make([]string, n)
	for i := range names {
		names[i] = prefix + strconv.Itoa(i)
	}
	return strings.Join(names, ",")
}

func portList(ports []uint16) string {
	parts := make([]string, len(ports))
	for i, p := range ports {
		parts[i] = strconv.Itoa(int(p))
	}
	return strings.Join(parts, ",")
}
