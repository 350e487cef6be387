package iptables

import (
	"errors"
	"fmt"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/nftmesh/nftmesh/redirect"
)

// ErrLegacyUnavailable is wrapped by LegacyAvailable's error when the
// kernel has no legacy x_tables (CONFIG_IP_NF_IPTABLES_LEGACY /
// CONFIG_IP6_NF_IPTABLES_LEGACY off, or the ip_tables modules not loaded).
var ErrLegacyUnavailable = errors.New("kernel has no legacy x_tables (iptables-legacy)")

// LegacyAvailable reports whether this kernel serves the legacy x_tables
// socket options for IPv4 and IPv6. It asks for the revision of the builtin
// ERROR target, which ip_tables/ip6_tables register themselves: nothing is
// instantiated, in no namespace.
func LegacyAvailable() error {
	for _, fam := range allFamilies {
		if err := legacyAvailable(fam); err != nil {
			return err
		}
	}
	return nil
}

func legacyAvailable(fam redirect.Family) error {
	l := layoutFor(fam)
	fd, err := unix.Socket(l.af, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_RAW)
	if err != nil {
		return fmt.Errorf("probing %s x_tables: creating raw socket: %w", fam, err)
	}
	defer unix.Close(fd)
	b := make([]byte, getRevisionLen)
	copy(b, "ERROR")
	_, err = getsockopt(fd, l.sockLevel, soGetRevisionTarget, b)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, unix.ENOPROTOOPT), errors.Is(err, unix.ENOENT), errors.Is(err, unix.EPROTONOSUPPORT):
		return fmt.Errorf("probing %s x_tables: %w (%v)", fam, ErrLegacyUnavailable, err)
	}
	return fmt.Errorf("probing %s x_tables: %w", fam, err)
}

// Presence is what a netns holds in legacy x_tables, as backend selection
// needs to know it: our chains or tagged rules, and anything at all in nat
// or mangle.
type Presence struct {
	Ours             bool // nftmesh's chains or tagged rules, any table or family (not another installer's ISTIO_* chains)
	NatOrMangleRules bool // nat or mangle hold any rule or user chain, ours or not
	// Foreign names the ISTIO_* user chains that are not ours (istio-init's
	// or Istio CNI's capture), as "<family> <table> <chain>".
	Foreign []string
}

// Probe reads the legacy tables of the sockets' namespace (OpenHere) as
// they are now. Tables never instantiated there are not created, and where
// none exists nothing is read but their names. A kernel without legacy
// x_tables has none (it lists no table names), so Probe does not ask the
// kernel whether it has them: whoever means to write legacy tables asks
// LegacyAvailable.
func (s *Sockets) Probe() (Presence, error) {
	var pr Presence
	for _, fam := range allFamilies {
		for _, name := range readOrder {
			if !s.tables[fam][name] {
				continue
			}
			t, err := readTableRetry(s.fd[fam], layoutFor(fam), name)
			if err != nil {
				return pr, fmt.Errorf("reading %s table %s: %w", fam, name, err)
			}
			mine := t.ourChains()
			for _, c := range t.chains {
				user := c.hook < 0
				if user && !mine[c.name] && ourChain(c.name) {
					pr.Foreign = append(pr.Foreign, fam.String()+" "+name+" "+c.name)
				}
				pr.Ours = pr.Ours || user && mine[c.name] || slices.ContainsFunc(c.rules, ours)
				pr.NatOrMangleRules = pr.NatOrMangleRules || name != "raw" && (user || len(c.rules) > 0)
			}
		}
	}
	return pr, nil
}
