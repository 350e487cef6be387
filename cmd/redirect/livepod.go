package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/nftmesh/nftmesh/capture"
	"github.com/nftmesh/nftmesh/podinfo/agentsock"
	"github.com/nftmesh/nftmesh/podinfo/meshpod/manifest"
	"github.com/nftmesh/nftmesh/redirect/quote"
)

// askTimeout bounds the question to the agent (its answer walks the host's
// processes once).
const askTimeout = 20 * time.Second

// parsePodRef splits NAMESPACE/NAME.
func parsePodRef(ref string) (ns, name string, err error) {
	ns, name, ok := strings.Cut(ref, "/")
	if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		return "", "", usageErr("pod %s: want NAMESPACE/NAME", quote.Value(ref))
	}
	return ns, name, nil
}

// askAgent asks the nftmesh agent (run dir runDir, or the default one) for
// pod ref: its decision fields become sf's pod, and the returned path
// names its network namespace, held open until done is called.
func askAgent(cmd *cobra.Command, ref, runDir string, sf *specFlags) (path string, done func(), err error) {
	ns, name, err := parsePodRef(ref)
	if err != nil {
		return "", nil, err
	}
	if runDir == "" {
		runDir = capture.DefaultRunDir
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), askTimeout)
	defer cancel()
	a, f, err := agentsock.AskInspect(ctx, runDir, agentsock.InspectRequest{Namespace: ns, Name: name})
	if err != nil {
		return "", nil, failure(err)
	}
	sf.live = &manifest.Object{Pod: a.Pod, Kind: "Pod", Namespace: ns, Name: name}
	fmt.Fprintf(cmd.ErrOrStderr(), "pod %s/%s (uid %s): network namespace %s (found by %s)\n", ns, name, a.UID, a.Netns, a.Match)
	return fmt.Sprintf("/proc/self/fd/%d", f.Fd()), func() { f.Close() }, nil
}
