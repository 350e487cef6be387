package nettest_test

import (
	"os"
	"testing"

	"github.com/nftmesh/nftmesh/iptables"
	"github.com/nftmesh/nftmesh/nft"
	"github.com/nftmesh/nftmesh/redirect"
	"github.com/nftmesh/nftmesh/testkit/nettest"
	"github.com/nftmesh/nftmesh/testkit/scenarios"
)

// TestTracerAgreesWithKernel is the tracer's property test: for every probe
// of every scenario, applied with each backend in a real namespace, the
// landing redirect.TracePacket's verdict implies (from the plan alone) must
// be where the real connection landed. Any disagreement fails.
func TestTracerAgreesWithKernel(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces and rules")
	}
	for _, backend := range []redirect.Backend{nft.New(), iptables.New()} {
		t.Run(backend.Name(), func(t *testing.T) {
			total, agree := 0, 0
			for _, sc := range scenarios.All {
				t.Run(sc.Name, func(t *testing.T) {
					run := nettest.RunScenario(t, backend, sc)
					for _, o := range run.Outcomes {
						total++
						p := o.Case.Probe
						tr, err := redirect.TracePacket(&run.Plan, nettest.TracePacketFor(&run.Spec, run.Topo, p))
						if err != nil {
							t.Errorf("probe %s: %v", o.Case.Name, err)
							continue
						}
						landed, orig, err := nettest.TracedLanding(&run.Spec, run.Topo, p, tr.Verdict)
						if err != nil {
							t.Errorf("probe %s: %v", o.Case.Name, err)
							continue
						}
						if landed != o.Got.Landed || (orig.IsValid() && orig != o.Got.OrigDst) {
							t.Errorf("DISAGREE probe %s [%s]: tracer %q → %s (orig %v), kernel landed %s\n%s",
								o.Case.Name, p, tr.Verdict, landed, orig, o.Got, tr.Format())
							continue
						}
						agree++
					}
				})
			}
			t.Logf("backend %s: tracer agrees with the kernel on %d of %d probes over %d scenarios", backend.Name(), agree, total, len(scenarios.All))
			if total == 0 {
				t.Fatal("no probes were sent")
			}
		})
	}
}
