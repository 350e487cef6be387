package capture

// Backend selection: nftables (the default) or iptables-legacy. "auto"
// looks at the netns itself, not at binaries on PATH, so capture rules
// never end up split across the two netfilter worlds.

import (
	"context"
	"fmt"

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

// choose returns the backend to use for the visited namespace and why. An
// explicit choice is refused when the other backend already holds
// nftmesh's rules there (they would be split across both worlds); "auto"
// picks iptables-legacy only when legacy nat/mangle tables there already
// hold rules (a primary CNI or tool that lives in legacy tables), the
// kernel supports legacy x_tables and the netns is owned by this process's
// user namespace. iptables-legacy is refused outright for a netns owned by
// another user namespace (see ErrUserNamespaced): the kernel would refuse
// its owner match there.
//
// It runs on every CNI ADD, so it reads the namespace as cheaply as it can:
// one nftables table dump (which the nftables backend's Apply reuses), one
// ioctl for the owning user namespace and one pass over the legacy tables
// that exist. The host kernel is probed for legacy x_tables only where
// legacy tables hold something: a namespace without legacy rules gets
// nftables whatever the kernel supports.
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

// chooseNFTables is choose for an explicit nftables: refused where the
// legacy backend holds nftmesh's rules.
func (pl *Pipeline) chooseNFTables(v Visit, netnsPath string) (selection, error) {
	pr, err := v.LegacyPresence()
	if err != nil {
		return selection{}, fmt.Errorf("selecting a backend for %s: %w", netnsPath, err)
	}
	// Rules of ours that a kernel without legacy x_tables holds (one
	// family's module loaded, not the other's) are not refused: the
	// legacy backend cannot be used there either.
	if pr.Ours && pl.k.LegacyAvailable() == nil {
		return selection{}, fmt.Errorf("netns %s already has nftmesh rules from the iptables-legacy backend: refusing to add nftables rules beside them (remove them with `redirect clean --backend iptables-legacy`, or use --backend iptables-legacy)", netnsPath)
	}
	ours, _, err := v.NFTPresence()
	if err != nil {
		return selection{}, err
	}
	return selection{v.Backend(NFTables), "requested", ours}, nil
}

// chooseLegacy is choose for an explicit iptables-legacy: refused for a
// namespace of another user namespace, on a kernel without legacy
// x_tables, and where the nftables backend holds nftmesh's rules.
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
