// Package backends picks the backend that programs a pod's netns: nftables
// (the default) or iptables-legacy. "auto" looks at the netns itself, not at
// binaries on PATH, so capture rules never end up split across the two
// netfilter worlds.
package capture

import (
	"context"
	"fmt"

	"github.com/google/nftables"

	"github.com/nftmesh/nftmesh/internal/hostns"
	"github.com/nftmesh/nftmesh/iptables"
	"github.com/nftmesh/nftmesh/nft"
	"github.com/nftmesh/nftmesh/redirect"
)

// Backend names as used by flags, the plugin config and the chart.
const (
	Auto     = "auto"
	NFTables = "nftables"
	Legacy   = "iptables-legacy"
)

// BackendNames lists the accepted backend names.
var BackendNames = []string{Auto, NFTables, Legacy}

// ValidateBackend checks a backend name.
func ValidateBackend(name string) error {
	for _, n := range BackendNames {
		if name == n {
			return nil
		}
	}
	return fmt.Errorf("backend %q: want auto, nftables or iptables-legacy", name)
}

// selection is the backend chosen for a netns, why, and whether nftmesh's
// rules were already there in it before this run (a failed Apply may then
// only clean up what it added itself, never an earlier run's rules).
type selection struct {
	backend redirect.Backend
	why     string
	oursWas bool
}

// choose returns the backend to use for netns and why. An explicit choice is
// refused when the other backend already holds nftmesh's rules there (they
// would be split across both worlds); "auto" picks iptables-legacy only when
// legacy nat/mangle tables there already hold rules (a primary CNI or tool
// that lives in legacy tables), the kernel supports legacy x_tables and the
// netns is owned by this process's user namespace. iptables-legacy is
// refused outright for a netns owned by another user namespace (see
// ErrUserNamespaced): the kernel would refuse its owner match there.
//
// It runs on every CNI ADD, so it reads the namespace as cheaply as it can:
// one nftables table dump, one ioctl for the owning user namespace and one
// pass over the legacy tables that exist.
func choose(ctx context.Context, name, netnsPath string) (selection, error) {
	if err := ValidateBackend(name); err != nil {
		return selection{}, err
	}
	if err := ctx.Err(); err != nil {
		return selection{}, err
	}
	switch name {
	case NFTables:
		pr, err := iptables.Probe(netnsPath)
		if err != nil {
			return selection{}, fmt.Errorf("selecting a backend for %s: %w", netnsPath, err)
		}
		if pr.Ours {
			return selection{}, fmt.Errorf("netns %s already has nftmesh rules from the iptables-legacy backend: refusing to add nftables rules beside them (remove them with `redirect clean --backend iptables-legacy`, or use --backend iptables-legacy)", netnsPath)
		}
		ours, _, err := nftPresence(netnsPath)
		if err != nil {
			return selection{}, err
		}
		return selection{nft.New(), "requested", ours}, nil
	case Legacy:
		foreign, err := foreignUserns(netnsPath)
		if err != nil {
			return selection{}, fmt.Errorf("selecting a backend for %s: %w", netnsPath, err)
		}
		if foreign {
			return selection{}, fmt.Errorf("refusing backend iptables-legacy for netns %s: %w", netnsPath, ErrUserNamespaced)
		}
		if err := iptables.LegacyAvailable(); err != nil {
			return selection{}, fmt.Errorf("backend iptables-legacy: %w", err)
		}
		ours, _, err := nftPresence(netnsPath)
		if err != nil {
			return selection{}, err
		}
		if ours {
			return selection{}, fmt.Errorf("netns %s already has nftmesh rules from the nftables backend: refusing to add iptables-legacy rules beside them (remove them with `redirect clean --backend nftables`, or use --backend nftables)", netnsPath)
		}
		pr, err := iptables.Probe(netnsPath)
		if err != nil {
			return selection{}, fmt.Errorf("selecting a backend for %s: %w", netnsPath, err)
		}
		return selection{iptables.New(), "requested", pr.Ours}, nil
	}

	// auto
	ours, xt, err := nftPresence(netnsPath)
	if err != nil {
		return selection{}, err
	}
	if ours {
		return selection{nft.New(), "auto: nftmesh's nftables table already present", true}, nil
	}
	foreign, err := foreignUserns(netnsPath)
	if err != nil {
		return selection{}, fmt.Errorf("auto-selecting a backend for %s: %w", netnsPath, err)
	}
	if foreign {
		return selection{nft.New(), UsernsReason, false}, nil
	}
	if lerr := iptables.LegacyAvailable(); lerr != nil {
		return selection{nft.New(), "auto: kernel has no legacy x_tables (" + lerr.Error() + ")", false}, nil
	}
	pr, err := iptables.Probe(netnsPath)
	if err != nil {
		return selection{}, fmt.Errorf("auto-selecting a backend for %s: %w", netnsPath, err)
	}
	switch {
	case pr.Ours:
		return selection{iptables.New(), "auto: nftmesh's iptables-legacy chains already present", true}, nil
	case pr.NatOrMangleRules:
		return selection{iptables.New(), "auto: legacy nat/mangle tables already hold rules", false}, nil
	case xt:
		return selection{nft.New(), "auto: an iptables-nft ruleset is present (nf_tables world)", false}, nil
	}
	return selection{nft.New(), "auto: default", false}, nil
}

// UsernsReason is why auto picks nftables for a network namespace owned by
// another user namespace (see ErrUserNamespaced).
const UsernsReason = "auto: netns owned by another user namespace (hostUsers: false), where the kernel refuses the iptables owner match"

// nftPresence reports, from one table dump, whether our table exists and
// whether iptables-nft tables (ip/ip6 "nat" or "mangle") do.
func nftPresence(netnsPath string) (ours, iptablesNFT bool, err error) {
	n, err := hostns.Open(netnsPath)
	if err != nil {
		return false, false, err
	}
	defer n.Close()
	c, err := nftables.New(nftables.WithNetNSFd(n.Fd()))
	if err != nil {
		return false, false, err
	}
	defer c.CloseLasting()
	tables, err := c.ListTables()
	if err != nil {
		return false, false, fmt.Errorf("listing nftables tables in %s: %w", netnsPath, err)
	}
	for _, t := range tables {
		switch {
		case t.Family == nftables.TableFamilyINet && t.Name == nft.TableName:
			ours = true
		case (t.Family == nftables.TableFamilyIPv4 || t.Family == nftables.TableFamilyIPv6) && (t.Name == "nat" || t.Name == "mangle"):
			iptablesNFT = true
		}
	}
	return ours, iptablesNFT, nil
}
