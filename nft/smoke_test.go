package nft

import (
	"context"
	"testing"

	"github.com/nftmesh/nftmesh/internal/scenarios"
	"github.com/nftmesh/nftmesh/redirect"
)

func TestSmoke(t *testing.T) {
	needRoot(t)
	for _, sc := range scenarios.All {
		t.Run(sc.Name, func(t *testing.T) {
			p, err := sc.Plan()
			if err != nil {
				t.Fatal(err)
			}
			ns := podNetns(t)
			b := New()
			if err := b.Apply(context.Background(), ns, p); err != nil {
				t.Fatal(err)
			}
			t.Log(inNetns(t, ns, "nft", "list", "ruleset"))
			got, err := b.List(context.Background(), ns)
			if err != nil {
				t.Fatal(err)
			}
			if d := redirect.Diff(p, got); len(d) > 0 {
				t.Fatalf("diff:\n%v", d)
			}
		})
	}
}
