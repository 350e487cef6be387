package hostns

import (
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nftmesh/nftmesh/testkit/nstest"
)

// BenchmarkDo is the cost of entering a namespace and back around a fn
// that does nothing: every ADD pays it twice on the agent path (the
// address list, the sockets of Enter). on-main is the share of calls made
// from the main thread, where Do's goroutine would run (and, its switch
// back failing, park it for good) unless moved to another thread.
//
//	go test -run '^$' -bench BenchmarkDo -count 10 ./internal/hostns
func BenchmarkDo(b *testing.B) {
	_, path := nstest.New(b, "hns-bench-")
	n, err := Open(path)
	if err != nil {
		b.Fatal(err)
	}
	defer n.Close()
	fn := func() error { return nil }
	main := unix.Getpid()
	onMain := 0
	cpu0 := cpuTime(b)
	for b.Loop() {
		runtime.LockOSThread()
		if unix.Gettid() == main {
			onMain++
		}
		runtime.UnlockOSThread()
		if err := n.Do(fn); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(cpuTime(b)-cpu0)/float64(b.N), "cpu-ns/op")
	b.ReportMetric(float64(onMain)/float64(b.N), "on-main/op")
}

func cpuTime(b *testing.B) time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
