package iptables

import (
	"context"
	"testing"

	"github.com/nftmesh/nftmesh/redirect"
	"github.com/nftmesh/nftmesh/testkit/scenarios"

	"github.com/nftmesh/nftmesh/testkit/nstest"
)

func defaultPlan(b testing.TB) redirect.Plan {
	sc, _ := scenarios.ByName("defaults")
	p, err := sc.Plan()
	if err != nil {
		b.Fatal(err)
	}
	return p
}

// BenchmarkApplyLegacy: the default dual-stack plan (v4 + v6 nat) into a
// fresh netns. Netns creation is outside the timer.
func BenchmarkApplyLegacy(b *testing.B) {
	nstest.NeedRoot(b)
	p := defaultPlan(b)
	be := New()
	ctx := context.Background()
	for b.Loop() {
		b.StopTimer()
		_, path := nstest.New(b, "leg-")
		b.StartTimer()
		if err := be.Apply(ctx, path, p); err != nil {
			b.Fatal(err)
		}
	}
}

// appliedNetns is a fresh netns holding the default plan.
func appliedNetns(b *testing.B) (*Backend, context.Context, string, redirect.Plan) {
	b.Helper()
	nstest.NeedRoot(b)
	p := defaultPlan(b)
	be := New()
	ctx := context.Background()
	_, path := nstest.New(b, "leg-")
	if err := be.Apply(ctx, path, p); err != nil {
		b.Fatal(err)
	}
	return be, ctx, path, p
}

// BenchmarkReapplyLegacy: applying the same plan again (read, compare, no write).
func BenchmarkReapplyLegacy(b *testing.B) {
	be, ctx, path, p := appliedNetns(b)
	for b.Loop() {
		if err := be.Apply(ctx, path, p); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCheckLegacy: List + Diff of the default plan.
func BenchmarkCheckLegacy(b *testing.B) {
	be, ctx, path, p := appliedNetns(b)
	for b.Loop() {
		if err := be.Check(ctx, path, p); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRenderLegacy: both families as iptables-save text.
func BenchmarkRenderLegacy(b *testing.B) {
	p := defaultPlan(b)
	for b.Loop() {
		for _, f := range allFamilies {
			if _, err := Render(p, f); err != nil {
				b.Fatal(err)
			}
		}
	}
}
