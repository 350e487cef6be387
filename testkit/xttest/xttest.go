// Package xttest reads what a test's network namespace holds in legacy
// x_tables, with the reader the agent's backend selection uses.
package xttest

import (
	"fmt"

	"github.com/nftmesh/nftmesh/internal/hostns"
	"github.com/nftmesh/nftmesh/iptables"
)

// Probe is iptables.Sockets.Probe on the namespace at netns: tables never
// instantiated there are not created, and where none exists nothing is read
// but their names.
func Probe(netns string) (iptables.Presence, error) {
	n, err := hostns.Open(netns)
	if err != nil {
		return iptables.Presence{}, fmt.Errorf("probing legacy tables in netns %s: %w", netns, err)
	}
	defer n.Close()
	var s *iptables.Sockets
	err = n.Do(func() (err error) {
		s, err = iptables.OpenHere()
		return err
	})
	if err != nil {
		return iptables.Presence{}, fmt.Errorf("probing legacy tables in netns %s: %w", netns, err)
	}
	defer s.Close()
	pr, err := s.Probe()
	if err != nil {
		return pr, fmt.Errorf("probing legacy tables in netns %s: %w", netns, err)
	}
	return pr, nil
}
