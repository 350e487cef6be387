package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
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

// TestCLIVersionAsTemplate: --version prints version.Line, the same as
// cobra rendering it from a version template (what redirect did before
// versionWriter), and every way of asking for it, or of mixing it with
// help, commands and bad flags, prints and exits the same both ways.
func TestCLIVersionAsTemplate(t *testing.T) {
	if code, out, errOut := runCLI(t, "--version"); code != exitOK || out != version.Line("redirect")+"\n" || errOut != "" {
		t.Errorf("--version: exit %d, stdout %q, stderr %q; want %q", code, out, errOut, version.Line("redirect")+"\n")
	}
	for _, args := range [][]string{
		{"--version"}, {"-v"}, {"--version", "--help"}, {"-h", "-v"}, {"-v", "-h"}, {"--version=false"}, {"--version=true"},
		{"--version", "apply"}, {"--version", "extra"}, {"--version", "apply", "render"}, {"-v", "render"}, {"apply", "--version"},
		{"render", "-v"}, {"--version", "--bogus"}, {"help"}, {"help", "--version"}, {"help", "-v"}, {"--help"}, {},
		{"__complete", "--"}, {"__complete", "-"}, {"__complete", "--version", ""}, {"__complete", "-v", ""}, {"version"},
		{"render", "-o", "plan"},
	} {
		old := newRoot()
		old.SetVersionTemplate(version.Line("redirect") + "\n")
		var oldOut, oldErr, out, errOut bytes.Buffer
		old.SetArgs(args)
		old.SetOut(&oldOut)
		old.SetErr(&oldErr)
		cmd, err := old.ExecuteC()
		oldCode := exitCode(cmd, err, &oldErr)
		code := run(args, &out, &errOut)
		if code != oldCode || out.String() != oldOut.String() || errOut.String() != oldErr.String() {
			t.Errorf("redirect %q: exit %d, stdout %q, stderr %q; with a version template: exit %d, stdout %q, stderr %q",
				args, code, out.String(), errOut.String(), oldCode, oldOut.String(), oldErr.String())
		}
	}
}

// TestBinaryPrunesMethods: the redirect binary links none of the
// reflection that calls methods by name (text/template's, reached through
// a cobra template setter such as SetVersionTemplate): with it the linker
// keeps every exported method of every type that reaches an interface, a
// third more binary to load at every run (see versionWriter). Nor net's
// name resolver, which no command needs (every address is a literal) and
// which a dial or listen by address string would bring (200 KB, mapped
// and unmapped by every run).
func TestBinaryPrunesMethods(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := filepath.Join(t.TempDir(), "redirect")
	build := exec.Command("go", "build", "-trimpath", "-o", bin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building redirect: %v\n%s", err, out)
	}
	out, err := exec.Command("go", "tool", "nm", bin).Output()
	if err != nil {
		t.Fatalf("go tool nm: %v", err)
	}
	// Before Go 1.26 netlab dials by address string (see its dial.go).
	typedDial := !strings.HasPrefix(runtime.Version(), "go1.25")
	resolver := false
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 {
			continue
		}
		if f[2] == "reflect.Value.Method" || f[2] == "reflect.Value.MethodByName" {
			t.Errorf("the binary links %s: something (a cobra Set*Template, text/template) calls methods by reflection, and the linker then keeps every exported method", f[2])
		}
		resolver = resolver || strings.HasPrefix(f[2], "net.(*Resolver).")
	}
	if typedDial && resolver {
		t.Errorf("the binary links net's name resolver: something dials or listens by address string (netlab dials and listens by netip address so that it does not)")
	}
}
