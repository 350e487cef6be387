package nft

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nftmesh/nftmesh/redirect"
	"github.com/nftmesh/nftmesh/testkit/scenarios"

	"github.com/nftmesh/nftmesh/testkit/nstest"
)

// TestKernelRenderLoads feeds Render's text to `nft -f` in a fresh netns
// and reads the result back with our List: Render is valid nft input, and
// nft's own encoding of it decodes to the same Plan (so inspect works on a
// table someone loaded by hand from `redirect render`).
func TestKernelRenderLoads(t *testing.T) {
	nstest.NeedRoot(t)
	plans := map[string]redirect.Plan{"vocabulary": vocabularyPlan()}
	for _, sc := range scenarios.All {
		p, err := sc.Plan()
		if err != nil {
			t.Fatal(err)
		}
		plans[sc.Name] = p
	}
	for name, p := range plans {
		t.Run(name, func(t *testing.T) {
			text, err := Render(p)
			if err != nil {
				t.Fatal(err)
			}
			file := filepath.Join(t.TempDir(), name+".nft")
			if err := os.WriteFile(file, []byte(text), 0o644); err != nil {
				t.Fatal(err)
			}
			ns, cleanup := newNetns(t)
			t.Cleanup(cleanup)
			nstest.Run(t, ns, "", "nft", "-f", file)
			got, err := New().List(context.Background(), ns)
			if err != nil {
				t.Fatalf("List of the nft-loaded table: %v", err)
			}
			// nft -f does not add routes or addresses; compare the table.
			p.Routes, p.LoopbackAddrs = nil, nil
			if d := redirect.Diff(p, got); len(d) > 0 {
				t.Errorf("nft -f of Render, read back, differs from the plan:\n%s", strings.Join(d, "\n"))
			}
		})
	}
}
