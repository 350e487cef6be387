// Package version holds the one version string every nftmesh binary reports
// (`--version`, the CNI plugin's about line, the agent's start log) and the
// image's labels and tag carry. The Makefile stamps it at link time from
// `git describe --tags --always --dirty`:
//
//	-ldflags "-X github.com/nftmesh/nftmesh/internal/version.Version=v0.2.0-3-gabcdef0"
//
// It imports nothing outside the standard library, so any binary or tool can
// use it without pulling in a dependency.
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Version is set by the linker; empty when the build did not stamp it.
var Version = ""

// Get returns the stamped version; for a build that did not stamp it, the
// module version `go install ...@vX.Y.Z` records, else "dev".
func Get() string {
	if Version != "" {
		return Version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "dev"
}

// Line is what `--version` prints: the program, its version, and the Go
// toolchain and platform it was built with.
func Line(program string) string { return program + " " + Build() }

// Build is the version and the Go toolchain and platform it was built
// with, "v0.2.0 (go1.26.1 linux/amd64)": Line without the program, for a
// command line library that prints the program itself (cobra's
// "redirect version ...").
func Build() string {
	return fmt.Sprintf("%s (%s %s/%s)", Get(), runtime.Version(), runtime.GOOS, runtime.GOARCH)
}
