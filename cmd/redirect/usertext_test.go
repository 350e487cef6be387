package main

// What a user reads: errors for bad input, the names of chains, counts,
// JSON documents and help texts, each as a new user meets them.

import (
	"encoding/json"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/nftmesh/nftmesh/capture"
	"github.com/nftmesh/nftmesh/redirect"
	"github.com/nftmesh/nftmesh/testkit/golden"
)

// TestCLIUserInputErrors: bad or missing input is refused with exit 2 and
// one line that says what is wrong in the user's terms: which file is
// empty, what shape the input has, the flag that picks among candidates,
// the object as kubectl names it; never a Go type or a "/NAME".
func TestCLIUserInputErrors(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	empty := write("empty.yaml", "")
	comments := write("comments.yaml", "# the pod goes here\n---\n")
	array := write("pods.json", `[{"apiVersion":"v1","kind":"Pod","metadata":{"name":"web"}}]`)
	badField := write("bad-field.yaml", "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\n  annotations: [a, b]\n")
	deployment := "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: httpbin\nspec:\n  template:\n    metadata:\n      annotations:\n        sidecar.istio.io/status: '{}'\n%s    spec:\n      containers:\n      - name: istio-proxy\n        args: [proxy, sidecar]\n"
	noNamespace := write("httpbin.yaml", strings.NewReplacer("        sidecar.istio.io/status: '{}'\n", "", "%s", "").Replace(deployment))
	badAnnotation := write("httpbin-bad.yaml", strings.Replace(deployment, "%s", "        traffic.sidecar.istio.io/excludeInboundPorts: abc\n", 1))
	two := write("two.yaml", meshPodDoc("shop", "web-a")+"---\n"+meshPodDoc("shop", "web-b"))
	noInput := []string{"--defaults", "--pod FILE", "--annotation"}

	for _, tc := range []struct {
		name          string
		args          []string
		stdin         string
		piped         bool
		code          int
		mention, none []string
	}{
		{"empty file", []string{"validate", "-f", empty}, "", false, exitUsage, []string{"reading pod manifest " + empty + ": the file is empty"}, []string{"without kind"}},
		{"file of comments", []string{"render", "-f", comments}, "", false, exitUsage, []string{comments, "the file holds no object"}, []string{"without kind"}},
		{"empty standard input", []string{"render", "-f", "-"}, "", true, exitUsage, []string{"standard input is empty"}, []string{"without kind"}},
		{"JSON array", []string{"render", "-f", array}, "", false, exitUsage, []string{array, "the manifest is a list, not an object", "kind: List"}, goLeaks},
		{"field of the wrong shape", []string{"render", "-f", badField}, "", false, exitUsage, []string{"metadata.annotations is a list, want a map of strings"}, goLeaks},
		{"workload without a namespace", []string{"validate", "-f", noNamespace}, "", false, exitNotInMesh, []string{"Deployment httpbin is not in the mesh"}, []string{"/httpbin"}},
		{"workload without a namespace, bad annotation", []string{"validate", "-f", badAnnotation}, "", false, exitUsage,
			[]string{"reading capture settings of Deployment httpbin: ", `"abc"`}, []string{"/httpbin"}},
		{"two pods", []string{"render", "-f", two}, "", false, exitUsage, []string{"2 Pods", `"shop/web-a"`, `"shop/web-b"`, "choose one with --name"}, nil},
		{"render without input", []string{"render"}, "", false, exitUsage, noInput, []string{"--pod -"}},
		{"validate without input", []string{"validate"}, "", false, exitUsage, noInput, nil},
		{"trace without input", []string{"trace", "out", "10.0.0.5:443"}, "", false, exitUsage, noInput, nil},
		{"render with a manifest piped but no --pod -", []string{"render"}, meshPodDoc("shop", "web-a"), true, exitUsage, append(noInput, "standard input is read only with --pod -"), nil},
		{"validate of proxy flags alone", []string{"validate", "--dns-capture"}, "", false, exitUsage, noInput, nil},
		{"trace without arguments", []string{"trace", "--defaults"}, "", false, exitUsage, []string{"direction (out or in) and DST_IP:PORT; got none"}, []string{"(s)"}},
		{"trace with one argument", []string{"trace", "--defaults", "out"}, "", false, exitUsage, []string{"got 1 argument"}, []string{"(s)", "1 arguments"}},
		{"trace with three arguments", []string{"trace", "--defaults", "out", "10.0.0.5:443", "x"}, "", false, exitUsage, []string{"got 3 arguments"}, []string{"(s)"}},
		{"inspect with two pods", []string{"inspect", "shop/a", "shop/b"}, "", false, exitUsage, []string{"one pod, NAMESPACE/NAME", `"shop/a shop/b"`}, []string{"arg(s)"}},
		{"an argument to a command without", []string{"version", "extra"}, "", false, exitUsage, []string{"version takes no arguments", `"extra"`}, []string{"unknown command"}},
		{"a flag without its value", []string{"render", "-a"}, "", false, exitUsage, []string{"--annotation needs a value (key=value)"}, []string{"'a' in -a"}},
		{"a bool flag's bad value", []string{"render", "--defaults", "--ipv6=maybe"}, "", false, exitUsage, []string{`--ipv6 "maybe": want true or false`}, []string{"strconv"}},
		{"an unknown flag", []string{"render", "--annotations", "x=y"}, "", false, exitUsage, []string{"unknown flag: --annotations", "redirect render --help"}, nil},
		{"a directory for a file", []string{"render", "-f", dir}, "", false, exitUsage, []string{dir + ": a directory, not a file"}, []string{"read " + dir}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stdin = strings.NewReader(tc.stdin)
			old := stdinPiped
			stdinPiped = func() bool { return tc.piped }
			defer func() { stdin, stdinPiped = os.Stdin, old }()
			code, out, errOut := runCLI(t, tc.args...)
			if code != tc.code {
				t.Fatalf("exit %d, want %d (stderr %q)", code, tc.code, errOut)
			}
			if out != "" {
				t.Errorf("stdout on error: %q", out)
			}
			if strings.Count(strings.TrimSpace(errOut), "\n") != 0 {
				t.Errorf("error is not one line: %q", errOut)
			}
			for _, m := range tc.mention {
				if !strings.Contains(errOut, m) {
					t.Errorf("stderr %q does not say %q", errOut, m)
				}
			}
			for _, m := range tc.none {
				if strings.Contains(errOut, m) {
					t.Errorf("stderr %q says %q", errOut, m)
				}
			}
		})
	}
	// A manifest piped in with --pod - still works, as do --defaults.
	stdin = strings.NewReader(meshPodDoc("shop", "web-a"))
	defer func() { stdin = os.Stdin }()
	for _, args := range [][]string{{"render", "--pod", "-"}, {"render", "--defaults"}, {"validate", "--defaults"}} {
		if code, _, errOut := runCLI(t, args...); code != exitOK {
			t.Errorf("%v: exit %d: %s", args, code, errOut)
		}
	}
}

