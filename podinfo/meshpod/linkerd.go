package meshpod

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/nftmesh/nftmesh/redirect"
	"github.com/nftmesh/nftmesh/redirect/quote"
)

// Linkerd's container names, label and annotations, as linkerd-cni reads
// them.
const (
	LinkerdProxyContainer = "linkerd-proxy"
	LinkerdInitContainer  = "linkerd-init"

	// LabelLinkerdControlPlane marks Linkerd's control plane pods, whose
	// outbound connections to the API server are never captured.
	LabelLinkerdControlPlane = "linkerd.io/control-plane-component"

	AnnotationLinkerdSkipInboundPorts  = "config.linkerd.io/skip-inbound-ports"
	AnnotationLinkerdSkipOutboundPorts = "config.linkerd.io/skip-outbound-ports"
	AnnotationLinkerdSkipSubnets       = "config.linkerd.io/skip-subnets"
	AnnotationLinkerdProxyUID          = "config.linkerd.io/proxy-uid"
	AnnotationLinkerdProxyGID          = "config.linkerd.io/proxy-gid"
)

// LinkerdOverrides are the annotations a pod, or else its namespace, can
// set to override the node's Linkerd settings.
var LinkerdOverrides = []string{
	AnnotationLinkerdSkipOutboundPorts, AnnotationLinkerdSkipInboundPorts,
	AnnotationLinkerdSkipSubnets, AnnotationLinkerdProxyUID, AnnotationLinkerdProxyGID,
}

// Reasons of the Linkerd decision (see the Istio ones in meshpod.go).
const (
	ReasonLinkerdInit    = "linkerd-init container present"
	ReasonLinkerdInMesh  = "injected linkerd-proxy"
	ReasonBothProxies    = "both istio-proxy and linkerd-proxy"
	ReasonLinkerdInvalid = "invalid linkerd capture settings"
)

// Mesh names, as the CLI and the logs say them.
const (
	MeshIstio   = "istio"
	MeshLinkerd = "linkerd"
)

// MeshOf names the mesh whose rules a decision's reason stands for.
func MeshOf(reason string) string {
	switch reason {
	case ReasonLinkerdInit, ReasonLinkerdInMesh, ReasonLinkerdInvalid:
		return MeshLinkerd
	}
	return MeshIstio
}

// LinkerdConfig is the node's Linkerd settings: linkerd-cni's `linkerd`
// conflist keys, with its names, so that an entry copied from linkerd-cni's
// conflist means the same here.
type LinkerdConfig struct {
	IncomingProxyPort     int      `json:"incoming-proxy-port"`
	OutgoingProxyPort     int      `json:"outgoing-proxy-port"`
	ProxyUID              int      `json:"proxy-uid"`
	ProxyGID              int      `json:"proxy-gid"`
	PortsToRedirect       []int    `json:"ports-to-redirect,omitempty"`
	InboundPortsToIgnore  []string `json:"inbound-ports-to-ignore,omitempty"`
	OutboundPortsToIgnore []string `json:"outbound-ports-to-ignore,omitempty"`
	SubnetsToIgnore       []string `json:"subnets-to-ignore,omitempty"`
	IPv6                  bool     `json:"ipv6"`
}

// UnmarshalJSON reads an entry over DefaultLinkerd: a key left out keeps
// its default (linkerd-cni would read it as 0, a port no proxy listens on).
func (c *LinkerdConfig) UnmarshalJSON(b []byte) error {
	type plain LinkerdConfig
	d := plain(DefaultLinkerd())
	if err := json.Unmarshal(b, &d); err != nil {
		return err
	}
	*c = LinkerdConfig(d)
	return nil
}

// DefaultLinkerd is what linkerd2-cni's chart writes with its default
// values: the proxy on 4143 (inbound) and 4140 (outbound) as UID 2102, no
// GID, the proxy's control and admin ports (4190, 4191) never captured
// inbound, IPv4 only.
func DefaultLinkerd() LinkerdConfig {
	return LinkerdConfig{
		IncomingProxyPort:    4143,
		OutgoingProxyPort:    4140,
		ProxyUID:             2102,
		ProxyGID:             -1,
		InboundPortsToIgnore: []string{"4190", "4191"},
	}
}

