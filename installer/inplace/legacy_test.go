package inplace

import (
	"github.com/nftmesh/nftmesh/redirect"
	"github.com/nftmesh/nftmesh/redirect/legacy"
)

func legacyBackend() redirect.Backend { return legacy.New() }
