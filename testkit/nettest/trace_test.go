package nettest

import (
	"testing"

	"github.com/nftmesh/nftmesh/netlab"
	"github.com/nftmesh/nftmesh/redirect"
	"github.com/nftmesh/nftmesh/testkit/scenarios"
)

// TestTracerAgreesWithOracle runs redirect.TracePacket over each scenario's
// plan for every probe and compares the landing it implies with the
// independent oracle's (no root: the kernel test TestTracerAgreesWithKernel
// compares with real connections). The two are written from different
// sources (the Plan's rules vs a model of Istio's chains), so agreement is
// evidence for both.
func TestTracerAgreesWithOracle(t *testing.T) {
	total, agree := 0, 0
	for _, sc := range scenarios.All {
		spec, err := sc.Spec()
		if err != nil {
			t.Fatal(err)
		}
		plan, err := redirect.Build(spec)
		if err != nil {
			t.Fatal(err)
		}
		o := TopologyOptionsFor(spec)
		if o.PodIface == "" {
			o.PodIface = "eth0"
		}
		topo := &netlab.Topology{PodIface: o.PodIface, Stack: sc.Stack, AppPorts: netlab.DefaultAppPorts, PeerTCPPorts: netlab.DefaultPeerTCPPorts, PeerUDPPorts: netlab.DefaultPeerUDPPorts}
		for _, c := range ExpectedProbesFor(&spec, topo) {
			total++
			pkt := TracePacketFor(&spec, topo, c.Probe)
			tr, err := redirect.TracePacket(&plan, pkt)
			if err != nil {
				t.Errorf("scenario %s, probe %s: %v", sc.Name, c.Name, err)
				continue
			}
			landed, orig, err := TracedLanding(&spec, topo, c.Probe, tr.Verdict)
			if err != nil {
				t.Errorf("scenario %s, probe %s: %v", sc.Name, c.Name, err)
				continue
			}
			if landed != c.WantLanded || orig != c.WantOrig {
				t.Errorf("scenario %s, probe %s [%s]: tracer says %s → %s (orig %v), oracle %s (orig %v): %s\n%s",
					sc.Name, c.Name, c.Probe, tr.Verdict, landed, orig, c.WantLanded, c.WantOrig, c.Why, tr.Format())
				continue
			}
			agree++
		}
	}
	t.Logf("tracer and oracle agree on %d of %d probes over %d scenarios", agree, total, len(scenarios.All))
	if total == 0 {
		t.Fatal("no probes")
	}
}
