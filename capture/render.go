package capture

import (
	"github.com/nftmesh/nftmesh/iptables"
	"github.com/nftmesh/nftmesh/nft"
	"github.com/nftmesh/nftmesh/redirect"
)

// RenderNft is the plan as the nftables backend installs it (`nft -f`
// syntax), with the routes as comments.
func RenderNft(p redirect.Plan) (string, error) { return nft.Render(p) }

// RenderIptables is the plan as the iptables-legacy backend installs it
// (iptables-save syntax), followed by the ip6tables-save part when any rule
// applies to IPv6.
func RenderIptables(p redirect.Plan) (string, error) {
	v4, err := iptables.Render(p, redirect.FamilyIPv4)
	if err != nil {
		return "", err
	}
	if !hasIPv6(p) {
		return v4, nil
	}
	v6, err := iptables.Render(p, redirect.FamilyIPv6)
	if err != nil {
		return "", err
	}
	return "# iptables-save\n" + v4 + "# ip6tables-save\n" + v6, nil
}

func hasIPv6(p redirect.Plan) bool {
	for _, t := range p.Tables {
		for _, c := range t.Chains {
			for _, r := range c.Rules {
				if r.Family.Includes(redirect.FamilyIPv6) {
					return true
				}
			}
		}
	}
	return false
}
