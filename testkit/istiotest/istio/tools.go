//go:build tools

// Package tools records the Istio binaries this module exists to build.
package tools

import (
	_ "istio.io/istio/cni/cmd/istio-cni"
	_ "istio.io/istio/istioctl/cmd/istioctl"
	_ "istio.io/istio/pilot/cmd/pilot-agent"
)
