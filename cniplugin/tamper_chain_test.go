package cniplugin

import (
	"strings"
	"testing"

	"github.com/nftmesh/nftmesh/testkit/cnitest"
	"github.com/nftmesh/nftmesh/testkit/nstest"
)

// TestChainCheckSeesSwitchedOffCapture: CHECK through the chain, as a
// runtime runs it, fails once nftmesh's table in the pod's netns is
// switched off (dormant) or a base chain of it drops what falls through,
// naming the difference; it passed a dormant table before (issue 29).
func TestChainCheckSeesSwitchedOffCapture(t *testing.T) {
	needEnv(t)
	for _, tc := range []struct{ name, nft, want string }{
		{"dormant table", "add table inet nftmesh { flags dormant; }\n", "+ table flags dormant"},
		{"policy drop", "add chain inet nftmesh nat-output { policy drop; }\n", "+ chain nat-output { type nat hook output priority -100 policy drop }"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHost(t, env.api, env.token)
			pod := createPod(t, env.api, loadPod(t, "injected.yaml"))
			nsName, nsPath := nstest.New(t, "cni-pod-")
			cl := h.conflist(t, "1.0.0", nil)
			rt := cnitest.RuntimeConf(pod, nsPath, "ctr-")
			if _, err := h.add(cl, rt); err != nil {
				t.Fatalf("ADD: %v", err)
			}
			if err := h.check(cl, rt); err != nil {
				t.Fatalf("CHECK before: %v", err)
			}
			shIn(t, tc.nft, "ip", "netns", "exec", nsName, "nft", "-f", "-")
			err := h.check(cl, rt)
			if err == nil || !strings.Contains(err.Error(), "are not as planned") || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("CHECK after %q: %v; want an error naming %q", tc.nft, err, tc.want)
			}
			if err := h.del(cl, rt); err != nil {
				t.Fatalf("DEL: %v", err)
			}
		})
	}
}