// goLeaks are pieces of Go's error texts that name Go types.
var goLeaks = []string{"Go value", "Go struct", "typeHead", "manifest.", "meshpod.", "map[string]", "json: cannot"}

// TestCLIChainNamesAgree: every chain render -o plan and -o json, trace
// (text and JSON) and a jump in any of them names is a chain of render's
// nft output, which is what nft list ruleset shows in the pod.
func TestCLIChainNamesAgree(t *testing.T) {
	specs := [][]string{
		{"--defaults", "--ipv6", "--dns-capture", "--drop-invalid"},
		{"-a", redirect.AnnotationInterceptionMode + "=TPROXY", "--ipv6"},
	}
	for _, spec := range specs {
		_, nftOut, _ := runCLI(t, append([]string{"render", "-o", "nft"}, spec...)...)
		chains := map[string]bool{}
		for _, m := range regexp.MustCompile(`(?m)^\tchain (\S+) \{$`).FindAllStringSubmatch(nftOut, -1) {
			chains[m[1]] = true
		}
		if len(chains) < 5 {
			t.Fatalf("render -o nft %v: %d chains:\n%s", spec, len(chains), nftOut)
		}
		named := map[string]string{} // chain → where it was named
		jumps := regexp.MustCompile(`jump (\S+)`)
		addJumps := func(where, text string) {
			for _, m := range jumps.FindAllStringSubmatch(text, -1) {
				named[strings.TrimSuffix(m[1], `"`)] = where + " (jump)"
			}
		}
		_, plan, _ := runCLI(t, append([]string{"render", "-o", "plan"}, spec...)...)
		for _, m := range regexp.MustCompile(`(?m)^(?:chain|rule) ([^ :\n]+)`).FindAllStringSubmatch(plan, -1) {
			named[m[1]] = "render -o plan"
		}
		addJumps("render -o plan", plan)
		_, js, _ := runCLI(t, append([]string{"render", "-o", "json"}, spec...)...)
		var doc struct {
			Tables []struct {
				Chains []struct {
					Name  string
					Rules []struct{ Verdict map[string]any }
				}
			}
		}
		if err := json.Unmarshal([]byte(js), &doc); err != nil {
			t.Fatal(err)
		}
		for _, tb := range doc.Tables {
			for _, c := range tb.Chains {
				named[c.Name] = "render -o json"
				for _, r := range c.Rules {
					if to, ok := r.Verdict["chain"].(string); ok {
						named[to] = "render -o json (jump)"
					}
				}
			}
		}
		for _, pkt := range [][]string{{"--src", "198.51.100.7", "out", "203.0.113.9:443"}, {"--src", "198.51.100.7", "--proto", "udp", "out", "10.96.0.10:53"}, {"in", "198.51.100.7:8080"}, {"--uid", "1337", "out", "127.0.0.6:15002"}} {
			args := append(append([]string{"trace"}, spec...), pkt...)
			code, text, errOut := runCLI(t, args...)
			if code != exitOK {
				t.Fatalf("%v: exit %d: %s", args, code, errOut)
			}
			for _, m := range regexp.MustCompile(`(?m)^  (\S.*)$`).FindAllStringSubmatch(text, -1) {
				named[m[1]] = "trace"
			}
			addJumps("trace", text)
			_, jt, _ := runCLI(t, append([]string{"trace", "-o", "json"}, args[1:]...)...)
			var tr struct {
				Steps []struct{ Chain, Text string }
			}
			if err := json.Unmarshal([]byte(jt), &tr); err != nil {
				t.Fatal(err)
			}
			for _, s := range tr.Steps {
				named[s.Chain] = "trace -o json"
				addJumps("trace -o json", s.Text)
			}
		}
		for name, where := range named {
			if !chains[name] {
				t.Errorf("%s %v names chain %q, which render -o nft (nft list ruleset) does not have", where, spec, name)
			}
		}
	}
}

