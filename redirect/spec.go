package redirect

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/nftmesh/nftmesh/redirect/quote"
)

// Fixed ports and marks of Istio's sidecar capture.
const (
	ProxyOutboundPort   uint16 = 15001 // Envoy's outbound listener
	ProxyInboundPort    uint16 = 15006 // Envoy's inbound listener
	InboundTunnelPort   uint16 = 15008 // HBONE tunnel, never captured
	ValidationProbePort uint16 = 15002
	DNSProxyPort        uint16 = 15053 // istio-agent's DNS proxy
	DNSPort             uint16 = 53

	TProxyMark     uint32 = 1337
	OutboundMark   uint32 = 1338
	TProxyRouteTab        = 133

	DefaultProxyID uint32 = 1337
)

// Ports always excluded from inbound capture (status, health, telemetry).
var alwaysExcludedInbound = []uint16{15020, 15021, 15090}

// Passthrough sources: Envoy binds these to reach the app over lo without
// being captured again.
var (
	InboundPassthroughV4 = netip.MustParsePrefix("127.0.0.6/32")
	InboundPassthroughV6 = netip.MustParsePrefix("::6/128")
	loopbackV6           = netip.MustParsePrefix("::1/128")
)

// InterceptionMode is how inbound traffic reaches the proxy.
type InterceptionMode string

const (
	ModeRedirect InterceptionMode = "REDIRECT"
	ModeTProxy   InterceptionMode = "TPROXY"
	// ModeNone is what Istio's injector writes for no interception: such a
	// pod gets no rules (WantsNoCapture), so a Spec never holds it.
	ModeNone InterceptionMode = "NONE"
)

// PortSelector is a port list, or all ports ("*"); the zero value selects nothing.
type PortSelector struct {
	All   bool
	Ports []uint16
}

// None reports whether the selector selects no port.
func (p PortSelector) None() bool { return !p.All && len(p.Ports) == 0 }

func (p PortSelector) String() string {
	if p.All {
		return "*"
	}
	return join(p.Ports, ",")
}

// CIDRSelector is a CIDR list that may also be "everything" ("*").
type CIDRSelector struct {
	All      bool
	Prefixes []netip.Prefix
}

func (c CIDRSelector) String() string {
	if c.All {
		return "*"
	}
	return join(c.Prefixes, ",")
}

// Spec is everything Istio's sidecar capture understands, for one pod:
// DefaultSpec, with ParseAnnotations applying a pod's annotations.
type Spec struct {
	InterceptionMode InterceptionMode

	// InboundPorts selects inbound ports to capture: "*" (all but
	// InboundPortsExclude), a list (excludes are then ignored, as in Istio), or
	// nothing (no inbound capture).
	InboundPorts        PortSelector
	InboundPortsExclude []uint16 // 15020, 15021, 15090 are always added by Build

	OutboundIPRanges        CIDRSelector
	OutboundIPRangesExclude []netip.Prefix
	OutboundPorts           []uint16 // TCP only
	OutboundPortsExclude    []uint16 // TCP and UDP

	ExcludeInterfaces        []string
	RerouteVirtualInterfaces []string

	ProxyUIDs []uint32
	ProxyGIDs []uint32
	// OwnerGroupsInclude / Exclude restrict which outbound traffic (by sender
	// GID) is captured: Include nil means all groups.
	OwnerGroupsInclude []uint32
	OwnerGroupsExclude []uint32

	// CaptureDNS (ISTIO_META_DNS_CAPTURE) redirects port-53 traffic to the
	// DNS proxy and keeps the proxy's and the app's conntrack entries apart.
	CaptureDNS  bool
	DropInvalid bool
	// IPv6 turns on the IPv6 rules and ::6 on lo; Istio decides it from the
	// pod's addresses and DualStack (meshpod.IPv6Capture).
	IPv6 bool
	// DualStack is the sidecar's ISTIO_DUAL_STACK: a pod with an address of
	// each family gets both captured, not only its first address's family.
	DualStack bool

	// HostIPv4LoopbackCIDR is the loopback range outbound traffic to which is
	// never captured (ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR).
	HostIPv4LoopbackCIDR netip.Prefix

	// The fields below let a Spec say what another mesh's capture (Linkerd's)
	// does differently; their zero values are Istio's, so an Istio Spec never
	// sets them. They are knobs, not a mesh name: Build stays mesh-agnostic.

	// OutboundProxyPort / InboundProxyPort are where captured outbound /
	// inbound TCP is redirected; 0 means Istio's 15001 / 15006.
	OutboundProxyPort, InboundProxyPort uint16
	// InboundSourcesExclude: inbound connections from these sources are not
	// captured (Linkerd's skip-subnets). IPv6 ones only apply with IPv6.
	InboundSourcesExclude []netip.Prefix
	// LoopbackUncaptured: nothing leaving over lo is captured, the proxy's
	// own connections included, and there is no passthrough source. Istio
	// instead sends the proxy's connections to its own pod over lo through
	// inbound capture.
	LoopbackUncaptured bool
	// NoReservedPorts: Istio's tunnel port (15008) and its agent's ports
	// (15020, 15021, 15090) get no exception from inbound capture.
	NoReservedPorts bool
}

