package nft

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/nftmesh/nftmesh/internal/hostns"
	"github.com/nftmesh/nftmesh/netlab"

	"github.com/nftmesh/nftmesh/testkit/nstest"
)

// BenchmarkConnRate10kVs0 measures TCP connection setup through the capture
// rules (app → external host, redirected to the outbound listener on 15001;
// the excluded-CIDR set is looked up on every new connection) with no
// excluded CIDRs and with 10,000, in two pods side by side, alternating
// rounds. Reported: connections per second for each and their ratio (target:
// the 10k pod within 10% of the 0 pod, i.e. ratio ≥ 0.9).
func BenchmarkConnRate10kVs0(b *testing.B) {
	nstest.NeedRoot(b)
	pods := map[string]*netlab.Topology{}
	for name, n := range map[string]int{"0": 0, "10k": 10000} {
		topo, err := netlab.NewTopology(netlab.TopologyOptions{Prefix: "nfa-cr-"})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { topo.Close() })
		ls, err := netlab.StartListeners(topo, netlab.ListenerOptions{})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { ls.Close() })
		p := planWithExcludes(b, n)
		if err := New().Apply(context.Background(), topo.PodNetnsPath(), p); err != nil {
			b.Fatal(err)
		}
		pods[name] = topo
	}
	dst := netip.AddrPortFrom(netlab.OtherV4Host, 80)
	const round = 100
	took := map[string]time.Duration{}
	b.ResetTimer()
	for b.Loop() {
		for _, name := range []string{"0", "10k"} {
			d, err := connectLoop(pods[name].PodNetnsPath(), dst, round)
			if err != nil {
				b.Fatalf("pod with %s excludes: %v", name, err)
			}
			took[name] += d
		}
	}
	b.StopTimer()
	n := float64(b.N * round)
	r0, r10k := n/took["0"].Seconds(), n/took["10k"].Seconds()
	b.ReportMetric(r0, "conn/s-0")
	b.ReportMetric(r10k, "conn/s-10k")
	b.ReportMetric(r10k/r0, "ratio-10k/0")
	b.ReportMetric(0, "ns/op")
}

// connectLoop opens n connections from inside the pod (as root: not the
// proxy, so captured) and reads each listener's one-line answer.
func connectLoop(podNetns string, dst netip.AddrPort, n int) (time.Duration, error) {
	ns, err := hostns.Open(podNetns)
	if err != nil {
		return 0, err
	}
	defer ns.Close()
	var took time.Duration
	// A thread of its own, discarded afterwards, so no other goroutine
	// ever runs in the pod's namespace.
	err = ns.DoDiscard(func() error {
		start := time.Now()
		for i := 0; i < n; i++ {
			c, err := net.DialTimeout("tcp", dst.String(), 2*time.Second)
			if err != nil {
				return err
			}
			line, err := io.ReadAll(c)
			c.Close()
			if err != nil {
				return err
			}
			if i == 0 && !strings.Contains(string(line), netlab.ListenerOutbound) {
				return fmt.Errorf("connection to %s was not captured: %s", dst, line)
			}
		}
		took = time.Since(start)
		return nil
	})
	return took, err
}
