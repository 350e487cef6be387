// Package backends picks the backend that programs a pod's netns: nftables
// (the default) or iptables-legacy. "auto" looks at the netns itself, not at
// binaries on PATH, so capture rules never end up split across the two
// netfilter worlds.
package backends

import (
	"context"
	"fmt"

	"github.com/google/nftables"
	"github.com/vishvananda/netns"

	"github.com/nftmesh/nftmesh/nft"
	"github.com/nftmesh/nftmesh/redirect"
	"github.com/nftmesh/nftmesh/redirect/legacy"
)

// Backend names as used by flags, the plugin config and the chart.
const (
	Auto     = "auto"
	NFTables = "nftables"
	Legacy   = "iptables-legacy"
)

// Names lists the accepted backend names.
var Names = []string{Auto, NFTables, Legacy}

// Validate checks a backend name.
func Validate(name string) error {
	for _, n := range Names {
		if name == n {
			return nil
		}
	}
	return fmt.Errorf("backend %q: want auto, nftables or iptables-legacy", name)
}

// Select returns the backend to use for netns and why. An explicit choice is
// refused when the other backend already holds nftmesh's rules there (they
// would be split across both worlds); "auto" picks iptables-legacy only when
// legacy nat/mangle tables there already hold rules (a primary CNI or tool
// that lives in legacy tables) and the kernel supports legacy x_tables.
func Select(ctx context.Context, name, netnsPath string) (redirect.Backend, string, error) {
	if err := Validate(name); err != nil {
		return nil, "", err
	}
	nb, lb := nft.New(), legacy.New()
	ours := func(b redirect.Backend) (bool, error) {
		p, err := b.List(ctx, netnsPath)
		if err != nil {
			return false, err
		}
		return !p.Empty(), nil
	}
	legacyErr := legacy.LegacyAvailable()

	switch name {
	case NFTables:
		if legacyErr == nil {
			if has, err := ours(lb); err == nil && has {
				return nil, "", fmt.Errorf("netns %s already has nftmesh rules from the iptables-legacy backend: refusing to add nftables rules beside them (remove them with `redirect clean --backend iptables-legacy`, or use --backend iptables-legacy)", netnsPath)
			}
		}
		return nb, "requested", nil
	case Legacy:
		if legacyErr != nil {
			return nil, "", fmt.Errorf("backend iptables-legacy: %w", legacyErr)
		}
		if has, err := ours(nb); err != nil {
			return nil, "", err
		} else if has {
			return nil, "", fmt.Errorf("netns %s already has nftmesh rules from the nftables backend: refusing to add iptables-legacy rules beside them (remove them with `redirect clean --backend nftables`, or use --backend nftables)", netnsPath)
		}
		return lb, "requested", nil
	}

	// auto
	if has, err := ours(nb); err != nil {
		return nil, "", err
	} else if has {
		return nb, "auto: nftmesh's nftables table already present", nil
	}
	if legacyErr != nil {
		return nb, "auto: kernel has no legacy x_tables (" + legacyErr.Error() + ")", nil
	}
	if has, err := ours(lb); err == nil && has {
		return lb, "auto: nftmesh's iptables-legacy chains already present", nil
	}
	hasLegacy, err := legacy.HasLegacyRules(netnsPath)
	if err != nil {
		return nil, "", fmt.Errorf("auto-selecting a backend for %s: %w", netnsPath, err)
	}
	if hasLegacy {
		return lb, "auto: legacy nat/mangle tables already hold rules", nil
	}
	if xt, err := hasIptablesNFT(netnsPath); err == nil && xt {
		return nb, "auto: an iptables-nft ruleset is present (nf_tables world)", nil
	}
	return nb, "auto: default", nil
}

// hasIptablesNFT reports whether iptables-nft tables (ip/ip6 "nat" or
// "mangle") exist in the netns.
func hasIptablesNFT(netnsPath string) (bool, error) {
	h, err := netns.GetFromPath(netnsPath)
	if err != nil {
		return false, fmt.Errorf("opening netns %s: %w", netnsPath, err)
	}
	defer h.Close()
	c, err := nftables.New(nftables.WithNetNSFd(int(h)))
	if err != nil {
		return false, err
	}
	tables, err := c.ListTables()
	if err != nil {
		return false, fmt.Errorf("listing nftables tables in %s: %w", netnsPath, err)
	}
	for _, t := range tables {
		if (t.Family == nftables.TableFamilyIPv4 || t.Family == nftables.TableFamilyIPv6) && (t.Name == "nat" || t.Name == "mangle") {
			return true, nil
		}
	}
	return false, nil
}
