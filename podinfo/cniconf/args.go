package cniconf

import (
	"fmt"
	"strings"

	"github.com/nftmesh/nftmesh/redirect/quote"
)

// K8sArgs are the pod identity kubelet passes in CNI_ARGS.
type K8sArgs struct {
	PodNamespace     string // K8S_POD_NAMESPACE
	PodName          string // K8S_POD_NAME
	PodUID           string // K8S_POD_UID
	InfraContainerID string // K8S_POD_INFRA_CONTAINER_ID
}

// ParseK8sArgs reads CNI_ARGS ("K=V;K=V"). Unknown keys are ignored, with
// or without IgnoreUnknown: other plugins own them. A pair without '=' or
// a repeated K8S_* key is an error naming it.
func ParseK8sArgs(cniArgs string) (K8sArgs, error) {
	var a K8sArgs
	fields := map[string]*string{
		"K8S_POD_NAMESPACE":          &a.PodNamespace,
		"K8S_POD_NAME":               &a.PodName,
		"K8S_POD_UID":                &a.PodUID,
		"K8S_POD_INFRA_CONTAINER_ID": &a.InfraContainerID,
	}
	seen := map[string]bool{}
	for _, pair := range strings.Split(cniArgs, ";") {
		if pair == "" {
			continue
		}
		k, v, ok := strings.Cut(pair, "=")
		if !ok {
			return K8sArgs{}, fmt.Errorf("parsing CNI_ARGS: %s is not KEY=VALUE", quote.Value(pair))
		}
		dst, ours := fields[k]
		if !ours {
			continue
		}
		if seen[k] {
			return K8sArgs{}, fmt.Errorf("parsing CNI_ARGS: %s given twice", k)
		}
		seen[k] = true
		*dst = v
	}
	return a, nil
}