// MaxSourcesExclude bounds InboundSourcesExclude: each source is a rule of
// its own in both backends (see MaxInterfaces).
const MaxSourcesExclude = 1024

// OutboundPort is the port captured outbound TCP goes to.
func (s Spec) OutboundPort() uint16 {
	if s.OutboundProxyPort != 0 {
		return s.OutboundProxyPort
	}
	return ProxyOutboundPort
}

// InboundPort is the port captured inbound TCP goes to.
func (s Spec) InboundPort() uint16 {
	if s.InboundProxyPort != 0 {
		return s.InboundProxyPort
	}
	return ProxyInboundPort
}

// DefaultSpec returns the capture spec a pod gets with no annotations: all
// inbound ports, all outbound ranges, outbound port 15020 excluded, proxy
// UID/GID 1337, REDIRECT mode, IPv4 only.
func DefaultSpec() Spec {
	return Spec{
		InterceptionMode:     ModeRedirect,
		InboundPorts:         PortSelector{All: true},
		OutboundIPRanges:     CIDRSelector{All: true},
		OutboundPortsExclude: []uint16{15020},
		ProxyUIDs:            []uint32{DefaultProxyID},
		ProxyGIDs:            []uint32{DefaultProxyID},
		HostIPv4LoopbackCIDR: netip.MustParsePrefix("127.0.0.1/32"),
	}
}

// FieldError is one problem with one input field. Field is the annotation
// (or flag, or spec field) name; Value the offending text.
type FieldError struct {
	Field  string
	Value  string
	Reason string
}

func (e FieldError) Error() string {
	kind := "field"
	if strings.Contains(e.Field, "/") {
		kind = "annotation"
	}
	// The value is echoed into CNI errors and log lines: bounded, so a
	// huge annotation gives a short error.
	return fmt.Sprintf("%s %s: %s %s", kind, e.Field, quote.Value(e.Value), e.Reason)
}

// MaxProblems bounds the problems a ValidationError keeps, the rest counted,
// so that neither the error nor the memory grows with a long bad annotation.
const MaxProblems = 20

// ValidationError lists every problem found in a spec at once (the first
// MaxProblems of them, and how many more there were).
type ValidationError struct {
	Problems []FieldError
	// Omitted counts the problems found beyond MaxProblems.
	Omitted int
}

