package capture

import (
	"context"
	"fmt"
	"slices"

	"github.com/nftmesh/nftmesh/redirect"
)

// Backend names as used by flags, the plugin config and the chart.
const (
	Auto     = redirect.BackendAuto
	NFTables = redirect.BackendNFTables
	Legacy   = redirect.BackendLegacy
)

// BackendNames lists the accepted backend names.
var BackendNames = []string{Auto, NFTables, Legacy}

// ValidateBackend checks a backend name.
func ValidateBackend(name string) error {
	if slices.Contains(BackendNames, name) {
		return nil
	}
	return fmt.Errorf("backend %q: want auto, nftables or iptables-legacy", name)
}

// selection is the backend chosen for a netns, why, and whether nftmesh's
// rules were there before this run (see Apply).
type selection struct {
	backend redirect.Backend
	why     string
	oursWas bool
}

// choose returns the backend to use for the visited namespace and why,
// from the namespace itself, never binaries on PATH, so capture rules never
// end up split across the two netfilter worlds. An explicit choice is
// refused when the other backend already holds nftmesh's rules there;
// "auto" picks iptables-legacy only when legacy nat/mangle tables there
// already hold rules (a primary CNI that lives in legacy tables), the
// kernel supports legacy x_tables and the netns is owned by this process's
// user namespace (see ErrUserNamespaced).
//
// It runs on every CNI ADD, so it reads as little as it can: one table
// dump (which the nftables backend's Apply reuses), one ioctl for the
// owning user namespace, one pass over the legacy tables that exist, and
// the kernel's legacy x_tables support only where those hold something.
func (pl *Pipeline) choose(ctx context.Context, name string, v Visit, netnsPath string) (selection, error) {
	if err := ValidateBackend(name); err != nil {
		return selection{}, err
	}
	if err := ctx.Err(); err != nil {
		return selection{}, err
	}
	switch name {
	case NFTables:
		return pl.chooseNFTables(v, netnsPath)
	case Legacy:
		return pl.chooseLegacy(v, netnsPath)
	}

	// auto
	ours, xt, err := v.NFTPresence()
	if err != nil {
		return selection{}, err
	}
	if ours {
		return selection{v.Backend(NFTables), "auto: nftmesh's nftables table already present", true}, nil
	}
	foreign, err := v.ForeignUserns()
	if err != nil {
		return selection{}, fmt.Errorf("auto-selecting a backend for %s: %w", netnsPath, err)
	}
	if foreign {
		return selection{v.Backend(NFTables), UsernsReason, false}, nil
	}
	pr, err := v.LegacyPresence()
	if err != nil {
		return selection{}, fmt.Errorf("auto-selecting a backend for %s: %w", netnsPath, err)
	}
	if pr.Ours || pr.NatOrMangleRules {
		if lerr := pl.k.LegacyAvailable(); lerr != nil {
			return selection{v.Backend(NFTables), "auto: kernel has no legacy x_tables (" + lerr.Error() + ")", false}, nil
		}
		if pr.Ours {
			return selection{v.Backend(Legacy), "auto: nftmesh's iptables-legacy chains already present", true}, nil
		}
		return selection{v.Backend(Legacy), "auto: legacy nat/mangle tables already hold rules", false}, nil
	}
	if xt {
		return selection{v.Backend(NFTables), "auto: an iptables-nft ruleset is present (nf_tables world)", false}, nil
	}
	return selection{v.Backend(NFTables), "auto: default", false}, nil
}

// UsernsReason is why auto picks nftables for a network namespace owned by
// another user namespace (see ErrUserNamespaced).
const UsernsReason = "auto: netns owned by another user namespace (hostUsers: false), where the kernel refuses the iptables owner match"

// chooseNFTables is choose for an explicit nftables.
func (pl *Pipeline) chooseNFTables(v Visit, netnsPath string) (selection, error) {
	pr, err := v.LegacyPresence()
	if err != nil {
		return selection{}, fmt.Errorf("selecting a backend for %s: %w", netnsPath, err)
	}
	// Rules of ours on a kernel without legacy x_tables (one family's
	// module loaded) are not refused: legacy cannot be used there either.
	if pr.Ours && pl.k.LegacyAvailable() == nil {
		return selection{}, fmt.Errorf("netns %s already has nftmesh rules from the iptables-legacy backend: refusing to add nftables rules beside them (remove them with `redirect clean --backend iptables-legacy`, or use --backend iptables-legacy)", netnsPath)
	}
	ours, _, err := v.NFTPresence()
	if err != nil {
		return selection{}, err
	}
	return selection{v.Backend(NFTables), "requested", ours}, nil
}

// chooseLegacy is choose for an explicit iptables-legacy.
func (pl *Pipeline) chooseLegacy(v Visit, netnsPath string) (selection, error) {
	foreign, err := v.ForeignUserns()
	if err != nil {
		return selection{}, fmt.Errorf("selecting a backend for %s: %w", netnsPath, err)
	}
	if foreign {
		return selection{}, fmt.Errorf("refusing backend iptables-legacy for netns %s: %w", netnsPath, ErrUserNamespaced)
	}
	if err := pl.k.LegacyAvailable(); err != nil {
		return selection{}, fmt.Errorf("backend iptables-legacy: %w", err)
	}
	ours, _, err := v.NFTPresence()
	if err != nil {
		return selection{}, err
	}
	if ours {
		return selection{}, fmt.Errorf("netns %s already has nftmesh rules from the nftables backend: refusing to add iptables-legacy rules beside them (remove them with `redirect clean --backend nftables`, or use --backend nftables)", netnsPath)
	}
	pr, err := v.LegacyPresence()
	if err != nil {
		return selection{}, fmt.Errorf("selecting a backend for %s: %w", netnsPath, err)
	}
	return selection{v.Backend(Legacy), "requested", pr.Ours}, nil
}
