package main

import (
	"bytes"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"

	"github.com/nftmesh/nftmesh/capture/capturetest"
	"github.com/nftmesh/nftmesh/internal/version"
	"github.com/nftmesh/nftmesh/redirect"
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

// TestCLIOneCommandTreeSameOutput: a run that starts with a command's name
// gets a tree holding that command alone (newRootFor); whatever it is
// asked (help, bad flags, bad values, extra arguments, real work against
// the in-memory kernel), it prints the same and exits the same as with the
// whole tree.
func TestCLIOneCommandTreeSameOutput(t *testing.T) {
	pods := filepath.Join("..", "..", "testdata", "pods")
	injected := filepath.Join(pods, "injected.yaml")
	var cases [][]string
	for _, c := range commands {
		for _, tail := range [][]string{{"--help"}, {"-h"}, {}, {"--bogus"}, {"extra"}, {"--version"}, {"--format", "json"}, {"--netns"}} {
			if c.name == "demo" && len(tail) == 0 {
				continue // builds real namespaces with random names
			}
			cases = append(cases, append([]string{c.name}, tail...))
		}
	}
	cases = append(cases,
		[]string{"render"},
		[]string{"render", "--ipv6", "-o", "json"},
		[]string{"render", "-o", "iptables", "--pod", injected},
		[]string{"render", "-a", redirect.AnnotationExcludeOutboundIPRanges + "=10.0.0.1"},
		[]string{"render", "-f", "json"},
		[]string{"validate", "--pod", injected, "-o", "json"},
		[]string{"validate", "-a", "traffic.sidecar.istio.io/excludeOutboundIPRange=10.0.0.0/8"},
		[]string{"trace", "--defaults", "out", "93.184.216.34:443"},
		[]string{"trace", "--defaults", "-o", "json", "in", "10.0.0.1:8080"},
		[]string{"apply", "--defaults"},
		[]string{"apply", "--netns", "no-such-netns-here", "--defaults"},
		[]string{"apply", "--netns", fakeNetns, "--defaults", "--backend", "bogus"},
		[]string{"apply", "--netns", fakeNetns, "--defaults", "--pod", injected},
		[]string{"apply", "--netns", fakeNetns, "--run-dir", "RUNDIR", "--defaults"},
		[]string{"apply", "--netns", fakeNetns, "--run-dir", "RUNDIR", "--pod", injected, "--backend", "iptables-legacy"},
		[]string{"inspect", "--netns", fakeNetns, "--run-dir", "RUNDIR"},
		[]string{"inspect", "--netns", fakeNetns, "--run-dir", "RUNDIR", "--pod", injected, "-o", "json"},
		[]string{"clean", "--netns", fakeNetns, "--run-dir", "RUNDIR"},
		[]string{"clean", "--netns", fakeNetns, "--run-dir", "RUNDIR", "--backend", "iptables-legacy"},
	)
	runWith := func(t *testing.T, whole bool, args []string) (int, string, string) {
		return runFake(t, args, func(args []string, out, errOut io.Writer) int {
			if whole {
				return runTree(newRoot(), args, out, errOut)
			}
			return run(args, out, errOut)
		})
	}
	for _, args := range cases {
		if got := newRootFor(args).Commands(); len(got) != 1 || got[0].Name() != args[0] {
			t.Fatalf("the tree for %v holds %d commands, want %s alone", args, len(got), args[0])
		}
		wantCode, wantOut, wantErr := runWith(t, true, args)
		code, out, errOut := runWith(t, false, args)
		if code != wantCode || out != wantOut || errOut != wantErr {
			t.Errorf("redirect %s with its command alone: exit %d, stdout:\n%s\nstderr:\n%s\nwith the whole tree: exit %d, stdout:\n%s\nstderr:\n%s",
				strings.Join(args, " "), code, out, errOut, wantCode, wantOut, wantErr)
		}
	}
	// Anything else gets the whole tree (help, completion, the shell's
	// __complete, a flag before the command, an unknown command).
	for _, args := range [][]string{nil, {"--help"}, {"help", "apply"}, {"completion", "bash"}, {"__complete", "apply", "--backend", ""}, {"--version"}, {"-h", "apply"}, {"aply"}} {
		if got := len(newRootFor(args).Commands()); got != len(commands) {
			t.Errorf("the tree for %q holds %d commands, want all %d", args, got, len(commands))
		}
	}
}

// took is the only text that may differ between two runs of a command:
// how long it took.
var took = regexp.MustCompile(`[0-9.]+(ns|µs|ms|s)\b`)

// runFake runs args with fn against the in-memory kernel holding
// fakeNetns, with RUNDIR in args replaced by a temporary directory (and
// back in stderr), and returns the exit code, stdout and stderr with the
// times taken replaced by TOOK.
func runFake(t *testing.T, args []string, fn func(args []string, out, errOut io.Writer) int) (int, string, string) {
	t.Helper()
	f := capturetest.New()
	f.AddNetns(fakeNetns, netip.MustParseAddr("198.51.100.7"))
	old := pipeline
	pipeline = f.Pipeline()
	defer func() { pipeline = old }()
	dir := t.TempDir()
	args = append([]string(nil), args...)
	for i := range args {
		if args[i] == "RUNDIR" {
			args[i] = dir
		}
	}
	var out, errb bytes.Buffer
	code := fn(args, &out, &errb)
	e := strings.ReplaceAll(errb.String(), dir, "RUNDIR")
	return code, out.String(), took.ReplaceAllString(e, "TOOK")
}

// TestCLIDirectSameOutput: a command line runDirect takes (a command of
// direct and its own flags, nothing else) prints the same and exits the
// same as through the whole command tree; one it does not take, it leaves
// untouched (nothing printed) for the tree. The usual command lines of the
// kernel verbs and of render are taken.
func TestCLIDirectSameOutput(t *testing.T) {
	injected := filepath.Join("..", "..", "testdata", "pods", "injected.yaml")
	var cases [][]string
	for _, c := range commands {
		for _, tail := range [][]string{{"--help"}, {"-h"}, {"--help=false"}, {}, {"--bogus"}, {"extra"}, {"--"}, {"--", "extra"},
			{"--version"}, {"-v"}, {"--format", "json"}, {"--format=plan", "--ipv6"}, {"-o"}, {"--netns"}, {"--defaults", "-h"}} {
			if c.name == "demo" && (len(tail) == 0 || tail[0] == "--" || tail[0] == "--help=false") {
				continue // builds real namespaces with random names
			}
			cases = append(cases, append([]string{c.name}, tail...))
		}
	}
	taken := [][]string{
		{"render"},
		{"render", "--ipv6", "-o", "json"},
		{"render", "-f", injected, "-o", "iptables"},
		{"render", "--format", "plan"},
		{"render", "-f", "json"},
		{"render", "-a", "bogus"},
		{"validate", "--pod", injected, "-o", "json"},
		{"validate", "-a", "traffic.sidecar.istio.io/excludeOutboundIPRange=10.0.0.0/8"},
		{"apply", "--defaults"},
		{"apply", "--netns", "no-such-netns-here", "--defaults"},
		{"apply", "--netns", fakeNetns, "--defaults", "--backend", "bogus"},
		{"apply", "--netns", fakeNetns, "--run-dir", "RUNDIR", "--defaults", "--ipv6"},
		{"apply", "--netns", fakeNetns, "--run-dir", "RUNDIR", "--pod", injected, "--backend", "iptables-legacy"},
		{"apply", "--netns", fakeNetns, "--run-dir", "RUNDIR", "--pod", injected, "--proxy-uid", "7"},
		{"inspect", "--netns", fakeNetns, "--run-dir", "RUNDIR"},
		{"inspect", "--netns", fakeNetns, "--run-dir", "RUNDIR", "--pod", injected, "-o", "json"},
		{"clean", "--netns", fakeNetns, "--run-dir", "RUNDIR"},
		{"clean", "--netns", fakeNetns, "--run-dir", "RUNDIR", "--backend", "iptables-legacy"},
		{"clean", "--netns=" + fakeNetns, "--run-dir=RUNDIR"},
	}
	ranDirect := map[string]bool{}
	for _, args := range append(cases, taken...) {
		var ok bool
		code, out, errOut := runFake(t, args, func(args []string, out, errOut io.Writer) int {
			var code int
			code, ok = runDirect(args, out, errOut)
			return code
		})
		ranDirect[strings.Join(args, " ")] = ok
		if !ok {
			if out != "" || errOut != "" {
				t.Errorf("redirect %s: runDirect left it to the tree but printed stdout %q, stderr %q", strings.Join(args, " "), out, errOut)
			}
			continue
		}
		wantCode, wantOut, wantErr := runFake(t, args, func(args []string, out, errOut io.Writer) int {
			return runTree(newRoot(), args, out, errOut)
		})
		if code != wantCode || out != wantOut || errOut != wantErr {
			t.Errorf("redirect %s run directly: exit %d, stdout:\n%s\nstderr:\n%s\nthrough the command tree: exit %d, stdout:\n%s\nstderr:\n%s",
				strings.Join(args, " "), code, out, errOut, wantCode, wantOut, wantErr)
		}
	}
	for _, args := range taken {
		if !ranDirect[strings.Join(args, " ")] {
			t.Errorf("redirect %s: not run directly", strings.Join(args, " "))
		}
	}
	for _, args := range [][]string{{"apply", "--help"}, {"apply", "--defaults", "extra"}, {"trace", "--defaults", "out", "10.0.0.1:80"}, {"demo", "--help"}, {"--version"}, {}} {
		if _, ok := runDirect(args, io.Discard, io.Discard); ok {
			t.Errorf("redirect %s: run directly, want it left to the command tree", strings.Join(args, " "))
		}
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
		old := newRootFor(args)
		old.SetVersionTemplate(version.Line("redirect") + "\n")
		var oldOut, oldErr, out, errOut bytes.Buffer
		oldCode := runTree(old, args, &oldOut, &oldErr)
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
