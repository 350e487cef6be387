package nettest

import (
	"net/netip"
	"testing"

	"github.com/nftmesh/nftmesh/netlab"
	"github.com/nftmesh/nftmesh/testkit/scenarios"
)

func TestHostsLieInScenarioRanges(t *testing.T) {
	for _, c := range []struct {
		host  netip.Addr
		cidr  string
		in    bool
		other []string
	}{
		{netlab.ExcludedV4Host, scenarios.ExcludedV4, true, []string{scenarios.IncludedV4}},
		{netlab.ExcludedV6Host, scenarios.ExcludedV6, true, []string{scenarios.IncludedV6}},
		{netlab.IncludedV4Host, scenarios.IncludedV4, true, []string{scenarios.ExcludedV4}},
		{netlab.IncludedV6Host, scenarios.IncludedV6, true, []string{scenarios.ExcludedV6}},
		{netlab.OtherV4Host, scenarios.ExcludedV4, false, []string{scenarios.IncludedV4}},
		{netlab.OtherV6Host, scenarios.ExcludedV6, false, []string{scenarios.IncludedV6}},
	} {
		if got := netip.MustParsePrefix(c.cidr).Contains(c.host); got != c.in {
			t.Errorf("%s in %s = %v, want %v", c.host, c.cidr, got, c.in)
		}
		for _, o := range c.other {
			if netip.MustParsePrefix(o).Contains(c.host) {
				t.Errorf("%s must not be in %s", c.host, o)
			}
		}
	}
}

