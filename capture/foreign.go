package capture

import (
	"context"
	"fmt"
	"strings"
)

// Foreign lists the traffic capture another installer left in n, which
// would act on the pod's traffic next to or instead of ours: Istio's
// ISTIO_* chains that are not ours, in legacy x_tables or iptables-nft,
// and the tables of Istio's native nftables mode (inet istio-proxy-*).
func (pl *Pipeline) Foreign(ctx context.Context, n *Netns) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	path := pin(n)
	v, err := pl.k.Enter(n, path, nil, pl.guard)
	if err != nil {
		return nil, unpin(err, path, n)
	}
	defer v.Close()
	return pl.foreignIn(v, path, n)
}

// foreignIn is Foreign through a visit of n, whose pinned path is path.
func (pl *Pipeline) foreignIn(v Visit, path string, n *Netns) ([]string, error) {
	var out []string
	if pl.k.LegacyAvailable() == nil {
		pr, err := v.LegacyPresence()
		if err != nil {
			return nil, unpin(fmt.Errorf("looking for foreign capture: %w", err), path, n)
		}
		for _, f := range pr.Foreign {
			out = append(out, "iptables-legacy "+f)
		}
	}
	nf, err := v.NFTForeign()
	if err != nil {
		return nil, unpin(err, path, n)
	}
	return append(out, nf...), nil
}

// ForeignError is Foreign's finding as an error: no pod is in sync beside
// another installer's capture (and see RefuseForeign).
type ForeignError struct {
	Netns string
	Found []string
}

func (e *ForeignError) Error() string {
	return fmt.Sprintf("netns %s also holds another installer's traffic capture (Istio's istio-init or istio-cni): %s", e.Netns, strings.Join(e.Found, ", "))
}
