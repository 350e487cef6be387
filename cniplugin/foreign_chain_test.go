package cniplugin

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/nftmesh/nftmesh/testkit/nstest"

	"github.com/nftmesh/nftmesh/testkit/cnitest"
)

// TestChainCheckReportsIstioCapture: CHECK of a mesh pod whose own rules
// are intact fails once Istio's capture is also in its netns (its iptables
// chains written with iptables-legacy, or its native nftables tables),
// naming what it found: two captures act on the pod's traffic.
func TestChainCheckReportsIstioCapture(t *testing.T) {
	needEnv(t)
	for _, plant := range []struct {
		name, stdin string
		cmd         []string
		want        string
	}{
		{"iptables-legacy", "", []string{"iptables-legacy", "-t", "nat", "-N", "ISTIO_INBOUND"}, "iptables-legacy ipv4 nat ISTIO_INBOUND"},
		{"native nftables", "table inet istio-proxy-mangle {\n}\n", []string{"nft", "-f", "-"}, "nftables table inet istio-proxy-mangle"},
	} {
		t.Run(plant.name, func(t *testing.T) {
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
			shIn(t, plant.stdin, append([]string{"ip", "netns", "exec", nsName}, plant.cmd...)...)
			err := h.check(cl, rt)
			if err == nil || !strings.Contains(err.Error(), "another installer's traffic capture") || !strings.Contains(err.Error(), plant.want) {
				t.Fatalf("CHECK with Istio's capture planted: %v; want an error naming %q", err, plant.want)
			}
			if err := h.del(cl, rt); err != nil {
				t.Fatalf("DEL: %v", err)
			}
		})
	}
}

func shIn(t *testing.T, stdin string, args ...string) {
	t.Helper()
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdin = strings.NewReader(stdin)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v: %v\n%s", args, err, out)
	}
}
