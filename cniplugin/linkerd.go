package cniplugin

import (
	"context"
	"fmt"
	"time"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/nftmesh/nftmesh/podinfo/meshpod"
	"github.com/nftmesh/nftmesh/podinfo/podget"
)

// withLinkerdInputs is pod with linkerdInputs, within what is left of
// api_timeout since start.
func (inv *invocation) withLinkerdInputs(ctx context.Context, pod *meshpod.Pod, start time.Time) (*meshpod.Pod, error) {
	if err := inv.linkerdInputs(ctx, pod, inv.conf.APITimeout-time.Since(start)); err != nil {
		return nil, err
	}
	return pod, nil
}

// linkerdInputs gives pod what a Linkerd decision reads besides the pod:
// the node's Linkerd settings (the conflist's), and, when the pod lacks an
// override or is Linkerd's control plane, its namespace's annotations and
// the API server's ports. The agent's caches give those; the plugin's own
// process reads them from the API server (as linkerd-cni does on every
// ADD); the agent running the call without them declines it.
func (inv *invocation) linkerdInputs(ctx context.Context, pod *meshpod.Pod, timeout time.Duration) error {
	if inv.conf.Linkerd != nil {
		cfg := *inv.conf.Linkerd
		pod.Linkerd = &cfg
	}
	needNS := meshpod.LinkerdNeedsNamespace(pod)
	needAPI := meshpod.LinkerdNeedsAPIServerPorts(pod)
	if !needNS && !needAPI {
		return nil
	}
	if inv.r.env.Ask != nil {
		inv.agentMiss = "no namespace annotations or API server ports for a Linkerd pod"
		return inv.r.decline()
	}
	client, err := podget.NewFromFile(inv.conf.Kubeconfig)
	if err != nil {
		return inv.fail(types.NewError(CodePodLookup, fmt.Sprintf("nftmesh-cni: cannot read namespace of pod %s: invalid kubeconfig", inv.podRef()), err.Error()))
	}
	if needNS {
		ann, err := client.NamespaceAnnotations(ctx, pod.Namespace, timeout)
		if err != nil {
			// Failing closed, as linkerd-cni does.
			return inv.fail(types.NewError(CodePodLookup, fmt.Sprintf("nftmesh-cni: cannot read the namespace of Linkerd pod %s (failing closed)", inv.podRef()), err.Error()))
		}
		pod.NamespaceAnnotations = ann
	}
	if needAPI {
		// On error linkerd-cni's fallback (443, 6443) applies.
		if ports, err := client.APIServerPorts(ctx, timeout); err == nil {
			pod.APIServerPorts = ports
		}
	}
	return nil
}
