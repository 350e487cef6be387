package main

import (
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/nftmesh/nftmesh/internal/version"
)

// TestCLICommandNames: the tree holds each command once (cobra adds its
// help and completion commands when it runs).
func TestCLICommandNames(t *testing.T) {
	var names []string
	for _, c := range newRoot().Commands() {
		names = append(names, c.Name())
	}
	want := []string{"apply", "clean", "demo", "inspect", "render", "trace", "validate", "version"}
	if !slices.Equal(names, want) {
		t.Errorf("the tree holds %v, want %v", names, want)
	}
}

// TestCLIVersionLine: --version and -v print cobra's own line, the
// program, "version" and version.Build (the version, the toolchain and the
// platform), rendered without a version template (TestBinaryPrunesMethods).
func TestCLIVersionLine(t *testing.T) {
	want := "redirect version " + version.Build() + "\n"
	for _, arg := range []string{"--version", "-v"} {
		if code, out, errOut := runCLI(t, arg); code != exitOK || out != want || errOut != "" {
			t.Errorf("%s: exit %d, stdout %q, stderr %q; want %q", arg, code, out, errOut, want)
		}
	}
}

// TestBinaryPrunesMethods: the redirect binary links none of the
// reflection that calls methods by name (text/template's evaluation,
// reached through a cobra template setter such as SetVersionTemplate):
// with it the linker keeps every exported method of every type that
// reaches an interface, 8.3 instead of 6.0 MB, and every run pays for it
// at start-up (see newRoot's Version).
func TestBinaryPrunesMethods(t *testing.T) {
	out, err := exec.Command("go", "tool", "nm", cliBinary(t)).Output()
	if err != nil {
		t.Fatalf("go tool nm: %v", err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) == 3 && strings.HasPrefix(f[2], "text/template.(*state).evalCall") {
			t.Fatalf("the binary links %s: a text/template is executed somewhere (a cobra Set*Template?)", f[2])
		}
	}
}
