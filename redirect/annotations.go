package redirect

import (
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// Pod annotations that shape the capture, with Istio's names.
const (
	AnnotationInterceptionMode         = "sidecar.istio.io/interceptionMode"
	AnnotationIncludeInboundPorts      = "traffic.sidecar.istio.io/includeInboundPorts"
	AnnotationExcludeInboundPorts      = "traffic.sidecar.istio.io/excludeInboundPorts"
	AnnotationIncludeOutboundIPRanges  = "traffic.sidecar.istio.io/includeOutboundIPRanges"
	AnnotationExcludeOutboundIPRanges  = "traffic.sidecar.istio.io/excludeOutboundIPRanges"
	AnnotationIncludeOutboundPorts     = "traffic.sidecar.istio.io/includeOutboundPorts"
	AnnotationExcludeOutboundPorts     = "traffic.sidecar.istio.io/excludeOutboundPorts"
	AnnotationExcludeInterfaces        = "traffic.sidecar.istio.io/excludeInterfaces"
	AnnotationRerouteVirtualInterfaces = "istio.io/reroute-virtual-interfaces"
	// AnnotationKubevirtInterfaces is the deprecated name of
	// AnnotationRerouteVirtualInterfaces, read when the new one is absent.
	AnnotationKubevirtInterfaces = "traffic.sidecar.istio.io/kubevirtInterfaces"
	AnnotationSidecarStatus      = "sidecar.istio.io/status"
	AnnotationInject             = "sidecar.istio.io/inject"
)

// CaptureAnnotations lists the annotations ParseAnnotations reads, in a
// stable order (for help texts and fuzzing).
var CaptureAnnotations = []string{
	AnnotationInterceptionMode,
	AnnotationIncludeInboundPorts,
	AnnotationExcludeInboundPorts,
	AnnotationIncludeOutboundIPRanges,
	AnnotationExcludeOutboundIPRanges,
	AnnotationIncludeOutboundPorts,
	AnnotationExcludeOutboundPorts,
	AnnotationExcludeInterfaces,
	AnnotationRerouteVirtualInterfaces,
	AnnotationKubevirtInterfaces,
}

// ParseAnnotations applies a pod's capture annotations over base (usually
// DefaultSpec with the proxy container's settings), ignoring unknown ones,
// and reports every problem at once in a *ValidationError (the Spec is then
// not to be used).
func ParseAnnotations(base Spec, annotations map[string]string) (Spec, error) {
	s := base
	var ps problems

	if v, ok := annotations[AnnotationInterceptionMode]; ok {
		s.InterceptionMode = InterceptionMode(strings.TrimSpace(v))
	}
	if v, ok := annotations[AnnotationIncludeInboundPorts]; ok {
		s.InboundPorts = parsePortSelector(&ps, AnnotationIncludeInboundPorts, v, true)
	}
	if v, ok := annotations[AnnotationExcludeInboundPorts]; ok {
		s.InboundPortsExclude = parsePortSelector(&ps, AnnotationExcludeInboundPorts, v, false).Ports
	}
	if v, ok := annotations[AnnotationIncludeOutboundIPRanges]; ok {
		s.OutboundIPRanges = parseCIDRSelector(&ps, AnnotationIncludeOutboundIPRanges, v, true)
	}
	if v, ok := annotations[AnnotationExcludeOutboundIPRanges]; ok {
		s.OutboundIPRangesExclude = parseCIDRSelector(&ps, AnnotationExcludeOutboundIPRanges, v, false).Prefixes
	}
	if v, ok := annotations[AnnotationIncludeOutboundPorts]; ok {
		s.OutboundPorts = parsePortSelector(&ps, AnnotationIncludeOutboundPorts, v, false).Ports
	}
	if v, ok := annotations[AnnotationExcludeOutboundPorts]; ok {
		// Replaces the default 15020 rather than adding to it, as Istio does.
		s.OutboundPortsExclude = parsePortSelector(&ps, AnnotationExcludeOutboundPorts, v, false).Ports
	}
	if v, ok := annotations[AnnotationExcludeInterfaces]; ok {
		s.ExcludeInterfaces = parseInterfaces(&ps, AnnotationExcludeInterfaces, v)
	}
	if v, ok := annotations[AnnotationRerouteVirtualInterfaces]; ok {
		s.RerouteVirtualInterfaces = parseInterfaces(&ps, AnnotationRerouteVirtualInterfaces, v)
	} else if v, ok := annotations[AnnotationKubevirtInterfaces]; ok {
		s.RerouteVirtualInterfaces = parseInterfaces(&ps, AnnotationKubevirtInterfaces, v)
	}

	// Fields set from annotations were checked while parsing; check the rest
	// (mode, base values) without repeating problems already reported.
	var rest problems
	s.validate(&rest)
	for _, p := range rest.list {
		if !slices.ContainsFunc(ps.list, func(q FieldError) bool { return q.Field == p.Field }) {
			ps.addErr(p)
		}
	}
	return s, ps.err()
}

// WantsNoCapture reports whether a pod's annotations ask for no interception
// (interceptionMode NONE, spelled as Istio's injector compares it, spaces
// aside). Such a pod gets no rules, like a pod without a sidecar, rather
// than an error for an invalid mode.
func WantsNoCapture(annotations map[string]string) bool {
	v, ok := annotations[AnnotationInterceptionMode]
	return ok && InterceptionMode(strings.TrimSpace(v)) == ModeNone
}

// splitList splits a comma-separated annotation value, trimming spaces and
// dropping empty items (so "80, 443," is two ports).
func splitList(v string) []string {
	var out []string
	for _, f := range strings.Split(v, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// parseSelector parses a comma-separated list whose items parse converts
// (reporting its own problems), or, where wildcard allows it, the single
// item "*" (all). what names the items in the problem about mixing them
// with "*". Items are deduplicated; with "*" there are none.
func parseSelector[T comparable](ps *problems, field, v string, wildcard bool, what string, parse func(item string) (T, bool)) (all bool, out []T) {
	items := splitList(v)
	for _, item := range items {
		if item == "*" {
			switch {
			case !wildcard:
				ps.add(field, v, "uses '*', which this annotation does not allow")
			case len(items) > 1:
				ps.add(field, v, "mixes '*' with %s; use '*' alone", what)
			default:
				all = true
			}
			continue
		}
		if x, ok := parse(item); ok {
			out = append(out, x)
		}
	}
	if all {
		return true, nil
	}
	return false, dedup(out)
}

func parsePortSelector(ps *problems, field, v string, wildcard bool) PortSelector {
	all, ports := parseSelector(ps, field, v, wildcard, "ports", func(item string) (uint16, bool) {
		n, err := strconv.ParseUint(item, 10, 32)
		if err != nil || n < 1 || n > 65535 {
			ps.add(field, item, "is not a port (want 1-65535)")
			return 0, false
		}
		return uint16(n), true
	})
	return PortSelector{All: all, Ports: ports}
}

func parseCIDRSelector(ps *problems, field, v string, wildcard bool) CIDRSelector {
	all, prefixes := parseSelector(ps, field, v, wildcard, "CIDRs", func(item string) (netip.Prefix, bool) {
		p, err := netip.ParsePrefix(item)
		if err != nil {
			if _, aerr := netip.ParseAddr(item); aerr == nil {
				ps.add(field, item, "is not a CIDR (missing prefix length, e.g. /32)")
			} else {
				ps.add(field, item, "is not a CIDR")
			}
			return netip.Prefix{}, false
		}
		if p.Addr().Zone() != "" {
			ps.add(field, item, "is not a CIDR (has an IPv6 zone)")
			return netip.Prefix{}, false
		}
		// 10.1.2.3/8 means 10.0.0.0/8, as iptables reads it.
		return p.Masked(), true
	})
	return CIDRSelector{All: all, Prefixes: prefixes}
}

func parseInterfaces(ps *problems, field, v string) []string {
	var out []string
	for _, item := range splitList(v) {
		if why := badInterfaceName(item); why != "" {
			ps.add(field, item, "%s", why)
			continue
		}
		out = append(out, item)
	}
	out = dedup(out)
	if len(out) > MaxInterfaces {
		// Reported here, under the annotation used (kubevirtInterfaces
		// too), and not again by validate.
		ps.add(field, v, "%s", tooManyInterfaces(len(out)))
		return nil
	}
	return out
}
