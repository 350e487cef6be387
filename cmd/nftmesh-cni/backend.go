package main

import (
	"context"

	"github.com/nftmesh/nftmesh/internal/backends"
	"github.com/nftmesh/nftmesh/nft"
	"github.com/nftmesh/nftmesh/podinfo"
	"github.com/nftmesh/nftmesh/redirect"
	"github.com/nftmesh/nftmesh/redirect/legacy"
)

// backendFor returns the backend that programs netnsPath, with the reason
// for the choice. The shared selector refuses to add rules of one backend
// beside ours from the other, and "auto" looks at the netns itself (legacy
// x_tables rules present → iptables-legacy, else nftables).
func backendFor(ctx context.Context, name, netnsPath string) (redirect.Backend, string, error) {
	return backends.Select(ctx, name, netnsPath)
}

// removeOurs deletes what nftmesh installed in netnsPath. With "auto" the
// backend ADD chose is not recorded anywhere, so nftables is cleaned and
// iptables-legacy too when it lists rules of ours (only then: removing
// through legacy takes the host's xtables lock).
func removeOurs(ctx context.Context, name, netnsPath string) error {
	switch name {
	case podinfo.BackendNftables:
		return nft.New().Remove(ctx, netnsPath)
	case podinfo.BackendIptablesLegacy:
		return legacy.New().Remove(ctx, netnsPath)
	}
	if err := nft.New().Remove(ctx, netnsPath); err != nil {
		return err
	}
	lb := legacy.New()
	if p, err := lb.List(ctx, netnsPath); err == nil && !p.Empty() {
		return lb.Remove(ctx, netnsPath)
	}
	return nil
}