// TestExpectations pins the oracle's answer for the probes that tell the
// scenarios apart, each checked by hand against Istio's annotation semantics
// and the chains its istio-iptables writes.
func TestExpectations(t *testing.T) {
	ap := netip.AddrPortFrom
	peer := func(a netip.Addr, port uint16) string { return netlab.PeerListener(ap(a, port)) }
	// A dual-stack pod whose sidecar is not dual-stack: IPv4 only.
	v4Sidecar := map[string]string{
		"app→other-v4:80":            netlab.ListenerOutbound,
		"app→other-v6:80":            peer(netlab.OtherV6Host, 80), // no IPv6 rules: straight out
		"app→included-v6:80":         peer(netlab.IncludedV6Host, 80),
		"peer→pod-v4:8080":           netlab.ListenerInbound,
		"peer→pod-v6:8080":           netlab.AppListener(8080), // straight to the app
		"app→pod-v6:8080 (lo)":       netlab.AppListener(8080),
		"proxy-uid→pod-v6:8080 (lo)": netlab.AppListener(8080),
		"proxy-uid→pod-v4:8080 (lo)": netlab.ListenerInbound,
	}
	want := map[string]map[string]string{
		"ipv4-only-dual-stack-sidecar": {
			"app→other-v4:80":  netlab.ListenerOutbound,
			"peer→pod-v4:8080": netlab.ListenerInbound,
		},
		"dual-stack-ipv4-sidecar":            v4Sidecar,
		"dual-stack-ipv6-first-ipv4-sidecar": v4Sidecar,
		"ipv6-only": {
			"app→other-v6:80":            netlab.ListenerOutbound,
			"app→other-v6:53/udp":        peer(netlab.OtherV6Host, 53),
			"peer→pod-v6:8080":           netlab.ListenerInbound,
			"peer→pod-v6:8081":           netlab.ListenerInbound,
			"passthrough→pod-v6:8080":    netlab.AppListener(8080),
			"proxy-uid→pod-v6:8080 (lo)": netlab.ListenerInbound,
			"app→127.0.0.2:8080 (lo)":    netlab.AppListener(8080),
			"validation→127.0.0.6:15002": netlab.ListenerInbound,
			"validation-v6→[::6]:15002":  netlab.LandedRefused,
		},
		"defaults": {
			"app→other-v4:80":             netlab.ListenerOutbound,
			"app→other-v6:80":             netlab.ListenerOutbound,
			"app→other-v4:15020":          peer(netlab.OtherV4Host, 15020), // default excludeOutboundPorts
			"proxy-uid→other-v4:80":       peer(netlab.OtherV4Host, 80),
			"proxy-gid→other-v4:80":       peer(netlab.OtherV4Host, 80),
			"app→other-v4:53/udp":         peer(netlab.OtherV4Host, 53), // UDP not captured without DNS capture
			"app→other-v4:53/tcp":         netlab.ListenerOutbound,
			"peer→pod-v4:8080":            netlab.ListenerInbound,
			"peer→pod-v4:15008":           netlab.AppListener(15008),
			"peer→pod-v4:15021":           netlab.AppListener(15021),
			"passthrough→pod-v4:8080":     netlab.AppListener(8080),
			"app→pod-v4:8080 (lo)":        netlab.AppListener(8080),
			"app→127.0.0.2:8080 (lo)":     netlab.AppListener(8080),
			"proxy-uid→pod-v4:8080 (lo)":  netlab.ListenerInbound,
			"proxy-gid→pod-v4:8080 (lo)":  netlab.AppListener(8080), // the uid triple's "! --uid-owner" RETURN comes first
			"proxy-uid→pod-v4:15008 (lo)": netlab.AppListener(15008),
			"validation→127.0.0.6:15002":  netlab.ListenerInbound,
			"validation-v6→[::6]:15002":   netlab.LandedRefused,
		},
		"ipv4-only": {
			"app→other-v4:80":            netlab.ListenerOutbound,
			"peer→pod-v4:8080":           netlab.ListenerInbound,
			"validation→127.0.0.6:15002": netlab.ListenerInbound,
		},
		"include-inbound-ports": {
			"peer→pod-v4:8080": netlab.ListenerInbound,
			"peer→pod-v4:9090": netlab.ListenerInbound,
			"peer→pod-v4:8081": netlab.AppListener(8081),
			"peer→pod-v4:9091": netlab.AppListener(9091), // excludes are ignored with a list
		},
		"exclude-inbound-ports": {
			"peer→pod-v4:8080":  netlab.ListenerInbound,
			"peer→pod-v4:8081":  netlab.AppListener(8081),
			"peer→pod-v6:8081":  netlab.AppListener(8081),
			"peer→pod-v4:15020": netlab.AppListener(15020),
		},
		"no-inbound": {
			"peer→pod-v4:8080":           netlab.AppListener(8080),
			"app→other-v4:80":            netlab.ListenerOutbound,
			"proxy-uid→pod-v4:8080 (lo)": netlab.ListenerInbound, // outbound rules still send it to 15006
		},
		"exclude-cidrs": {
			"app→excluded-v4:80": peer(netlab.ExcludedV4Host, 80),
			"app→excluded-v6:80": peer(netlab.ExcludedV6Host, 80),
			"app→other-v4:80":    netlab.ListenerOutbound,
		},
		"include-cidrs": {
			"app→included-v4:80":      netlab.ListenerOutbound,
			"app→included-v6:80":      netlab.ListenerOutbound,
			"app→other-v4:80":         peer(netlab.OtherV4Host, 80),
			"app→other-v6:80":         peer(netlab.OtherV6Host, 80),
			"app→127.0.0.2:8080 (lo)": netlab.AppListener(8080),
		},
		"include-loopback-cidr": {
			"app→127.0.0.2:8080 (lo)":    netlab.ListenerOutbound, // no app-to-app bypass any more
			"app→pod-v4:8080 (lo)":       netlab.AppListener(8080),
			"app→included-v4:80":         netlab.ListenerOutbound,
			"app→other-v4:80":            peer(netlab.OtherV4Host, 80),
			"proxy-uid→pod-v4:8080 (lo)": netlab.ListenerInbound,
		},
		"include-outbound-ports": {
			"app→other-v4:5432": netlab.ListenerOutbound,
			"app→other-v6:5432": netlab.ListenerOutbound,
			"app→other-v4:80":   peer(netlab.OtherV4Host, 80),
		},
		"exclude-outbound-ports": {
			"app→other-v4:3306":  peer(netlab.OtherV4Host, 3306),
			"app→other-v6:3306":  peer(netlab.OtherV6Host, 3306),
			"app→other-v4:15020": netlab.ListenerOutbound, // the default 15020 is replaced
		},
		"custom-uid-gid": {
			"proxy-uid→other-v4:80":      peer(netlab.OtherV4Host, 80),
			"proxy-gid→other-v4:80":      peer(netlab.OtherV4Host, 80),
			"uid-1337→other-v4:80":       netlab.ListenerOutbound,
			"gid-1337→other-v4:80":       netlab.ListenerOutbound,
			"uid-1337→pod-v4:8080 (lo)":  netlab.AppListener(8080),
			"validation→127.0.0.6:15002": netlab.ListenerInbound,
		},
		"dns-capture": {
			"app→other-v4:53/udp":       netlab.ListenerDNS,
			"app→other-v6:53/udp":       netlab.ListenerDNS,
			"app→other-v4:53/tcp":       netlab.ListenerDNS,
			"proxy-uid→other-v4:53/udp": peer(netlab.OtherV4Host, 53),
			"app→other-v4:80":           netlab.ListenerOutbound,
		},
		"tproxy": {
			"peer→pod-v4:8080":            netlab.ListenerInbound,
			"peer→pod-v6:8080":            netlab.ListenerInbound,
			"peer→pod-v4:15008":           netlab.ListenerInbound, // TPROXY does not exclude 15008
			"peer→pod-v4:15020":           netlab.AppListener(15020),
			"passthrough→pod-v4:8080":     netlab.AppListener(8080),
			"app→pod-v4:8080 (lo)":        netlab.AppListener(8080),
			"proxy-gid→pod-v4:8080 (lo)":  netlab.ListenerInbound, // marked 1338, then TPROXYed
			"proxy-uid→pod-v4:15008 (lo)": netlab.ListenerInbound,
		},
		"tproxy-include-ports": {
			"peer→pod-v4:8080":  netlab.ListenerInbound,
			"peer→pod-v4:8081":  netlab.AppListener(8081),
			"peer→pod-v4:15008": netlab.AppListener(15008),
		},
		"exclude-interfaces": {
			"app→other-v4:80":            peer(netlab.OtherV4Host, 80),
			"peer→pod-v4:8080":           netlab.AppListener(8080),
			"proxy-uid→pod-v4:8080 (lo)": netlab.ListenerInbound,
			"validation→127.0.0.6:15002": netlab.ListenerInbound,
		},
		"reroute-interfaces": {
			"peer→pod-v4:8080":       netlab.ListenerOutbound,
			"peer→through-pod-v4:80": netlab.ListenerOutbound,
			"peer→through-pod-v6:80": netlab.ListenerOutbound,
			"app→other-v4:80":        netlab.ListenerOutbound,
		},
		"drop-invalid": {
			"app→other-v4:80":  netlab.ListenerOutbound,
			"peer→pod-v4:8080": netlab.ListenerInbound,
		},
	}
	for _, sc := range scenarios.All {
		t.Run(sc.Name, func(t *testing.T) {
			spec, err := sc.Spec()
			if err != nil {
				t.Fatal(err)
			}
			o := TopologyOptionsFor(spec)
			if o.PodIface == "" {
				o.PodIface = "eth0"
			}
			topo := &netlab.Topology{PodIface: o.PodIface, Stack: sc.Stack, AppPorts: netlab.DefaultAppPorts, PeerTCPPorts: netlab.DefaultPeerTCPPorts, PeerUDPPorts: netlab.DefaultPeerUDPPorts}
			cases := ExpectedProbesFor(&spec, topo)
			got := map[string]ProbeCase{}
			var to4, to6 int // probes to non-loopback addresses, by family
			for _, c := range cases {
				if a := c.Probe.Dst.Addr(); !a.IsLoopback() && a != netlab.PassthroughV6 {
					if a.Is4() {
						to4++
					} else {
						to6++
					}
				}
				if _, dup := got[c.Name]; dup {
					t.Errorf("duplicate probe name %q", c.Name)
				}
				got[c.Name] = c
				if c.Why == "" {
					t.Errorf("%s: no reason given", c.Name)
				}
			}
			// A family the pod lacks cannot be probed; every family it has
			// is, captured or not.
			if (to4 > 0) != sc.Stack.Has4() || (to6 > 0) != sc.Stack.Has6() {
				t.Errorf("%s pod: %d IPv4 and %d IPv6 probes", sc.Stack, to4, to6)
			}
			pins, ok := want[sc.Name]
			if !ok {
				t.Fatalf("no pinned expectations for scenario %s: add some", sc.Name)
			}
			for name, w := range pins {
				c, ok := got[name]
				if !ok {
					t.Errorf("probe %q not generated", name)
					continue
				}
				if c.WantLanded != w {
					t.Errorf("%s: expects %s (%s), pinned %s", name, c.WantLanded, c.Why, w)
				}
				answered := w != netlab.LandedRefused && w != netlab.LandedTimeout
				if answered && c.WantOrig != c.Probe.Dst || !answered && c.WantOrig.IsValid() {
					t.Errorf("%s: expects orig %s, want the destination %s", name, c.WantOrig, c.Probe.Dst)
				}
			}
		})
	}
}
