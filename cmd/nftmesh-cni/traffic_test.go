package main

import (
	"testing"
	"time"

	"github.com/nftmesh/nftmesh/internal/nettest"
	"github.com/nftmesh/nftmesh/podinfo"
	"github.com/nftmesh/nftmesh/redirect"
)

// TestRealTraffic: after the plugin's ADD (the built binary, exec'd as a
// runtime does), real connections from the app, the proxy's UID, the
// passthrough address and a peer land where Istio's chains send them, with
// the original destination intact. A pod outside the mesh keeps direct
// connectivity. Expectations come from nettest's independent oracle.
func TestRealTraffic(t *testing.T) {
	needEnv(t)
	runDir := agentRunDir(t, env.token)
	for _, file := range []string{"injected.yaml", "annotated.json", "no-sidecar.yaml"} {
		t.Run(file, func(t *testing.T) {
			pod := createPod(t, env.api, loadPod(t, file))
			inMesh, _, spec, err := podinfo.FromPod(pod)
			if err != nil {
				t.Fatal(err)
			}
			spec.IPv6 = true // the prevResult below is dual-stack
			topo, err := nettest.NewTopology(func() nettest.TopologyOptions {
				o := nettest.TopologyOptionsFor(spec)
				o.Prefix = "cni-"
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
			var lo nettest.ListenerOptions
			if inMesh {
				lo = nettest.ListenerOptions{ProxyUID: spec.ProxyUIDs[0], ProxyGID: spec.ProxyGIDs[0]}
			}
			ls, err := nettest.StartListeners(topo, lo)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = ls.Close() })

			prev := map[string]any{
				"cniVersion": "1.0.0",
				"interfaces": []any{map[string]any{"name": topo.PodIface, "sandbox": topo.PodNetnsPath()}},
				"ips": []any{
					map[string]any{"address": nettest.PodV4.String() + "/30", "interface": 0},
					map[string]any{"address": nettest.PodV6.String() + "/64", "interface": 0},
				},
			}
			id := "ctr-" + randHex(6)
			start := time.Now()
			out, stderr, err := execPlugin("ADD", topo.PodNetnsPath(), id, cniArgsFor(pod, id), directConf(t, "1.0.0", runDir, prev, nil))
			if err != nil {
				t.Fatalf("ADD: %v\nstdout %s\nstderr %s", err, out, stderr)
			}
			t.Logf("ADD took %v", since(start))

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
