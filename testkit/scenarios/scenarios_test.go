package scenarios

import (
	"strings"
	"testing"

	"github.com/nftmesh/nftmesh/redirect"
	"github.com/nftmesh/nftmesh/testkit/golden"
)

func TestAllScenariosBuildAndVerify(t *testing.T) {
	seen := map[string]bool{}
	for _, sc := range All {
		if seen[sc.Name] {
			t.Errorf("duplicate scenario %s", sc.Name)
		}
		seen[sc.Name] = true
		p, err := sc.Plan()
		if err != nil {
			t.Errorf("%s: %v", sc.Name, err)
			continue
		}
		if err := p.Verify(); err != nil {
			t.Errorf("%s: plan fails Verify: %v", sc.Name, err)
		}
	}
}

// TestPlanGoldens pins the backend-neutral plan of every scenario
// (testdata/plan/<name>.txt, redirect.Describe form).
func TestPlanGoldens(t *testing.T) {
	for _, sc := range All {
		t.Run(sc.Name, func(t *testing.T) {
			p, err := sc.Plan()
			if err != nil {
				t.Fatal(err)
			}
			golden.Check(t, "plan/"+sc.Name+".txt", "# "+sc.Doc+"\n"+strings.Join(redirect.Describe(p), "\n")+"\n")
		})
	}
}
