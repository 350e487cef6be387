package iptables

import (
	"testing"

	"github.com/nftmesh/nftmesh/testkit/scenarios"

	"github.com/nftmesh/nftmesh/testkit/nstest"
)

// TestRenderMatchesRealSave loads each render with the real
// iptables-legacy-restore into a fresh netns and checks that
// iptables-legacy-save prints every table exactly as rendered: the render is
// valid input and uses the binary's own output forms. (restore instantiates
// tables in file order, so table order is compared by the Apply test, not here.)
func TestRenderMatchesRealSave(t *testing.T) {
	nstest.NeedRoot(t)
	for _, sc := range scenarios.All {
		p, err := sc.Plan()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range families {
			t.Run(sc.Name+"/"+f.ext, func(t *testing.T) {
				text, err := Render(p, f.fam)
				if err != nil {
					t.Fatal(err)
				}
				ns, _ := nstest.New(t, "leg-")
				v6 := f.ext == "v6"
				nstest.Run(t, ns, text, restoreBin(v6))
				got := splitTables(saveTables(t, ns, v6))
				want := splitTables(text)
				if len(got) != len(want) {
					t.Errorf("save lists %d tables, render %d", len(got), len(want))
				}
				for name, w := range want {
					if got[name] != w {
						t.Errorf("table %s differs:\n%s", name, lineDiff(w, got[name]))
					}
				}
			})
		}
	}
}