func (e *ValidationError) Error() string {
	if len(e.Problems) == 1 && e.Omitted == 0 {
		return e.Problems[0].Error()
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d problems: ", len(e.Problems)+e.Omitted)
	for i, p := range e.Problems {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(p.Error())
	}
	if e.Omitted > 0 {
		fmt.Fprintf(&b, "; and %d more", e.Omitted)
	}
	return b.String()
}

// Unwrap exposes each problem to errors.Is / errors.As.
func (e *ValidationError) Unwrap() []error {
	out := make([]error, len(e.Problems))
	for i, p := range e.Problems {
		out[i] = p
	}
	return out
}

// NewValidationError keeps the first MaxProblems of list and counts the rest
// with omitted; nil when there are none.
func NewValidationError(list []FieldError, omitted int) *ValidationError {
	if len(list) == 0 && omitted == 0 {
		return nil
	}
	if len(list) > MaxProblems {
		omitted += len(list) - MaxProblems
		list = list[:MaxProblems:MaxProblems]
	}
	return &ValidationError{Problems: list, Omitted: omitted}
}

type problems struct {
	list    []FieldError
	omitted int
}

func (p *problems) add(field, value, format string, args ...any) {
	p.addErr(FieldError{Field: field, Value: value, Reason: fmt.Sprintf(format, args...)})
}

func (p *problems) addErr(fe FieldError) {
	if len(p.list) >= MaxProblems {
		p.omitted++
		return
	}
	p.list = append(p.list, fe)
}

func (p *problems) err() error {
	if ve := NewValidationError(p.list, p.omitted); ve != nil {
		return ve
	}
	return nil
}

// Validate checks a Spec built in code and returns every problem at once,
// each named by the annotation that sets the field.
func (s Spec) Validate() error {
	var ps problems
	s.validate(&ps)
	return ps.err()
}

func (s Spec) validate(ps *problems) {
	switch s.InterceptionMode {
	case ModeRedirect, ModeTProxy:
	case ModeNone:
		ps.add(AnnotationInterceptionMode, string(s.InterceptionMode), "means no capture, so there are no rules to build")
	default:
		ps.add(AnnotationInterceptionMode, string(s.InterceptionMode), "is not an interception mode (want REDIRECT or TPROXY)")
	}
	checkPorts := func(field string, ports []uint16) {
		for _, p := range ports {
			if p == 0 {
				ps.add(field, "0", "is not a port (want 1-65535)")
			}
		}
	}
	checkPorts(AnnotationIncludeInboundPorts, s.InboundPorts.Ports)
	checkPorts(AnnotationExcludeInboundPorts, s.InboundPortsExclude)
	checkPorts(AnnotationIncludeOutboundPorts, s.OutboundPorts)
	checkPorts(AnnotationExcludeOutboundPorts, s.OutboundPortsExclude)
	checkPrefixes := func(field string, ps2 []netip.Prefix) {
		for _, p := range ps2 {
			if !p.IsValid() {
				ps.add(field, p.String(), "is not a CIDR")
			}
		}
	}
	checkPrefixes(AnnotationIncludeOutboundIPRanges, s.OutboundIPRanges.Prefixes)
	checkPrefixes(AnnotationExcludeOutboundIPRanges, s.OutboundIPRangesExclude)
	checkIfaces := func(field string, names []string) {
		if len(names) > MaxInterfaces {
			ps.add(field, strings.Join(names, ","), "%s", tooManyInterfaces(len(names)))
			return
		}
		for _, n := range names {
			if why := badInterfaceName(n); why != "" {
				ps.add(field, n, "%s", why)
			}
		}
	}
	checkIfaces(AnnotationExcludeInterfaces, s.ExcludeInterfaces)
	checkIfaces(AnnotationRerouteVirtualInterfaces, s.RerouteVirtualInterfaces)
	if len(s.ProxyUIDs) == 0 {
		ps.add("proxyUIDs", "", "is empty (the proxy's own traffic would be captured)")
	}
	if len(s.ProxyGIDs) == 0 && !s.LoopbackUncaptured {
		// Istio's capture matches the proxy by group as well as by user;
		// Linkerd's needs only the user (its GID is optional).
		ps.add("proxyGIDs", "", "is empty (the proxy's own traffic would be captured)")
	}
	if len(s.InboundSourcesExclude) > MaxSourcesExclude {
		ps.add("inboundSourcesExclude", join(s.InboundSourcesExclude[:MaxSourcesExclude], ","),
			"names %d sources, more than the %d nftmesh takes (each is a rule of its own)", len(s.InboundSourcesExclude), MaxSourcesExclude)
	}
	checkPrefixes("inboundSourcesExclude", s.InboundSourcesExclude)
	if !s.HostIPv4LoopbackCIDR.IsValid() || !s.HostIPv4LoopbackCIDR.Addr().Is4() {
		ps.add("hostIPv4LoopbackCIDR", s.HostIPv4LoopbackCIDR.String(), "is not an IPv4 CIDR")
	} else if !s.HostIPv4LoopbackCIDR.Addr().IsLoopback() {
		ps.add("hostIPv4LoopbackCIDR", s.HostIPv4LoopbackCIDR.String(), "is not inside 127.0.0.0/8")
	}
}

// MaxInterfaces bounds each interface list (excludeInterfaces,
// reroute-virtual-interfaces). Unlike ports and CIDRs, which are set
// elements, each name is a rule of its own (two, or four in TPROXY mode, for
// an excluded one) in both backends, and the kernel's rule dump, which CHECK
// reads, slows with the square of a chain's rules: the 44,000 names a pod's
// 256 KiB of annotations can hold made an nftables CHECK take 8 s. A pod
// has a few interfaces; at the limit, ~7,000 rules, each verb takes well
// under a second (scenarios.Large).
const MaxInterfaces = 1024

func tooManyInterfaces(n int) string {
	return fmt.Sprintf("names %d interfaces, more than the %d nftmesh takes (each is a rule of its own)", n, MaxInterfaces)
}

// badInterfaceName returns why name cannot be a Linux interface name (or an
// iptables-style "prefix+" wildcard), or "". A bare "+" (every interface) is
// refused, as Istio refuses it: that is not capture, and nftables has no
// operand for an empty prefix, so the two backends could not agree on it.
func badInterfaceName(name string) string {
	base := strings.TrimSuffix(name, "+")
	switch {
	case name == "":
		return "is not an interface name (empty)"
	case name == "+":
		return "is a wildcard for every interface, not an interface name (a wildcard needs a prefix, e.g. eth+)"
	case len(base) > 15:
		return "is not an interface name (longer than 15 bytes)"
	case base == "." || base == "..":
		return "is not an interface name"
	case strings.ContainsAny(base, "/ \t\n\"*+:"):
		return "is not an interface name (contains a space, '/', ':', '*', '+' or quote)"
	}
	for _, r := range base {
		if r < 0x21 || r > 0x7e {
			return "is not an interface name (non-printable or non-ASCII character)"
		}
	}
	return ""
}

// join renders each element of xs as %v does, separated by sep.
func join[T any](xs []T, sep string) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = fmt.Sprint(x)
	}
	return strings.Join(s, sep)
}

// dedup returns s without repeated elements, keeping first occurrences.
func dedup[T comparable](s []T) []T {
	out := make([]T, 0, len(s))
	seen := make(map[T]struct{}, len(s))
	for _, v := range s {
		if _, dup := seen[v]; !dup {
			seen[v] = struct{}{}
			out = append(out, v)
		}
	}
	return out
}
