package version

import (
	"strings"
	"testing"
)

func TestGetPrefersTheStampedVersion(t *testing.T) {
	old := Version
	t.Cleanup(func() { Version = old })

	Version = "v1.2.3-dev.4.gabcdef0.dirty"
	if got := Get(); got != Version {
		t.Errorf("Get() = %q, want the stamped %q", got, Version)
	}
	if got := Line("redirect"); !strings.HasPrefix(got, "redirect v1.2.3-dev.4.gabcdef0.dirty (go") {
		t.Errorf("Line() = %q, want it to start with the program, the version and the toolchain", got)
	}

	// A test binary has no module version: unstamped means "dev".
	Version = ""
	if got := Get(); got != "dev" {
		t.Errorf("unstamped Get() = %q, want dev", got)
	}
}
