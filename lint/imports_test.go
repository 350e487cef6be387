// Package lint holds the project's import and exec rules as one Go test
// over the module's import graph (`go list -deps -json`) and its product
// sources. `make lint` runs it; each rule has a name, and a failure names
// the rule, the package and the import that breaks it.
package lint

import (
	"bytes"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/nftmesh/nftmesh"

// pkg is what the rules read of one package of the module.
type pkg struct {
	ImportPath     string
	Dir            string
	GoFiles        []string
	TestGoFiles    []string
	XTestGoFiles   []string
	IgnoredGoFiles []string // other platforms', or behind build tags (e2e)
	Imports        []string
	Deps           []string
}

// rel is the package's path inside the module ("" for none of ours).
func rel(path string) string {
	if path == module {
		return "."
	}
	r, ok := strings.CutPrefix(path, module+"/")
	if !ok {
		return ""
	}
	return r
}

// under reports whether module-relative path p is dir or below it.
func under(p, dir string) bool { return p == dir || strings.HasPrefix(p, dir+"/") }

// testOnly reports whether a module package is test kit (capture's
// in-memory kernel, testkit/capturetest, included), end-to-end test or
// lint: never linked into a binary, exempt from the product rules.
func testOnly(r string) bool {
	return under(r, "testkit") || under(r, "e2e") || under(r, "lint")
}

func loadPackages(t *testing.T) map[string]*pkg {
	t.Helper()
	cmd := exec.Command("go", "list", "-deps=false", "-json", "./...")
	cmd.Dir = ".."
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.String())
	}
	pkgs := map[string]*pkg{}
	dec := json.NewDecoder(bytes.NewReader(out))
	for dec.More() {
		var p pkg
		if err := dec.Decode(&p); err != nil {
			t.Fatalf("decoding go list output: %v", err)
		}
		pkgs[rel(p.ImportPath)] = &p
	}
	return pkgs
}

// layers places every product package of the module on a floor of
// docs/architecture.md: a package imports only packages on its own floor or
// below. The first matching prefix wins; the longest prefixes come first.
var layers = []struct {
	prefix string
	floor  int
	what   string
}{
	{"cmd", 7, "binaries"},
	{"installer", 6, "the node agent's library"},
	{"cniplugin", 5, "the CNI plugin"},
	{"netlab", 5, "the demo lab"},
	{"installer/podcache", 6, "the agent's pod cache"},
	{"podinfo", 4, "pod lookup and plugin config"},
	{"capture", 3, "the capture pipeline"},
	{"nft", 2, "backends"},
	{"iptables", 2, "backends"},
	{"policyroute", 2, "backends (the policy routes both program)"},
	{"podinfo/meshpod", 1, "the in-mesh decision (the model's neighbour)"},
	{"redirect", 1, "the model"},
	{"internal", 0, "leaf helpers"},
}

func floorOf(r string) (int, string, bool) {
	best := -1
	for i, l := range layers {
		if under(r, l.prefix) && (best < 0 || len(l.prefix) > len(layers[best].prefix)) {
			best = i
		}
	}
	if best < 0 {
		return 0, "", false
	}
	return layers[best].floor, layers[best].what, true
}

// rule is one named import rule over a package and the module packages and
// outside packages it imports directly (imports) or links (deps).
type rule struct {
	name  string
	why   string
	check func(r string, p *pkg) []string
}

func moduleImports(p *pkg) []string {
	var out []string
	for _, i := range p.Imports {
		if r := rel(i); r != "" {
			out = append(out, r)
		}
	}
	return out
}

func matching(list []string, re *regexp.Regexp) []string {
	var out []string
	for _, s := range list {
		if re.MatchString(s) {
			out = append(out, s)
		}
	}
	return out
}

