package iptables

import (
	"context"
	"strings"
	"testing"

	"github.com/nftmesh/nftmesh/redirect"
	"github.com/nftmesh/nftmesh/testkit/scenarios"

	"github.com/nftmesh/nftmesh/testkit/nstest"
)

// TestKernelScenarios applies every scenario into a fresh netns and checks
// it with independent readers: iptables-legacy-save / ip6tables-legacy-save
// must print exactly Render's text; List+Diff must be empty; re-applying is
// a no-op; Remove leaves the tables as iptables-save showed them before.
func TestKernelScenarios(t *testing.T) {
	nstest.NeedRoot(t)
	ctx := context.Background()
	for _, sc := range scenarios.All {
		t.Run(sc.Name, func(t *testing.T) {
			p, err := sc.Plan()
			if err != nil {
				t.Fatal(err)
			}
			ns, path := nstest.New(t, "leg-")
			b := New()
			if err := b.Apply(ctx, path, p); err != nil {
				t.Fatalf("Apply: %v", err)
			}
			checkSaveEqualsRender(t, ns, p)
			if err := b.Check(ctx, path, p); err != nil {
				t.Errorf("Check after Apply: %v", err)
			}
			v4, v6 := saveTables(t, ns, false), saveTables(t, ns, true)
			if err := b.Apply(ctx, path, p); err != nil {
				t.Fatalf("re-Apply: %v", err)
			}
			if v4b, v6b := saveTables(t, ns, false), saveTables(t, ns, true); v4b != v4 || v6b != v6 {
				t.Errorf("re-apply changed the tables:\n%s\n%s", lineDiff(v4, v4b), lineDiff(v6, v6b))
			}
			if err := b.Remove(ctx, path); err != nil {
				t.Fatalf("Remove: %v", err)
			}
			for _, v6 := range []bool{false, true} {
				if got := saveTables(t, ns, v6); strings.Contains(got, "ISTIO_") || strings.Contains(got, "nftmesh") {
					t.Errorf("after Remove, v6=%v:\n%s", v6, got)
				}
			}
			left, err := b.List(ctx, path)
			if err != nil {
				t.Fatalf("List after Remove: %v", err)
			}
			if !left.Empty() {
				t.Errorf("List after Remove is not empty: %v", redirect.Describe(left))
			}
		})
	}
}

func checkSaveEqualsRender(t *testing.T, ns string, p redirect.Plan) {
	t.Helper()
	for _, f := range families {
		want, err := Render(p, f.fam)
		if err != nil {
			t.Fatal(err)
		}
		if got := saveTables(t, ns, f.ext == "v6"); got != want {
			t.Errorf("%s save differs from Render:\n%s", f.ext, lineDiff(want, got))
		}
	}
}
