// Package version holds the one version string every nftmesh binary reports
// (`--version`, `redirect version`, the CNI plugin's about line, the agent's
// start log) and the image's labels and tag and the chart carry. The
// Makefile stamps it at link time: vX.Y.Z at a release tag, a development
// version vX.Y.Z-dev.N.gHASH[.dirty] anywhere else (tools/release/version.sh,
// docs/releasing.md):
//
//	-ldflags "-X github.com/nftmesh/nftmesh/internal/version.Version=v0.2.0-dev.3.gabcdef0"
//
// It imports only the standard library.
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

// Build is Line without the program, "v0.2.0 (go1.26.1 linux/amd64)", for
// cobra, which prints the program itself.
func Build() string {
	return fmt.Sprintf("%s (%s %s/%s)", Get(), runtime.Version(), runtime.GOOS, runtime.GOARCH)
}
