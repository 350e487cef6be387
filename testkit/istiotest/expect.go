package istiotest

import (
	"net/netip"
	"slices"

	"github.com/nftmesh/nftmesh/redirect"
)

// Excludes says whether an injected pod's capture spec sends outbound
// traffic to a leaves past the proxy (an excluded range): what the
// injected-pod tests expect, worked out from the spec, not the rules.
func Excludes(s redirect.Spec, a netip.Addr) bool {
	for _, p := range s.OutboundIPRangesExclude {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// CapturesInbound says whether the spec sends inbound traffic to port to
// the proxy.
func CapturesInbound(s redirect.Spec, port uint16) bool {
	if s.InboundPorts.All {
		return !slices.Contains(s.InboundPortsExclude, port)
	}
	return slices.Contains(s.InboundPorts.Ports, port)
}
