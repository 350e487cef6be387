// Package cnitest holds what tests driving a CNI chain through libcni pass
// the way a container runtime does.
package cnitest

import (
	"github.com/containernetworking/cni/libcni"
	corev1 "k8s.io/api/core/v1"

	"github.com/nftmesh/nftmesh/testkit/nstest"
)

// RuntimeConf is what kubelet's runtime passes for pod's sandbox in
// netnsPath: a fresh container ID (idPrefix and random hex), eth0, and the
// pod's namespace, name, sandbox ID and UID as CNI_ARGS.
func RuntimeConf(pod *corev1.Pod, netnsPath, idPrefix string) *libcni.RuntimeConf {
	id := idPrefix + nstest.RandHex(8)
	return &libcni.RuntimeConf{
		ContainerID: id,
		NetNS:       netnsPath,
		IfName:      "eth0",
		Args: [][2]string{
			{"IgnoreUnknown", "1"},
			{"K8S_POD_NAMESPACE", pod.Namespace},
			{"K8S_POD_NAME", pod.Name},
			{"K8S_POD_INFRA_CONTAINER_ID", id},
			{"K8S_POD_UID", string(pod.UID)},
		},
	}
}
