package nft

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netns"

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
	type res struct {
		d   time.Duration
		err error
	}
	ch := make(chan res, 1)
	go func() {
		// This thread joins the pod namespace and is discarded afterwards
		// (no UnlockOSThread), so no other goroutine ever runs in it.
		runtime.LockOSThread()
		h, err := netns.GetFromPath(podNetns)
		if err != nil {
			ch <- res{err: err}
			return
		}
		defer h.Close()
		if err := netns.Set(h); err != nil {
			ch <- res{err: err}
			return
		}
		start := time.Now()
		for i := 0; i < n; i++ {
			c, err := net.DialTimeout("tcp", dst.String(), 2*time.Second)
			if err != nil {
				ch <- res{err: err}
				return
			}
			line, err := io.ReadAll(c)
			if err != nil {
				c.Close()
				ch <- res{err: err}
				return
			}
			if i == 0 && !strings.Contains(string(line), netlab.ListenerOutbound) {
				c.Close()
				ch <- res{err: fmt.Errorf("connection to %s was not captured: %s", dst, line)}
				return
			}
			c.Close()
		}
		ch <- res{d: time.Since(start)}
	}()
	r := <-ch
	return r.d, r.err
}