// MaxLinkerdPorts bounds the ports one port list names once its ranges are
// expanded: the iptables backend writes a rule per port.
const MaxLinkerdPorts = 4096

// linkerdProxy reports whether pod has a linkerd-proxy container (a native
// sidecar counts) and whether it has a linkerd-init init container.
func linkerdProxy(pod *Pod) (proxy, init bool) {
	for _, c := range pod.InitContainers {
		switch c.Name {
		case LinkerdInitContainer:
			init = true
		case LinkerdProxyContainer:
			proxy = true
		}
	}
	for _, c := range pod.Containers {
		if c.Name == LinkerdProxyContainer {
			proxy = true
		}
	}
	return proxy, init
}

func hasIstioProxy(pod *Pod) bool {
	for _, list := range [][]Container{pod.InitContainers, pod.Containers} {
		for _, c := range list {
			if c.Name == ProxyContainer {
				return true
			}
		}
	}
	return false
}

// LinkerdNeedsNamespace reports whether deciding pod needs its namespace's
// annotations: a Linkerd pod lacking one of the overrides itself (as
// linkerd-cni, which then reads the namespace).
func LinkerdNeedsNamespace(pod *Pod) bool {
	if pod == nil || pod.NamespaceAnnotations != nil {
		return false
	}
	if proxy, init := linkerdProxy(pod); !proxy || init {
		return false
	}
	for _, k := range LinkerdOverrides {
		if pod.Annotations[k] == "" {
			return true
		}
	}
	return false
}

// LinkerdNeedsAPIServerPorts reports whether deciding pod needs the API
// server's ports: a Linkerd control plane pod, with them not yet known.
func LinkerdNeedsAPIServerPorts(pod *Pod) bool {
	if pod == nil || pod.APIServerPorts != nil || pod.Labels[LabelLinkerdControlPlane] == "" {
		return false
	}
	proxy, init := linkerdProxy(pod)
	return proxy && !init
}

// decideLinkerd is Decide for a pod with a linkerd-proxy container, as
// linkerd-cni decides: a linkerd-init init container means the pod
// redirects itself; otherwise the node's settings, overridden by the pod's
// or else its namespace's annotations. A pod that also has an istio-proxy
// is refused: two proxies cannot both own its traffic.
func decideLinkerd(pod *Pod, init bool) (bool, string, redirect.Spec, error) {
	if hasIstioProxy(pod) {
		return true, ReasonBothProxies, redirect.Spec{}, fmt.Errorf("pod %s has both an %s and a %s container: nftmesh captures a pod for one mesh only",
			quote.TextN(pod.Namespace+"/"+pod.Name, quote.MaxValue), ProxyContainer, LinkerdProxyContainer)
	}
	if init {
		return false, ReasonLinkerdInit, redirect.Spec{}, nil
	}
	cfg := DefaultLinkerd()
	if pod.Linkerd != nil {
		cfg = *pod.Linkerd
	}
	spec, err := LinkerdSpec(cfg, pod)
	if err != nil {
		return true, ReasonLinkerdInvalid, redirect.Spec{}, fmt.Errorf("reading linkerd capture settings of pod %s: %w", quote.TextN(pod.Namespace+"/"+pod.Name, quote.MaxValue), err)
	}
	return true, ReasonLinkerdInMesh, spec, nil
}

// linkerdOverride is an annotation's value on the pod, else on its
// namespace; empty values count as absent, as in linkerd-cni.
func linkerdOverride(pod *Pod, key string) string {
	if v := pod.Annotations[key]; v != "" {
		return v
	}
	return pod.NamespaceAnnotations[key]
}

