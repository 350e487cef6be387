package meshpod

import "github.com/nftmesh/nftmesh/redirect"

func buildOK(s redirect.Spec) (redirect.Plan, error) { return redirect.Build(s) }
