package iptables

import (
	"os"
	"testing"

	"github.com/nftmesh/nftmesh/testkit/nettest"
	"github.com/nftmesh/nftmesh/testkit/scenarios"
)

// TestTraffic runs the shared real-traffic harness for every scenario with
// this backend: real connections as app, proxy UID/GID, from 127.0.0.6,
// inbound from a peer netns, DNS, and where each one lands.
func TestTraffic(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("real-traffic test: needs root")
	}
	for _, sc := range scenarios.All {
		t.Run(sc.Name, func(t *testing.T) {
			nettest.AssertScenario(t, New(), sc)
		})
	}
}