var rules = []rule{
	{
		name: "layers",
		why:  "a package imports only packages on its own floor or below (docs/architecture.md)",
		check: func(r string, p *pkg) []string {
			f, _, ok := floorOf(r)
			if !ok || testOnly(r) {
				return nil
			}
			var bad []string
			for _, i := range moduleImports(p) {
				if fi, what, ok := floorOf(i); ok && fi > f {
					bad = append(bad, fmt.Sprintf("%s (floor %d, %s) imports %s (floor %d, %s)", r, f, layerName(r), i, fi, what))
				}
			}
			return bad
		},
	},
	{
		name: "internal-is-leaf",
		why:  "internal/ holds leaf helpers: they import no package of the module outside internal/",
		check: func(r string, p *pkg) []string {
			if !under(r, "internal") {
				return nil
			}
			var bad []string
			for _, i := range moduleImports(p) {
				if !under(i, "internal") {
					bad = append(bad, r+" imports "+i)
				}
			}
			return bad
		},
	},
	{
		name: "model-is-pure",
		why:  "the model (redirect/...) links nothing of the module outside itself, and nothing that talks to a kernel or to Kubernetes",
		check: func(r string, p *pkg) []string {
			if !under(r, "redirect") {
				return nil
			}
			var bad []string
			for _, d := range p.Deps {
				if dr := rel(d); dr != "" && !under(dr, "redirect") {
					bad = append(bad, r+" links "+d)
				}
			}
			re := regexp.MustCompile(`nftables|netlink|k8s\.io|vishvananda|golang\.org/x/sys|containernetworking`)
			for _, d := range matching(p.Deps, re) {
				bad = append(bad, r+" links "+d)
			}
			return bad
		},
	},
	{
		name: "no-test-kit-in-product",
		why:  "no product package imports the test kit, the end-to-end tests or capture's in-memory kernel",
		check: func(r string, p *pkg) []string {
			if testOnly(r) {
				return nil
			}
			var bad []string
			for _, i := range moduleImports(p) {
				if testOnly(i) {
					bad = append(bad, r+" imports "+i)
				}
			}
			return bad
		},
	},
	{
		name: "no-test-kit-in-binaries",
		why:  "no binary links the test kit, the end-to-end tests or capture's in-memory kernel",
		check: func(r string, p *pkg) []string {
			if !under(r, "cmd") {
				return nil
			}
			var bad []string
			for _, d := range p.Deps {
				if dr := rel(d); dr != "" && testOnly(dr) {
					bad = append(bad, r+" links "+d)
				}
			}
			return bad
		},
	},
	{
		name: "only-capture-drives-backends",
		why:  "every front end goes through the capture pipeline, so every write is guarded and locked",
		check: func(r string, p *pkg) []string {
			if r == "capture" || testOnly(r) {
				return nil
			}
			var bad []string
			for _, i := range moduleImports(p) {
				if i == "nft" || i == "iptables" {
					bad = append(bad, r+" imports "+i)
				}
			}
			return bad
		},
	},
	{
		name: "installer-one-way",
		why:  "installer/ may use its job packages; none of them imports installer back",
		check: func(r string, p *pkg) []string {
			if !strings.HasPrefix(r, "installer/") {
				return nil
			}
			var bad []string
			for _, i := range moduleImports(p) {
				if i == "installer" {
					bad = append(bad, r+" imports installer")
				}
			}
			return bad
		},
	},
	{
		name: "front-is-small",
		why:  "the plugin's front (nftmesh-cni) runs on every pod start before anything else: beyond the runtime, os, io, syscalls and encoding/json (it reads agent_run_dir as the plugin does; BenchmarkFrontAddAgent measured no difference) it links only the socket's wire format: no Kubernetes client, HTTP, YAML, regexp, logger, netlink or CNI library, and no net (+12 page faults per exec in every round, no fewer lines: docs/dependencies.md)",
		check: func(r string, p *pkg) []string {
			if r != "cmd/nftmesh-cni" {
				return nil
			}
			var bad []string
			re := regexp.MustCompile(`^(k8s\.io/.*|.*klog.*|.*logr.*|net|net/http|regexp|mime|log|log/slog|sigs\.k8s\.io/yaml|go\.yaml\.in/.*|gopkg\.in/yaml.*|github\.com/.*)$`)
			for _, d := range matching(p.Deps, re) {
				if d == module+"/internal/cnisock" {
					continue
				}
				bad = append(bad, r+" links "+d)
			}
			return bad
		},
	},
	{
		name: "standalone-without-typed-client",
		why:  "the standalone plugin runs when the agent is down or declines; it reads the pod with client-go's rest client and clientcmd, but links neither the typed clientset nor the API types (every group's scheme is initialised at start, milliseconds of every fallback ADD)",
		check: func(r string, p *pkg) []string {
			if r != "cmd/nftmesh-cni-standalone" {
				return nil
			}
			var bad []string
			re := regexp.MustCompile(`^(k8s\.io/client-go/kubernetes(/.*)?|k8s\.io/api/.*)$`)
			for _, d := range matching(p.Deps, re) {
				bad = append(bad, r+" links "+d)
			}
			return bad
		},
	},
}

