package main

import (
	"context"
	"fmt"

	"github.com/nftmesh/nftmesh/nft"
	"github.com/nftmesh/nftmesh/podinfo"
	"github.com/nftmesh/nftmesh/redirect"
	"github.com/nftmesh/nftmesh/redirect/legacy"
)

// backendFor returns the backend that programs netnsPath for the configured
// name. This is the seam for automatic selection: "auto" means nftables
// until the shared selector (which inspects the netns for legacy x_tables
// rules) is wired in here.
func backendFor(_ context.Context, name, _ string) (redirect.Backend, error) {
	switch name {
	case podinfo.BackendNftables, podinfo.BackendAuto, "":
		return nft.New(), nil
	case podinfo.BackendIptablesLegacy:
		return legacy.New(), nil
	}
	return nil, fmt.Errorf("unknown backend %q", name)
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
