package inplace

import (
	"github.com/nftmesh/nftmesh/iptables"
	"github.com/nftmesh/nftmesh/redirect"
)

func legacyBackend() redirect.Backend { return iptables.New() }