func layerName(r string) string {
	_, what, _ := floorOf(r)
	return what
}

func TestImportRules(t *testing.T) {
	pkgs := loadPackages(t)
	// Deps of each package come from a second listing with -deps (the
	// package's whole link closure).
	cmd := exec.Command("go", "list", "-f", `{{.ImportPath}} {{join .Deps " "}}`, "./...")
	cmd.Dir = ".."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list deps: %v", err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if p := pkgs[rel(f[0])]; p != nil {
			p.Deps = f[1:]
		}
	}
	names := make([]string, 0, len(pkgs))
	for r := range pkgs {
		names = append(names, r)
	}
	sort.Strings(names)
	for _, ru := range rules {
		t.Run(ru.name, func(t *testing.T) {
			for _, r := range names {
				for _, b := range ru.check(r, pkgs[r]) {
					t.Errorf("rule %s (%s): %s", ru.name, ru.why, b)
				}
			}
		})
	}
	t.Run("every-product-package-has-a-floor", func(t *testing.T) {
		for _, r := range names {
			if _, _, ok := floorOf(r); !ok && !testOnly(r) && r != "charts" {
				t.Errorf("package %s is on no floor of the layers table: place it", r)
			}
		}
	})
}

// execAllowed lists the only product calls that start or replace a
// process: the plugin's front replaces itself with its companion binary,
// nftmesh-cni-standalone, from its own directory when the agent does not
// take the call.
var execAllowed = map[string]bool{
	"cmd/nftmesh-cni: syscall.Exec": true,
}

// execCalls are the functions that run another program.
var execCalls = map[string]bool{
	"exec.Command": true, "exec.CommandContext": true,
	"syscall.Exec": true, "syscall.ForkExec": true, "syscall.StartProcess": true,
	"unix.Exec": true, "os.StartProcess": true,
}

// TestNoExecInProduct: product code never runs a binary (nft, iptables, ip
// are the competition or test-side readers), except the front's one exec of
// its companion. It reads every non-test Go file of every product package.
func TestNoExecInProduct(t *testing.T) {
	pkgs := loadPackages(t)
	fset := token.NewFileSet()
	for r, p := range pkgs {
		if testOnly(r) {
			continue
		}
		for _, name := range p.GoFiles {
			file := filepath.Join(p.Dir, name)
			f, err := parser.ParseFile(fset, file, nil, parser.SkipObjectResolution)
			if err != nil {
				t.Fatal(err)
			}
			// Local names of the packages that hold exec calls.
			local := map[string]string{}
			for _, imp := range f.Imports {
				path, _ := strconv.Unquote(imp.Path.Value)
				short := map[string]string{"os/exec": "exec", "syscall": "syscall", "golang.org/x/sys/unix": "unix", "os": "os"}[path]
				if short == "" {
					continue
				}
				n := short
				if imp.Name != nil {
					n = imp.Name.Name
				}
				local[n] = short
			}
			ast.Inspect(f, func(n ast.Node) bool {
				sel, ok := n.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				id, ok := sel.X.(*ast.Ident)
				if !ok || local[id.Name] == "" {
					return true
				}
				call := local[id.Name] + "." + sel.Sel.Name
				if execCalls[call] && !execAllowed[r+": "+call] {
					t.Errorf("rule no-exec (product code never runs a binary): %s calls %s", fset.Position(sel.Pos()), call)
				}
				return true
			})
		}
	}
}

