package scenarios

import "testing"

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
