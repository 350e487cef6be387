package main

import (
	"context"
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"

	"github.com/nftmesh/nftmesh/installer/inplace"
	"github.com/nftmesh/nftmesh/podinfo"
	"github.com/nftmesh/nftmesh/podinfo/agentsock"
	"github.com/nftmesh/nftmesh/redirect/quote"
)

// inspectPod answers on agentsock.InspectSocketName, finding the pod's
// namespace among the host's processes at procDir: it needs no repair mode,
// only that /proc and the capabilities to open another process's namespace.
func (s *podSocket) inspectPod(procDir string) agentsock.InspectFunc {
	return func(_ context.Context, req agentsock.InspectRequest) (agentsock.InspectAnswer, int) {
		fail := func(format string, args ...any) (agentsock.InspectAnswer, int) {
			return agentsock.InspectAnswer{Error: fmt.Sprintf(format, args...)}, -1
		}
		what := quote.Value(req.Namespace) + "/" + quote.Value(req.Name)
		obj, ok, err := s.pods.GetIndexer().GetByKey(req.Namespace + "/" + req.Name)
		if err != nil {
			return fail("looking up pod %s: %v", what, err)
		}
		if !ok {
			return fail("pod %s is not on this node (the agent watches the pods of its own node): ask the agent on the pod's node", what)
		}
		pod, ok := obj.(*corev1.Pod)
		if !ok {
			return fail("pod %s: unexpected cache entry %T", what, obj)
		}
		ips, err := inplace.PodIPs(pod)
		if err != nil {
			return fail("pod %s: %v", what, err)
		}
		found, err := inplace.FindNetns(procDir, string(pod.UID), ips)
		if errors.Is(err, inplace.ErrNotFound) {
			return fail("pod %s (IPs %v) has no network namespace on this node (not started, or gone)", what, ips)
		}
		if err != nil {
			return fail("finding the network namespace of pod %s: %v", what, err)
		}
		fd, err := unix.Open(found.Path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fail("opening the network namespace of pod %s (%s): %v", what, found.Path, err)
		}
		return agentsock.InspectAnswer{UID: string(pod.UID), Pod: podinfo.Mesh(pod), Netns: found.Path, Match: found.Match}, fd
	}
}