// threadMovers are what moves an OS thread of this process into another
// network namespace, or has a library do it on the caller's thread, by
// package and name. vishvananda/netlink's *At helpers (and its subscribe
// options' Namespace) are the trap: v1.3.1's executeInNetns drops a
// failed move back and unlocks the thread, which then serves any goroutine
// in the pod's namespace. internal/hostns (Do, DoDiscard, Create) is the
// one door: a thread that cannot come back dies there. mdlayher/netlink's
// Config.NetNS (google/nftables' WithNetNSFd) is not listed: mdlayher/socket
// v0.6.1 (as v0.5.0) keeps a thread that cannot come back locked, so it dies.
var threadMovers = map[string]map[string]bool{
	"github.com/vishvananda/netlink": {
		"NewHandleAt": true, "NewHandleAtFrom": true,
		"LinkSubscribeAt": true, "AddrSubscribeAt": true, "RouteSubscribeAt": true, "NeighSubscribeAt": true,
	},
	"github.com/vishvananda/netlink/nl": {"GetNetlinkSocketAt": true, "SubscribeAt": true},
	"github.com/vishvananda/netns":      {"Set": true, "Setns": true, "New": true, "NewNamed": true},
	"golang.org/x/sys/unix":             {"Setns": true, "Unshare": true, "SYS_SETNS": true, "SYS_UNSHARE": true},
	"syscall":                           {"Unshare": true, "SYS_SETNS": true, "SYS_UNSHARE": true},
	// ns.Do and friends: a second door. Importing it at all breaks the rule.
	"github.com/containernetworking/plugins/pkg/ns": nil,
}

// oneDoorAllowed are the test files that call a listed name themselves,
// each with why; a use not listed fails, and so does a listed one that no
// longer happens (so the list only shrinks). No product or test-kit file
// is here, and no network namespace is entered outside internal/hostns:
// the one use left tries a user namespace, to prove it is refused.
var oneDoorAllowed = map[string]string{
	"capture/userns_test.go: unix.Setns": "proves that joining a pod's user namespace is refused (EINVAL) to a Go program",
}

// oneDoorUses returns each use of a threadMovers entry in f, as
// "name: pkg.Ident" (pkg the import's last element) with its positions.
func oneDoorUses(fset *token.FileSet, name string, f *ast.File) map[string][]token.Position {
	local := map[string]string{} // local name → import path
	out := map[string][]token.Position{}
	add := func(use string, pos token.Pos) { out[use] = append(out[use], fset.Position(pos)) }
	for _, imp := range f.Imports {
		path, _ := strconv.Unquote(imp.Path.Value)
		banned, listed := threadMovers[path]
		if !listed {
			continue
		}
		short := path[strings.LastIndex(path, "/")+1:]
		n := short
		if imp.Name != nil {
			n = imp.Name.Name
		}
		if banned == nil || n == "." {
			add(name+": import "+path, imp.Pos())
			continue
		}
		local[n] = path
	}
	short := func(path string) string { return path[strings.LastIndex(path, "/")+1:] }
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.SelectorExpr:
			if id, ok := n.X.(*ast.Ident); ok {
				if path := local[id.Name]; path != "" && threadMovers[path][n.Sel.Name] {
					add(name+": "+short(path)+"."+n.Sel.Name, n.Pos())
				}
			}
		case *ast.CompositeLit:
			// netlink.LinkSubscribeOptions{Namespace: ...} and its siblings.
			sel, ok := n.Type.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			id, ok := sel.X.(*ast.Ident)
			if !ok || local[id.Name] != "github.com/vishvananda/netlink" || !strings.HasSuffix(sel.Sel.Name, "SubscribeOptions") {
				return true
			}
			for _, e := range n.Elts {
				if kv, ok := e.(*ast.KeyValueExpr); ok {
					if k, ok := kv.Key.(*ast.Ident); ok && k.Name == "Namespace" {
						add(name+": netlink."+sel.Sel.Name+".Namespace", kv.Pos())
					}
				}
			}
		}
		return true
	})
	return out
}

