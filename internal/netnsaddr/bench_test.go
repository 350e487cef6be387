package netnsaddr_test

import (
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nftmesh/nftmesh/internal/hostns"
	"github.com/nftmesh/nftmesh/internal/netnsaddr"
	"github.com/nftmesh/nftmesh/testkit/nstest"
)

// BenchmarkListIn is the address read of every ADD (capture.LinuxVia): a
// dual-stack pod's namespace, already open, as the agent holds it.
//
//	go test -run '^$' -bench BenchmarkListIn -count 5 ./internal/netnsaddr
func BenchmarkListIn(b *testing.B) {
	name, path := nstest.New(b, "nna-bench-")
	nstest.Sh(b, "ip", "-n", name, "link", "add", "eth0", "type", "veth", "peer", "name", "peer0")
	nstest.Sh(b, "ip", "-n", name, "addr", "add", "10.244.1.5/24", "dev", "eth0")
	nstest.Sh(b, "ip", "-n", name, "addr", "add", "fd00:10:244:1::5/64", "dev", "eth0", "nodad")
	nstest.Sh(b, "ip", "-n", name, "link", "set", "eth0", "up")
	n, err := hostns.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	defer n.Close()
	b.ReportAllocs()
	cpu0 := cpuTime(b)
	for b.Loop() {
		as, err := netnsaddr.ListIn(n, path)
		if err != nil || len(as) < 4 {
			b.Fatalf("ListIn = %v, %v", as, err)
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
