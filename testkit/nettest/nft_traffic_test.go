package nettest_test

import (
	"os"
	"testing"

	"github.com/nftmesh/nftmesh/nft"
	"github.com/nftmesh/nftmesh/testkit/nettest"
	"github.com/nftmesh/nftmesh/testkit/scenarios"
)

// TestNftTraffic holds the nftables backend to Istio's semantics with real
// connections, for every scenario of the shared table.
func TestNftTraffic(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces and nftables rules")
	}
	for _, sc := range scenarios.All {
		t.Run(sc.Name, func(t *testing.T) {
			nettest.AssertScenario(t, nft.New(), sc)
		})
	}
}