// TestOneDoorIntoANetns (rule one-door-into-a-netns): no Go file of the
// module, product, test kit or test, moves a thread into another network
// namespace but internal/hostns's (see threadMovers); a few tests are
// listed in oneDoorAllowed.
func TestOneDoorIntoANetns(t *testing.T) {
	pkgs := loadPackages(t)
	fset := token.NewFileSet()
	seen := map[string]bool{}
	for r, p := range pkgs {
		if r == "internal/hostns" {
			continue
		}
		for _, list := range [][]string{p.GoFiles, p.TestGoFiles, p.XTestGoFiles, p.IgnoredGoFiles} {
			for _, name := range list {
				if !strings.HasSuffix(name, ".go") {
					continue
				}
				f, err := parser.ParseFile(fset, filepath.Join(p.Dir, name), nil, parser.SkipObjectResolution)
				if err != nil {
					t.Fatal(err)
				}
				for use, at := range oneDoorUses(fset, path.Join(r, name), f) {
					if _, ok := oneDoorAllowed[use]; ok && strings.HasSuffix(name, "_test.go") {
						seen[use] = true
						continue
					}
					t.Errorf("rule one-door-into-a-netns (only internal/hostns moves a thread into another network namespace: open sockets inside hostns.Netns.Do, e.g. netlink.NewHandle there; make namespaces with hostns.Create): %s at %v", use, at)
				}
			}
		}
	}
	for use, what := range oneDoorAllowed {
		if !seen[use] {
			t.Errorf("rule one-door-into-a-netns: allowed use %q (%s) no longer happens: take it off oneDoorAllowed", use, what)
		}
	}
}

// TestOneDoorRuleCatches: the scan finds a thread mover however it is
// spelled (renamed import, dot import, a raw syscall number, a subscribe
// option), and nothing in code that only opens sockets inside hostns.
func TestOneDoorRuleCatches(t *testing.T) {
	bad := `package p
import (
	nl "github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	sc "syscall"
	. "github.com/vishvananda/netlink/nl"
	"github.com/containernetworking/plugins/pkg/ns"
)
func f(h netns.NsHandle) {
	nl.NewHandleAt(h)
	netns.Set(h)
	unix.Setns(0, unix.CLONE_NEWNET)
	unix.Syscall(unix.SYS_SETNS, 0, 0, 0)
	sc.Unshare(0)
	_ = nl.LinkSubscribeOptions{Namespace: &h}
	var g = netns.NewNamed
	_ = g
}`
	want := []string{
		"bad.go: netlink.NewHandleAt", "bad.go: netns.Set", "bad.go: unix.Setns", "bad.go: unix.SYS_SETNS",
		"bad.go: syscall.Unshare", "bad.go: netlink.LinkSubscribeOptions.Namespace", "bad.go: netns.NewNamed",
		"bad.go: import github.com/vishvananda/netlink/nl", "bad.go: import github.com/containernetworking/plugins/pkg/ns",
	}
	good := `package p
import (
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)
func f(n interface{ Do(func() error) error }, path string) (h *netlink.Handle, err error) {
	err = n.Do(func() (err error) { h, err = netlink.NewHandle(unix.NETLINK_ROUTE); return err })
	ns, _ := netns.GetFromPath(path)
	_ = netlink.NsFd(int(ns))
	_ = netlink.LinkSubscribeOptions{ListExisting: true}
	return h, err
}`
	fset := token.NewFileSet()
	for _, tc := range []struct {
		name, src string
		want      []string
	}{{"bad.go", bad, want}, {"good.go", good, nil}} {
		f, err := parser.ParseFile(fset, tc.name, tc.src, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		got := oneDoorUses(fset, tc.name, f)
		var names []string
		for use := range got {
			names = append(names, use)
		}
		sort.Strings(names)
		sorted := append([]string(nil), tc.want...)
		sort.Strings(sorted)
		if strings.Join(names, "\n") != strings.Join(sorted, "\n") {
			t.Errorf("%s: found\n\t%s\nwant\n\t%s", tc.name, strings.Join(names, "\n\t"), strings.Join(sorted, "\n\t"))
		}
	}
}
