package main

import (
	"testing"

	"github.com/nftmesh/nftmesh/internal/version"
)

// TestCLICommandNames: each entry of commands builds the command of its
// name, and the whole tree holds each once (cobra adds its help and
// completion commands when it runs).
func TestCLICommandNames(t *testing.T) {
	for _, c := range commands {
		if got := c.build().Name(); got != c.name {
			t.Errorf("commands entry %q builds the command %q", c.name, got)
		}
	}
	var names []string
	for _, c := range newRoot().Commands() {
		names = append(names, c.Name())
	}
	if len(names) != len(commands) {
		t.Errorf("the whole tree holds %v, want the %d commands", names, len(commands))
	}
}

// TestCLIVersionAsTemplate: --version prints version.Line (cobra renders
// it from the root's version template).
func TestCLIVersionAsTemplate(t *testing.T) {
	if code, out, errOut := runCLI(t, "--version"); code != exitOK || out != version.Line("redirect")+"\n" || errOut != "" {
		t.Errorf("--version: exit %d, stdout %q, stderr %q; want %q", code, out, errOut, version.Line("redirect")+"\n")
	}
}
