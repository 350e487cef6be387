package iptables

import (
	"net/netip"
	"sort"
)

type netipPrefix = netip.Prefix

func mustPrefix(s string) netip.Prefix { return netip.MustParsePrefix(s) }

func slicesSort(s []string) { sort.Strings(s) }

// probe is testkit/xttest.Probe, which this package's tests cannot import.
func probe(netns string) (Presence, error) {
	s, err := openSockets(netns, allFamilies, nil)
	if err != nil {
		return Presence{}, err
	}
	defer s.Close()
	return s.Probe()
}
