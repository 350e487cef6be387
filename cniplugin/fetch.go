package cniplugin

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/go-logr/logr"
	"github.com/go-logr/zerologr"
	"k8s.io/klog/v2"

	"github.com/nftmesh/nftmesh/podinfo/agentsock"
	"github.com/nftmesh/nftmesh/podinfo/meshpod"
	"github.com/nftmesh/nftmesh/podinfo/podget"
	"github.com/nftmesh/nftmesh/redirect/quote"
)

// Where a run's pod came from, as the decision line's lookup field says.
const (
	lookupAgent = "agent"
	lookupAPI   = "api"
)

// askAgent asks the node agent for the pod over its socket, or returns nil
// (inv.agentMiss says why) when the plugin must ask the API server itself.
func (inv *invocation) askAgent(ctx context.Context) *meshpod.Pod {
	if inv.k8s.PodUID == "" {
		// Without the UID a cached pod cannot be told from an older one
		// of the same name; the API read can.
		inv.agentMiss = "no K8S_POD_UID in CNI_ARGS"
		return nil
	}
	// Half of api_timeout at most, so the API lookup keeps time to fail
	// closed on its own within api_timeout.
	actx, cancel := context.WithTimeout(ctx, min(agentsock.ClientTimeout, inv.conf.APITimeout/2))
	defer cancel()
	req := agentsock.Request{V: agentsock.Version, Namespace: inv.k8s.PodNamespace, Name: inv.k8s.PodName, UID: inv.k8s.PodUID}
	var a agentsock.Answer
	var err error
	if ask := inv.r.env.Ask; ask != nil {
		a, err = ask(req)
	} else {
		a, err = agentsock.Ask(actx, agentsock.Path(inv.conf.AgentRunDir), req)
	}
	switch {
	case err != nil:
		inv.agentMiss = quote.Text(err.Error())
		return nil
	case a.Status != agentsock.StatusFound:
		inv.agentMiss = quote.Text("agent: " + a.Reason)
		return nil
	}
	inv.lookupPath = lookupAgent
	return a.Pod
}

// routeClientLogs sends client-go's klog lines into the run's log at log
// level debug, and drops them otherwise: the run's decision line says what
// they would of a failed GET. Only the plugin's own process asks the API
// server, so the process-wide klog setting is the run's.
func routeClientLogs(inv *invocation) {
	if inv.r.env.Ask != nil {
		return
	}
	if inv.conf.LogLevel == "debug" {
		l := inv.log
		klog.SetLoggerWithOptions(zerologr.New(&l).WithName("client-go"), klog.ContextualLogger(true))
		return
	}
	klog.SetLogger(logr.Discard())
}

// getPod reads the pod from the API server within timeout (failing
// closed).
func (inv *invocation) getPod(ctx context.Context, timeout time.Duration) (*meshpod.Pod, *types.Error) {
	inv.lookupPath = lookupAPI
	if _, serr := os.Stat(inv.conf.Kubeconfig); serr != nil {
		return nil, types.NewError(types.ErrTryAgainLater,
			fmt.Sprintf("nftmesh-cni: cannot look up pod %s: kubeconfig %s is missing (is the nftmesh agent running on this node?)", inv.podRef(), inv.conf.Kubeconfig),
			serr.Error())
	}
	routeClientLogs(inv)
	client, cerr := podget.NewFromFile(inv.conf.Kubeconfig)
	if cerr != nil {
		return nil, types.NewError(CodePodLookup,
			fmt.Sprintf("nftmesh-cni: cannot look up pod %s: invalid kubeconfig", inv.podRef()), cerr.Error())
	}
	pod, gerr := client.GetPod(ctx, inv.k8s.PodNamespace, inv.k8s.PodName, inv.k8s.PodUID, max(timeout, time.Millisecond))
	if gerr != nil {
		code := CodePodLookup
		if podget.Retryable(gerr) {
			code = types.ErrTryAgainLater
		}
		return nil, types.NewError(code,
			fmt.Sprintf("nftmesh-cni: cannot look up pod %s (failing closed)", inv.podRef()), gerr.Error())
	}
	if inv.k8s.PodUID != "" && pod.UID != inv.k8s.PodUID {
		return nil, types.NewError(types.ErrTryAgainLater,
			fmt.Sprintf("nftmesh-cni: pod %s in the API has UID %s, the sandbox is for UID %s", inv.podRef(), pod.UID, inv.k8s.PodUID), "")
	}
	return pod.Pod, nil
}