// TestCLIJSONUnescaped: no -o json document escapes "<", ">" or "&" for
// HTML: a rule reads "-> jump ...", not "-\u003e jump ...".
func TestCLIJSONUnescaped(t *testing.T) {
	f := withFake(t, netip.MustParseAddr("198.51.100.7"))
	runDir := t.TempDir()
	if code, _, errOut := runCLI(t, "apply", "--netns", fakeNetns, "--run-dir", runDir, "--defaults"); code != exitOK {
		t.Fatalf("apply: exit %d: %s", code, errOut)
	}
	f.Tamper(fakeNetns, capture.NFTables, func(p *redirect.Plan) {
		c := &p.Tables[0].Chains[0]
		c.Rules = c.Rules[1:]
	})
	for _, args := range [][]string{
		{"render", "--defaults", "-o", "json"},
		{"validate", "-a", redirect.AnnotationIncludeInboundPorts + "=<80&>", "-o", "json"},
		{"trace", "--defaults", "-o", "json", "out", "10.0.0.5:443"},
		{"inspect", "--netns", fakeNetns, "--run-dir", runDir, "-a", redirect.AnnotationInterceptionMode + "=REDIRECT", "-o", "json"},
		{"inspect", "--netns", fakeNetns, "--run-dir", runDir, "-o", "json"},
	} {
		_, out, errOut := runCLI(t, args...)
		if !json.Valid([]byte(out)) {
			t.Errorf("%v: not one JSON document: %q %q", args, out, errOut)
			continue
		}
		for _, esc := range []string{`\u003c`, `\u003e`, `\u0026`} {
			if strings.Contains(out, esc) {
				t.Errorf("%v escapes for HTML (%s):\n%s", args, esc, out)
			}
		}
		if (args[0] == "trace" || args[0] == "inspect" && slices.Contains(args, "-a")) && !strings.Contains(out, "->") {
			t.Errorf("%v: no rule with -> in it:\n%s", args, out)
		}
		if args[0] == "validate" && !strings.Contains(out, `"<80&>"`) {
			t.Errorf("%v: the bad value is not shown as given:\n%s", args, out)
		}
	}
}

// TestCLIValidateText pins validate's report (testdata/cli/validate-*.txt):
// each port once, merged into ranges as the plan's set holds them (the
// annotation's 15020 is not repeated beside the three Istio always
// excludes), IDs as numbers, counts in agreement ("1 table").
func TestCLIValidateText(t *testing.T) {
	for name, args := range map[string][]string{
		"defaults":              {"--defaults"},
		"exclude-inbound-ports": {"-a", redirect.AnnotationExcludeInboundPorts + "=15020,8081,8080,15020", "-a", redirect.AnnotationExcludeOutboundPorts + "=9090,9091,15020"},
		"include-inbound-ports": {"-a", redirect.AnnotationIncludeInboundPorts + "=9080,80", "-a", redirect.AnnotationExcludeInboundPorts + "=8080", "--proxy-uid", "1337,1338"},
		"tproxy":                {"-a", redirect.AnnotationInterceptionMode + "=TPROXY", "--ipv6"},
	} {
		code, out, errOut := runCLI(t, append([]string{"validate"}, args...)...)
		if code != exitOK {
			t.Fatalf("%s: exit %d: %s", name, code, errOut)
		}
		golden.Check(t, "cli/validate-"+name+".txt", out)
		if regexp.MustCompile(`\b1 [a-z]+s\b`).MatchString(out) || strings.Contains(out, "[") || strings.Contains(out, "+ 15020") {
			t.Errorf("%s: a plural after 1, a Go slice or a repeated port:\n%s", name, out)
		}
	}
}

