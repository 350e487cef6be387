package capture

import (
	"context"
	"fmt"
	"strings"

	"github.com/google/nftables"

	"github.com/nftmesh/nftmesh/iptables"
)

// Foreign lists the traffic capture another installer left in n, which
// would act on the pod's traffic next to (or instead of) ours: Istio's
// iptables chains (ISTIO_* user chains that are not ours) in legacy
// x_tables or in the iptables-nft tables, and the tables of Istio's native
// nftables mode (inet istio-proxy-*). Each entry says where it is; none
// means nothing foreign was found.
func Foreign(ctx context.Context, n *Netns) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	path := pin(n)
	var out []string
	if iptables.LegacyAvailable() == nil {
		pr, err := iptables.Probe(path)
		if err != nil {
			return nil, unpin(fmt.Errorf("looking for foreign capture: %w", err), path, n)
		}
		for _, f := range pr.Foreign {
			out = append(out, "iptables-legacy "+f)
		}
	}
	c, err := nftables.New(nftables.WithNetNSFd(n.Fd()))
	if err != nil {
		return nil, fmt.Errorf("looking for foreign capture in %s: %w", n.Path, err)
	}
	defer c.CloseLasting()
	tables, err := c.ListTables()
	if err != nil {
		return nil, fmt.Errorf("listing nftables tables in %s: %w", n.Path, err)
	}
	xt := false
	for _, t := range tables {
		switch {
		case t.Family == nftables.TableFamilyINet && strings.HasPrefix(t.Name, "istio-proxy-"):
			out = append(out, "nftables table inet "+t.Name)
		case t.Family == nftables.TableFamilyIPv4 || t.Family == nftables.TableFamilyIPv6:
			xt = true
		}
	}
	if xt {
		chains, err := c.ListChains()
		if err != nil {
			return nil, fmt.Errorf("listing nftables chains in %s: %w", n.Path, err)
		}
		for _, ch := range chains {
			fam := map[nftables.TableFamily]string{nftables.TableFamilyIPv4: "ipv4", nftables.TableFamilyIPv6: "ipv6"}[ch.Table.Family]
			if fam != "" && strings.HasPrefix(ch.Name, "ISTIO_") {
				out = append(out, "iptables-nft "+fam+" "+ch.Table.Name+" "+ch.Name)
			}
		}
	}
	return out, nil
}

// ForeignError is Foreign's finding as an error, for the verbs that must
// not report a pod in sync while another installer's capture is there.
type ForeignError struct {
	Netns string
	Found []string
}

func (e *ForeignError) Error() string {
	return fmt.Sprintf("netns %s also holds another installer's traffic capture (Istio's istio-init or istio-cni): %s", e.Netns, strings.Join(e.Found, ", "))
}
