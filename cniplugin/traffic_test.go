package cniplugin

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/nftmesh/nftmesh/netlab"
	"github.com/nftmesh/nftmesh/podinfo"
	"github.com/nftmesh/nftmesh/podinfo/agentsock"
	"github.com/nftmesh/nftmesh/redirect"
	"github.com/nftmesh/nftmesh/testkit/nettest"

	"github.com/nftmesh/nftmesh/testkit/nstest"
)

// TestRealTraffic: after the plugin's ADD (the built binary, exec'd as a
// runtime does), real connections from the app, the proxy's UID, the
// passthrough address and a peer land where Istio's chains send them, with
// the original destination intact, in every address family the pod has. A
// pod outside the mesh keeps direct connectivity. Expectations come from
// nettest's independent oracle.
//
// IPv6 is captured as Istio decides: a dual-stack pod whose sidecar is not
// dual-stack (injected.yaml) gets IPv4 capture only, whichever family its
// primary plugin listed first; with ISTIO_DUAL_STACK=true (annotated.json)
// both; an IPv6-only pod IPv6.
//
// Both ways a call runs: handed by the front to the agent, which runs it in
// its own process with the namespace passed as a descriptor, and, with no
// agent, in the standalone plugin the front runs in its place.
func TestRealTraffic(t *testing.T) {
	needEnv(t)
	t.Run("agent", func(t *testing.T) {
		runDir := agentRunDir(t, env.token)
		ag := startAgent(t, runDir)
		realTraffic(t, runDir, func(t *testing.T, ok0 int) {
			if n := ag.callsReach(agentsock.OutcomeOK, ok0+1); n != ok0+1 {
				t.Errorf("the agent ran %d calls, want %d: the front did not hand this ADD over (declined %d)", n-ok0, 1, ag.calls(agentsock.OutcomeDeclined))
			}
		}, func() int { return ag.calls(agentsock.OutcomeOK) })
	})
	t.Run("standalone", func(t *testing.T) {
		realTraffic(t, agentRunDir(t, env.token), nil, nil)
	})
}

// realTraffic runs TestRealTraffic's table in runDir; ran, when set, checks
// after each ADD who ran it, given count's value before it.
func realTraffic(t *testing.T, runDir string, ran func(t *testing.T, before int), count func() int) {
	for _, tc := range []struct {
		file     string
		stack    netlab.Stack
		wantIPv6 bool
	}{
		{"injected.yaml", netlab.StackIPv4, false},
		{"injected.yaml", netlab.StackDual, false},
		{"injected.yaml", netlab.StackDualV6First, false},
		{"injected.yaml", netlab.StackIPv6, true},
		{"annotated.json", netlab.StackDual, true},
		{"no-sidecar.yaml", netlab.StackDual, false},
	} {
		t.Run(tc.file+"/"+strings.ReplaceAll(tc.stack.String(), " ", "-"), func(t *testing.T) {
			pod := loadPod(t, tc.file)
			if ran != nil {
				pod.Spec.NodeName = testNode // the agent's informer has it
			}
			pod = createPod(t, env.api, pod)
			inMesh, _, spec, err := podinfo.FromPod(pod)
			if err != nil {
				t.Fatal(err)
			}
			spec.IPv6 = tc.wantIPv6
			topo, err := netlab.NewTopology(func() netlab.TopologyOptions {
				o := nettest.TopologyOptionsFor(spec)
				o.Prefix = "cni-"
				o.Stack = tc.stack
				return o
			}())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				if err := topo.Close(); err != nil {
					t.Error(err)
				}
			})
			var lo netlab.ListenerOptions
			if inMesh {
				lo = netlab.ListenerOptions{ProxyUID: spec.ProxyUIDs[0], ProxyGID: spec.ProxyGIDs[0]}
			}
			ls, err := netlab.StartListeners(topo, lo)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = ls.Close() })

			var ips []any // as the primary plugin listed them
			for _, a := range tc.stack.Added() {
				bits := 24
				if a.Is6() {
					bits = 64
				}
				ips = append(ips, map[string]any{"address": netip.PrefixFrom(a, bits).String(), "interface": 0})
			}
			prev := map[string]any{
				"cniVersion": "1.0.0",
				"interfaces": []any{map[string]any{"name": topo.PodIface, "sandbox": topo.PodNetnsPath()}},
				"ips":        ips,
			}
			id := "ctr-" + nstest.RandHex(6)
			before := 0
			if count != nil {
				before = count()
			}
			start := time.Now()
			out, stderr, err := execPlugin("ADD", topo.PodNetnsPath(), id, cniArgsFor(pod, id), directConf(t, "1.0.0", runDir, prev, nil))
			if err != nil {
				t.Fatalf("ADD: %v\nstdout %s\nstderr %s", err, out, stderr)
			}
			t.Logf("ADD took %v", since(start))
			if ran != nil {
				ran(t, before)
			}
			if inMesh {
				if err := nettest.CheckPassthroughV6(topo, tc.wantIPv6); err != nil {
					t.Error(err)
				}
			}

			var want *redirect.Spec
			if inMesh {
				want = &spec
			}
			cases := nettest.ExpectedProbesFor(want, topo)
			bad := 0
			for _, o := range nettest.RunProbes(topo, cases) {
				if !o.OK() {
					bad++
					t.Errorf("MISMATCH %s", o)
				}
			}
			t.Logf("%d/%d probes landed as expected (in mesh: %v)", len(cases)-bad, len(cases), inMesh)
			if len(cases) < 10 {
				t.Fatalf("only %d probes: the harness did not run", len(cases))
			}
		})
	}
}
