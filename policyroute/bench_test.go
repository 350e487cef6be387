package policyroute

import (
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/nftmesh/nftmesh/internal/hostns"
	"github.com/nftmesh/nftmesh/redirect"
	"github.com/nftmesh/nftmesh/testkit/nstest"
)

// BenchmarkApplyViaPassthrough is what every dual-stack ADD's policy step
// does on the agent path: ::6 on lo through a Handle opened in the pod's
// namespace (then deleted, outside the timing's point but inside the loop).
//
//	go test -run '^$' -bench BenchmarkApplyViaPassthrough -count 5 ./policyroute
func BenchmarkApplyViaPassthrough(b *testing.B) {
	_, path := nstest.New(b, "pr-bench-")
	n, err := hostns.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	defer n.Close()
	var h *Handle
	if err := n.Do(func() (err error) { h, err = OpenHere(); return err }); err != nil {
		b.Fatal(err)
	}
	defer h.Close()
	p := redirect.Plan{LoopbackAddrs: []netip.Prefix{redirect.InboundPassthroughV6}}
	cpu0 := cpuTime(b)
	for b.Loop() {
		if err := ApplyVia(hostns.Guard{}, h, n.Fd(), p, false); err != nil {
			b.Fatal(err)
		}
		if err := delPassthrough(h.nl); err != nil {
			b.Fatal(err)
		}
	}
	// CPU time (user and system, all threads) tells the cost apart from
	// the wait for a core on a loaded machine, which ns/op includes.
	b.ReportMetric(float64(cpuTime(b)-cpu0)/float64(b.N), "cpu-ns/op")
}

func cpuTime(b *testing.B) time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkApplyRemoveTProxy is the policy step of a TPROXY ADD and DEL on
// a path without a Handle of its own (the legacy backend, the CLI): Apply
// and Remove each open rtnetlink in the namespace from its descriptor.
//
//	go test -run '^$' -bench BenchmarkApplyRemoveTProxy -count 10 ./policyroute
func BenchmarkApplyRemoveTProxy(b *testing.B) {
	_, path := nstest.New(b, "pr-bench-")
	n, err := hostns.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	defer n.Close()
	ns := netns.NsHandle(n.Fd())
	p := redirect.Plan{
		Routes: []redirect.PolicyRoute{
			{Family: redirect.FamilyIPv4, Mark: redirect.TProxyMark, Table: redirect.TProxyRouteTab},
			{Family: redirect.FamilyIPv6, Mark: redirect.TProxyMark, Table: redirect.TProxyRouteTab},
		},
		LoopbackAddrs: []netip.Prefix{redirect.InboundPassthroughV6},
	}
	cpu0 := cpuTime(b)
	for b.Loop() {
		if err := Apply(hostns.Guard{}, ns, p, false); err != nil {
			b.Fatal(err)
		}
		if err := Remove(hostns.Guard{}, ns); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(cpuTime(b)-cpu0)/float64(b.N), "cpu-ns/op")
}