// LinkerdSpec is the capture spec of a Linkerd pod on a node with cfg.
// The outbound skip ports and the subnets of an annotation replace the
// node's, its inbound skip ports add to them (linkerd-cni's precedence).
// Every problem comes back at once as a *redirect.ValidationError.
func LinkerdSpec(cfg LinkerdConfig, pod *Pod) (redirect.Spec, error) {
	var ps []redirect.FieldError
	field := func(name string) string { return "linkerd " + name }
	inIgnore := portList(&ps, field("inbound-ports-to-ignore"), cfg.InboundPortsToIgnore)
	outIgnore := portList(&ps, field("outbound-ports-to-ignore"), cfg.OutboundPortsToIgnore)
	subnetsField, subnets := field("subnets-to-ignore"), cfg.SubnetsToIgnore
	uid, gid := cfg.ProxyUID, cfg.ProxyGID
	uidField, gidField := field("proxy-uid"), field("proxy-gid")
	if v := linkerdOverride(pod, AnnotationLinkerdSkipOutboundPorts); v != "" {
		outIgnore = portList(&ps, AnnotationLinkerdSkipOutboundPorts, strings.Split(v, ","))
	}
	if v := linkerdOverride(pod, AnnotationLinkerdSkipInboundPorts); v != "" {
		inIgnore = append(inIgnore, portList(&ps, AnnotationLinkerdSkipInboundPorts, strings.Split(v, ","))...)
	}
	if v := linkerdOverride(pod, AnnotationLinkerdSkipSubnets); v != "" {
		subnetsField, subnets = AnnotationLinkerdSkipSubnets, strings.Split(v, ",")
	}
	if v := linkerdOverride(pod, AnnotationLinkerdProxyUID); v != "" {
		uidField, uid = AnnotationLinkerdProxyUID, atoiField(&ps, AnnotationLinkerdProxyUID, v)
	}
	if v := linkerdOverride(pod, AnnotationLinkerdProxyGID); v != "" {
		gidField, gid = AnnotationLinkerdProxyGID, atoiField(&ps, AnnotationLinkerdProxyGID, v)
	}
	if pod.Labels[LabelLinkerdControlPlane] != "" {
		api := pod.APIServerPorts
		if api == nil {
			api = []string{"443", "6443"}
		}
		outIgnore = append(outIgnore, portList(&ps, "kubernetes service ports", api)...)
	}
	spec := redirect.Spec{
		InterceptionMode:      redirect.ModeRedirect,
		InboundPorts:          redirect.PortSelector{All: true},
		InboundPortsExclude:   inIgnore,
		OutboundIPRanges:      redirect.CIDRSelector{All: true},
		OutboundPortsExclude:  outIgnore,
		IPv6:                  cfg.IPv6,
		HostIPv4LoopbackCIDR:  netip.MustParsePrefix("127.0.0.1/32"),
		InboundProxyPort:      proxyPort(&ps, field("incoming-proxy-port"), cfg.IncomingProxyPort),
		OutboundProxyPort:     proxyPort(&ps, field("outgoing-proxy-port"), cfg.OutgoingProxyPort),
		InboundSourcesExclude: subnetList(&ps, subnetsField, subnets),
		LoopbackUncaptured:    true,
		NoReservedPorts:       true,
	}
	linkerdOwners(&ps, &spec, uidField, uid, gidField, gid)
	if len(cfg.PortsToRedirect) > 0 {
		spec.InboundPorts = redirect.PortSelector{Ports: redirectPorts(&ps, cfg.PortsToRedirect, inIgnore)}
	}
	if err := spec.Validate(); err != nil {
		if ve, ok := err.(*redirect.ValidationError); ok {
			ps = append(ps, ve.Problems...)
		}
	}
	if ve := redirect.NewValidationError(ps, 0); ve != nil {
		return redirect.Spec{}, ve
	}
	return spec, nil
}

// linkerdOwners sets the proxy's UID (required: without it the proxy's own
// connections would loop back to it) and GID (optional: linkerd-cni writes
// no GID rule for one below 1).
func linkerdOwners(ps *[]redirect.FieldError, spec *redirect.Spec, uidField string, uid int, gidField string, gid int) {
	const maxID = 1<<32 - 1
	if uid < 1 || uid > maxID {
		*ps = append(*ps, redirect.FieldError{Field: uidField, Value: strconv.Itoa(uid),
			Reason: "is not a proxy user id (want 1-4294967295: the proxy's own connections must be told apart)"})
	} else {
		spec.ProxyUIDs = []uint32{uint32(uid)}
	}
	if gid > maxID {
		*ps = append(*ps, redirect.FieldError{Field: gidField, Value: strconv.Itoa(gid), Reason: "is not a group id (want at most 4294967295)"})
	} else if gid > 0 {
		spec.ProxyGIDs = []uint32{uint32(gid)}
	}
}

