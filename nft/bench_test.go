package nft

import (
	"context"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/nftmesh/nftmesh/redirect"
	"github.com/nftmesh/nftmesh/testkit/scenarios"

	"github.com/nftmesh/nftmesh/testkit/nstest"
)

// Run side by side with:
//
//	go test -run x -bench . -benchtime 200x ./nft/
//
// ApplyDefault / KernelFloor is the overhead of our Apply over the cheapest
// possible program with the same base chains (target ≤ 1.2x).

func defaultPlan(b *testing.B) redirect.Plan {
	b.Helper()
	p, err := scenarios.All[0].Plan()
	if err != nil {
		b.Fatal(err)
	}
	return p
}

// freshNetnsLoop runs f once per iteration, each time in a namespace of its
// own. All namespaces are created before the timer starts and deleted after
// it stops: creating and (asynchronously, in the kernel) destroying network
// namespaces takes kernel locks that would otherwise stall the timed Apply
// and make the figures noise. The pause lets the kernel finish destroying
// the namespaces of an earlier benchmark.
func freshNetnsLoop(b *testing.B, f func(ns string) error) {
	nstest.NeedRoot(b)
	b.StopTimer()
	var cleanups []func()
	nss := make([]string, 0, b.N)
	defer func() {
		b.StopTimer()
		for _, c := range cleanups {
			c()
		}
	}()
	for i := 0; i < b.N; i++ {
		ns, cleanup := newNetns(b)
		nss = append(nss, ns)
		cleanups = append(cleanups, cleanup)
	}
	time.Sleep(settle)
	b.StartTimer()
	for _, ns := range nss {
		if err := f(ns); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
}

const settle = 500 * time.Millisecond

func BenchmarkApplyDefault(b *testing.B) {
	p := defaultPlan(b)
	be := New()
	freshNetnsLoop(b, func(ns string) error { return be.Apply(context.Background(), ns, p) })
}

// BenchmarkKernelFloor is one batch with our table and the default plan's
// base chains and nothing else: what the kernel charges for hook
// registration, which no backend can avoid.
func BenchmarkKernelFloor(b *testing.B) {
	p := defaultPlan(b)
	freshNetnsLoop(b, func(path string) error { return applyFloor(path, p) })
}

// applyFloor programs only the table and p's base chains, in one batch.
func applyFloor(path string, p redirect.Plan) error {
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return err
	}
	defer ns.Close()
	cc, err := nftables.New(nftables.WithNetNSFd(int(ns)))
	if err != nil {
		return err
	}
	t := cc.AddTable(&nftables.Table{Name: TableName, Family: nftables.TableFamilyINet})
	for _, tb := range p.Tables {
		for _, c := range tb.Chains {
			if !c.IsBase() {
				continue
			}
			hook := unix.NF_INET_PRE_ROUTING
			if c.Hook == redirect.HookOutput {
				hook = unix.NF_INET_LOCAL_OUT
			}
			cc.AddChain(&nftables.Chain{Name: ChainName(tb.Name, c.Name), Table: t, Type: nftables.ChainType(c.Type),
				Hooknum: nftables.ChainHookRef(nftables.ChainHook(hook)), Priority: nftables.ChainPriorityRef(nftables.ChainPriority(c.Priority))})
		}
	}
	return cc.Flush()
}

// BenchmarkApplyOverFloor alternates the kernel floor and our Apply, each
// into its own fresh namespace, and reports both and their ratio: measured
// in one interleaved loop, the ratio holds up when the machine is busy.
func BenchmarkApplyOverFloor(b *testing.B) {
	nstest.NeedRoot(b)
	p := defaultPlan(b)
	be := New()
	var floor, apply time.Duration
	b.StopTimer()
	var cleanups []func()
	defer func() {
		for _, c := range cleanups {
			c()
		}
	}()
	pairs := make([][2]string, b.N)
	for i := range pairs {
		for j := range 2 {
			ns, c := newNetns(b)
			cleanups = append(cleanups, c)
			pairs[i][j] = ns
		}
	}
	time.Sleep(settle)
	b.StartTimer()
	for _, pr := range pairs {
		t0 := time.Now()
		if err := applyFloor(pr[0], p); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if err := be.Apply(context.Background(), pr[1], p); err != nil {
			b.Fatal(err)
		}
		floor += t1.Sub(t0)
		apply += time.Since(t1)
	}
	b.StopTimer()
	b.ReportMetric(float64(floor.Nanoseconds())/float64(b.N), "floor-ns/op")
	b.ReportMetric(float64(apply.Nanoseconds())/float64(b.N), "apply-ns/op")
	b.ReportMetric(float64(apply)/float64(floor), "apply/floor")
}

func appliedNetns(b *testing.B, p redirect.Plan) string {
	nstest.NeedRoot(b)
	ns, cleanup := newNetns(b)
	b.Cleanup(cleanup)
	if err := New().Apply(context.Background(), ns, p); err != nil {
		b.Fatal(err)
	}
	return ns
}

func BenchmarkReapply(b *testing.B) {
	p := defaultPlan(b)
	ns := appliedNetns(b, p)
	be := New()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := be.Apply(context.Background(), ns, p); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkCheck(b *testing.B) {
	p := defaultPlan(b)
	ns := appliedNetns(b, p)
	be := New()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := be.Check(context.Background(), ns, p); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkList(b *testing.B) {
	p := defaultPlan(b)
	ns := appliedNetns(b, p)
	be := New()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := be.List(context.Background(), ns); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkApply10kCIDRs(b *testing.B) {
	p := planWithExcludes(b, 10000)
	be := New()
	freshNetnsLoop(b, func(ns string) error { return be.Apply(context.Background(), ns, p) })
}

func BenchmarkRender(b *testing.B) {
	p := defaultPlan(b)
	for i := 0; i < b.N; i++ {
		if _, err := Render(p); err != nil {
			b.Fatal(err)
		}
	}
}