// TestCLITraceGolden pins trace's text and JSON (testdata/cli/trace-*):
// the chains as render names them, "->" unescaped.
func TestCLITraceGolden(t *testing.T) {
	for name, args := range map[string][]string{
		"out":        {"--defaults", "out", "203.0.113.9:443"},
		"in-tproxy":  {"-a", redirect.AnnotationInterceptionMode + "=TPROXY", "in", "198.51.100.7:8080"},
		"dns":        {"--defaults", "--dns-capture", "--proto", "udp", "out", "10.96.0.10:53"},
		"proxy-self": {"--defaults", "--uid", "1337", "out", "127.0.0.6:15002"},
	} {
		for _, format := range []string{"text", "json"} {
			code, out, errOut := runCLI(t, append([]string{"trace", "-o", format}, args...)...)
			if code != exitOK {
				t.Fatalf("%s: exit %d: %s", name, code, errOut)
			}
			golden.Check(t, "cli/trace-"+name+"."+format, out)
		}
	}
}

// TestFakeCleanCounts: clean's summary agrees in number ("1 rule in 1
// chain, 1 set").
func TestFakeCleanCounts(t *testing.T) {
	f := withFake(t, netip.MustParseAddr("198.51.100.7"))
	tcp := redirect.MatchProto{Proto: redirect.ProtoTCP}
	f.Install(fakeNetns, capture.NFTables, redirect.Plan{
		Sets: []redirect.Set{{Name: "ports", Kind: redirect.SetPort, Ports: []uint16{8080}}},
		Tables: []redirect.Table{{Name: redirect.TableNat, Chains: []redirect.Chain{{
			Name: redirect.ChainOutput, Hook: redirect.HookOutput, Type: redirect.ChainTypeNat, Priority: redirect.PriorityNat,
			Rules: []redirect.Rule{{Matches: []redirect.Match{tcp, redirect.MatchSet{Set: "ports", Kind: redirect.SetPort}}, Verdict: redirect.Return{}}},
		}}}},
	})
	code, _, errOut := runCLI(t, "clean", "--netns", fakeNetns, "--run-dir", t.TempDir())
	if code != exitOK || !strings.Contains(errOut, "(1 rule in 1 chain, 1 set)") {
		t.Errorf("clean: exit %d, %q; want (1 rule in 1 chain, 1 set)", code, errOut)
	}
}

// TestCLIHelp pins every command's --help (testdata/cli/help/*.txt) and
// checks each flag's help: a value name is one word (pflag takes a
// `quoted phrase` in a usage for it, which once made demo's --keep read
// "--keep nft list ruleset"), no help has a run of blank lines, and every
// command that reads a spec says how to ask for Istio's defaults.
func TestCLIHelp(t *testing.T) {
	root := newRoot()
	cmds := []*cobra.Command{root}
	for _, c := range root.Commands() {
		if c.Name() != "help" && c.Name() != "completion" {
			cmds = append(cmds, c)
		}
	}
	for _, c := range cmds {
		args := []string{"--help"}
		name := "redirect"
		if c != root {
			args, name = []string{c.Name(), "--help"}, c.Name()
		}
		code, out, errOut := runCLI(t, args...)
		if code != exitOK || errOut != "" {
			t.Fatalf("%s --help: exit %d, %q", name, code, errOut)
		}
		golden.Check(t, "cli/help/"+name+".txt", out)
		if strings.Contains(out, "\n\n\n") {
			t.Errorf("%s --help has a run of blank lines:\n%s", name, out)
		}
		c.Flags().VisitAll(func(f *pflag.Flag) {
			value, usage := pflag.UnquoteUsage(f)
			if strings.ContainsAny(value, " \t") || strings.Contains(usage, "`") {
				t.Errorf("%s --%s: value name %q, usage %q", name, f.Name, value, usage)
			}
		})
		if f := c.Flags().Lookup("pod"); f != nil && c.Name() != "inspect" && c.Flags().Lookup("defaults") == nil {
			t.Errorf("%s takes --pod but no --defaults: Istio's defaults would be used without being asked for", name)
		}
	}
}