// redirectPorts is ports-to-redirect without the inbound ports to ignore,
// which linkerd-cni checks first.
func redirectPorts(ps *[]redirect.FieldError, ports []int, ignore []uint16) []uint16 {
	skip := map[uint16]bool{}
	for _, p := range ignore {
		skip[p] = true
	}
	var out []uint16
	for _, p := range ports {
		if p < 1 || p > 65535 {
			*ps = append(*ps, redirect.FieldError{Field: "linkerd ports-to-redirect", Value: strconv.Itoa(p), Reason: "is not a port (want 1-65535)"})
			continue
		}
		if !skip[uint16(p)] {
			out = append(out, uint16(p))
		}
	}
	return out
}

func proxyPort(ps *[]redirect.FieldError, field string, p int) uint16 {
	if p < 1 || p > 65535 {
		*ps = append(*ps, redirect.FieldError{Field: field, Value: strconv.Itoa(p), Reason: "is not a port (want 1-65535)"})
		return 0
	}
	return uint16(p)
}

func atoiField(ps *[]redirect.FieldError, field, v string) int {
	n, err := strconv.Atoi(v)
	if err != nil {
		*ps = append(*ps, redirect.FieldError{Field: field, Value: v, Reason: "is not an integer"})
	}
	return n
}

// portList reads ports and inclusive ranges ("8100-8102"), expanded.
// Unlike linkerd-cni, which logs a bad entry and leaves it out, a bad entry
// is an error: a port the user meant to skip would otherwise be captured.
func portList(ps *[]redirect.FieldError, field string, entries []string) []uint16 {
	var out []uint16
	for _, e := range entries {
		lo, hi, why := portRange(e)
		if why != "" {
			*ps = append(*ps, redirect.FieldError{Field: field, Value: e, Reason: why})
			continue
		}
		if len(out)+hi-lo+1 > MaxLinkerdPorts {
			*ps = append(*ps, redirect.FieldError{Field: field, Value: e,
				Reason: fmt.Sprintf("takes the list past %d ports, more than nftmesh takes (the iptables backend writes a rule per port)", MaxLinkerdPorts)})
			return out
		}
		for p := lo; p <= hi; p++ {
			out = append(out, uint16(p))
		}
	}
	return out
}

// portRange parses "N" or "LOW-HIGH" (inclusive), each 1-65535.
func portRange(e string) (lo, hi int, why string) {
	low, high, isRange := strings.Cut(e, "-")
	if !isRange {
		high = low
	}
	var err error
	if lo, err = strconv.Atoi(low); err != nil || lo < 1 || lo > 65535 {
		return 0, 0, "is not a port or port range (want N or LOW-HIGH, each 1-65535)"
	}
	if hi, err = strconv.Atoi(high); err != nil || hi < 1 || hi > 65535 {
		return 0, 0, "is not a port or port range (want N or LOW-HIGH, each 1-65535)"
	}
	if hi < lo {
		return 0, 0, "is not a port range (its upper bound is below its lower bound)"
	}
	return lo, hi, ""
}

// subnetList reads CIDRs, spaces around each allowed (as linkerd-cni).
func subnetList(ps *[]redirect.FieldError, field string, entries []string) []netip.Prefix {
	var out []netip.Prefix
	for _, e := range entries {
		p, err := netip.ParsePrefix(strings.TrimSpace(e))
		if err != nil {
			*ps = append(*ps, redirect.FieldError{Field: field, Value: e, Reason: "is not a CIDR (want e.g. 10.0.0.0/8)"})
			continue
		}
		out = append(out, p.Masked())
	}
	return out
}
