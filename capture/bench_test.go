package capture

import (
	"context"
	"testing"

	"github.com/nftmesh/nftmesh/nft"
	"github.com/nftmesh/nftmesh/testkit/scenarios"
)

// BenchmarkApply is the pipeline's cost around a backend's Apply: opening
// and checking the netns, the host guard, the per-netns lock, entering the
// namespace once for every socket, selection (explicit nftables: the
// legacy tables' names and one table dump, which Apply reuses) and the
// backend's own Apply, into a fresh netns (created outside the timer).
// BenchmarkApplyBackendOnly is the same Apply without the pipeline.
func BenchmarkApply(b *testing.B) {
	ctx := context.Background()
	p := scenarios.MustPlan(b, "defaults")
	o := Options{Backend: NFTables, RunDir: b.TempDir()}
	for b.Loop() {
		b.StopTimer()
		path := freshNetns(b)
		b.StartTimer()
		n, err := Linux().Open(path)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := Linux().Apply(ctx, n, p, o); err != nil {
			b.Fatal(err)
		}
		n.Close()
	}
}

func BenchmarkApplyBackendOnly(b *testing.B) {
	ctx := context.Background()
	p := scenarios.MustPlan(b, "defaults")
	for b.Loop() {
		b.StopTimer()
		path := freshNetns(b)
		b.StartTimer()
		if err := nft.New().Apply(ctx, path, p); err != nil {
			b.Fatal(err)
		}
	}
}
