package meshpod

import "testing"

func TestDecideNil(t *testing.T) {
	if _, _, _, err := Decide(nil); err == nil {
		t.Error("Decide(nil) should be an error")
	}
}
