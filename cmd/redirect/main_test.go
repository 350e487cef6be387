package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/nftmesh/nftmesh/internal/oneproc"
	"github.com/nftmesh/nftmesh/redirect"
)

func runCLI(t testing.TB, args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	code := run(args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestCLIBadInput(t *testing.T) {
	pod := filepath.Join("..", "..", "testdata", "pods")
	cases := []struct {
		name    string
		args    []string
		code    int
		mention []string
	}{
		{"bad cidr", []string{"render", "-a", redirect.AnnotationExcludeOutboundIPRanges + "=10.0.0.1"}, exitUsage,
			[]string{redirect.AnnotationExcludeOutboundIPRanges, `"10.0.0.1"`, "prefix length"}},
		{"two problems at once", []string{"render", "-a", redirect.AnnotationIncludeInboundPorts + "=0", "-a", redirect.AnnotationInterceptionMode + "=BOGUS"}, exitUsage,
			[]string{"2 problems", `"0"`, `"BOGUS"`}},
		{"not key=value", []string{"render", "-a", "justakey"}, exitUsage, []string{`"justakey"`, "key=value"}},
		{"unknown annotation", []string{"render", "-a", "traffic.sidecar.istio.io/excludeOutboundIPRange=10.0.0.0/8"}, exitUsage,
			[]string{"excludeOutboundIPRange", "not a capture annotation"}},
		{"annotation twice", []string{"render", "-a", redirect.AnnotationIncludeInboundPorts + "=80", "-a", redirect.AnnotationIncludeInboundPorts + "=81"}, exitUsage, []string{"twice"}},
		{"bad uid", []string{"render", "--defaults", "--proxy-uid", "abc"}, exitUsage, []string{"--proxy-uid", `"abc"`}},
		{"uid zero", []string{"render", "--defaults", "--proxy-uid", "0"}, exitUsage, []string{"--proxy-uid", `"0"`}},
		{"bad format", []string{"render", "--defaults", "-o", "yaml"}, exitUsage, []string{"--output", `"yaml"`}},
		{"bad inspect format", []string{"inspect", "--netns", "/proc/self/ns/net", "-o", "yaml"}, exitUsage, []string{"--output", `"yaml"`}},
		{"-f is the file, not the format", []string{"render", "-f", "json"}, exitUsage, []string{"json", "-o json"}},
		{"unknown flag", []string{"render", "--bogus"}, exitUsage, []string{"bogus"}},
		{"pod and annotation", []string{"render", "--pod", "x.yaml", "-a", redirect.AnnotationIncludeInboundPorts + "=80"}, exitUsage, []string{"--pod and --annotation"}},
		{"pod and proxy flag", []string{"render", "--pod", "x.yaml", "--dns-capture"}, exitUsage, []string{"--dns-capture", "--pod"}},
		{"pod and dual-stack flag", []string{"render", "--pod", "x.yaml", "--dual-stack"}, exitUsage, []string{"--dual-stack", "--pod"}},
		{"missing pod file", []string{"render", "--pod", filepath.Join(pod, "does-not-exist.yaml")}, exitUsage, []string{"does-not-exist.yaml"}},
		{"apply without netns", []string{"apply"}, exitUsage, []string{"--netns"}},
		{"bad backend", []string{"apply", "--netns", "/proc/self/ns/net", "--backend", "ebpf"}, exitUsage, []string{`"ebpf"`}},
		{"stray argument", []string{"render", "extra"}, exitUsage, []string{"extra"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := runCLI(t, tc.args...)
			if code != tc.code {
				t.Errorf("exit code = %d, want %d (stderr %q)", code, tc.code, errOut)
			}
			if out != "" {
				t.Errorf("stdout on error: %q", out)
			}
			if strings.Count(strings.TrimSpace(errOut), "\n") != 0 {
				t.Errorf("error is not one line: %q", errOut)
			}
			for _, m := range tc.mention {
				if !strings.Contains(errOut, m) {
					t.Errorf("stderr %q does not mention %q", errOut, m)
				}
			}
		})
	}
}

func TestCLIRenderFormats(t *testing.T) {
	for _, f := range []string{"nft", "iptables", "json", "plan"} {
		code, out, errOut := runCLI(t, "render", "--ipv6", "-o", f, "-a", redirect.AnnotationExcludeOutboundIPRanges+"=192.0.2.0/24,2001:db8::/32")
		if code != 0 {
			t.Fatalf("render -o %s: exit %d: %s", f, code, errOut)
		}
		for _, want := range []string{"192.0.2.0/24", "2001:db8::/32"} {
			if !strings.Contains(out, want) {
				t.Errorf("render -o %s lacks %s:\n%s", f, want, out)
			}
		}
	}
	// Deterministic.
	_, a, _ := runCLI(t, "render", "--defaults", "--ipv6", "--dns-capture")
	_, b, _ := runCLI(t, "render", "--defaults", "--ipv6", "--dns-capture")
	if a != b || a == "" {
		t.Error("render is not deterministic")
	}
}

func TestCLIRenderPods(t *testing.T) {
	dir := filepath.Join("..", "..", "testdata", "pods")
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Skipf("no sample pods yet: %v", err)
	}
	sawMesh, sawSkip := false, false
	for _, e := range entries {
		code, out, errOut := runCLI(t, "render", "--pod", filepath.Join(dir, e.Name()))
		switch code {
		case exitOK:
			sawMesh = true
			if !strings.Contains(out, "table inet") {
				t.Errorf("%s: no nft table in output:\n%s", e.Name(), out)
			}
		case exitNotInMesh:
			sawSkip = true
			if !strings.Contains(errOut, "not in the mesh") || out != "" {
				t.Errorf("%s: skip should explain on stderr only: out=%q err=%q", e.Name(), out, errOut)
			}
		case exitUsage:
			if !strings.Contains(e.Name(), "bad") && !strings.Contains(e.Name(), "invalid") {
				t.Errorf("%s: exit %d: %s", e.Name(), code, errOut)
			}
		default:
			t.Errorf("%s: exit %d: %s", e.Name(), code, errOut)
		}
	}
	if !sawMesh || !sawSkip {
		t.Errorf("sample pods should include mesh and non-mesh pods (mesh=%t skip=%t)", sawMesh, sawSkip)
	}
}

// FuzzCLIAnnotationFlags: any --annotation values give exit 0 or 2 with a
// one-line error, never a panic or another code.
func FuzzCLIAnnotationFlags(f *testing.F) {
	f.Add(redirect.AnnotationExcludeOutboundIPRanges+"=10.0.0.0/8", "--proxy-uid", "1337")
	f.Add("=", "--proxy-gid", ",")
	f.Add(redirect.AnnotationIncludeInboundPorts+"=*,80", "--proxy-uid", "99999999999")
	f.Fuzz(func(t *testing.T, ann, flag, val string) {
		if flag != "--proxy-uid" && flag != "--proxy-gid" {
			flag = "--proxy-uid"
		}
		code, _, errOut := runCLI(t, "render", "-o", "plan", "-a", ann, flag, val)
		if code != exitOK && code != exitUsage {
			t.Fatalf("exit %d for %q %s %q: %s", code, ann, flag, val, errOut)
		}
		if code == exitUsage && (errOut == "" || strings.Count(strings.TrimSpace(errOut), "\n") > 0 && !strings.Contains(ann+val, "\n")) {
			t.Fatalf("error not one line: %q", errOut)
		}
	})
}

// TestCLIHugeInputBounded: a huge bad value gives a one-line error of a few
// hundred bytes naming the flag or annotation, not the value echoed whole.
func TestCLIHugeInputBounded(t *testing.T) {
	huge := strings.Repeat("7", 1<<20)
	for _, tc := range []struct {
		name    string
		args    []string
		mention []string
	}{
		{"annotation value", []string{"validate", "-a", redirect.AnnotationExcludeOutboundIPRanges + "=" + huge}, []string{redirect.AnnotationExcludeOutboundIPRanges}},
		{"many bad items", []string{"validate", "-a", redirect.AnnotationIncludeInboundPorts + "=" + strings.Repeat("0,", 1<<19)}, []string{"524288 problems", "and 524268 more"}},
		{"not key=value", []string{"render", "-a", huge}, []string{"--annotation", "key=value"}},
		{"unknown annotation", []string{"render", "-a", huge + "=1"}, []string{"not a capture annotation"}},
		{"proxy uid", []string{"render", "--defaults", "--proxy-uid", huge}, []string{"--proxy-uid"}},
		{"format", []string{"render", "--defaults", "-o", huge}, []string{"--output"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := runCLI(t, tc.args...)
			if code != exitUsage || out != "" {
				t.Fatalf("exit %d, stdout %d bytes", code, len(out))
			}
			if len(errOut) > 8<<10 || strings.Count(strings.TrimSpace(errOut), "\n") != 0 {
				t.Errorf("stderr is %d bytes: %.300s", len(errOut), errOut)
			}
			for _, m := range tc.mention {
				if !strings.Contains(errOut, m) {
					t.Errorf("stderr %.500q does not mention %q", errOut, m)
				}
			}
			if tc.name != "many bad items" && !strings.Contains(errOut, "bytes cut)") {
				t.Errorf("stderr %.500q does not say the value was cut", errOut)
			}
		})
	}
}

// TestCLIInterceptionNone: render and validate of a pod (or annotations)
// asking for interceptionMode NONE print nothing, explain on stderr and exit
// 4, like any pod the plugin leaves alone.
func TestCLIInterceptionNone(t *testing.T) {
	pod := filepath.Join("..", "..", "testdata", "pods", "interception-none.yaml")
	for _, args := range [][]string{
		{"render", "--pod", pod},
		{"render", "--pod", pod, "-o", "iptables"},
		{"validate", "--pod", pod},
		{"render", "-a", redirect.AnnotationInterceptionMode + "=NONE"},
		{"validate", "-a", redirect.AnnotationInterceptionMode + "=NONE", "-a", redirect.AnnotationIncludeInboundPorts + "=80"},
	} {
		code, out, errOut := runCLI(t, args...)
		if code != exitNotInMesh || out != "" || !strings.Contains(errOut, "not in the mesh: interceptionMode NONE") {
			t.Errorf("%v: exit %d, out %q, err %q; want exit %d and the reason on stderr", args, code, out, errOut, exitNotInMesh)
		}
	}
	code, out, errOut := runCLI(t, "validate", "--pod", pod)
	if !strings.Contains(errOut, "pod shop/batch-1") {
		t.Errorf("validate --pod: the error should name the pod: exit %d out %q err %q", code, out, errOut)
	}
}

// TestCLIOutputFlag: -o/--output choose the format as in kubectl; --format
// still works but says it is deprecated; -f is the Pod manifest, as
// kubectl's -f is a file.
func TestCLIOutputFlag(t *testing.T) {
	pod := filepath.Join("..", "..", "testdata", "pods", "injected.yaml")
	_, want, _ := runCLI(t, "render", "--pod", pod, "--output", "plan")
	if !strings.Contains(want, "chain ") {
		t.Fatalf("render --output plan: %q", want)
	}
	for _, args := range [][]string{
		{"render", "-f", pod, "-o", "plan"},
		{"render", "--pod", pod, "-o=plan"},
		{"render", "-f", pod, "--format", "plan"},
	} {
		code, out, errOut := runCLI(t, args...)
		if code != exitOK || out != want {
			t.Errorf("%v: exit %d, stdout differs from --output plan (stderr %q)", args, code, errOut)
		}
		deprecated := strings.Contains(errOut, "--format is deprecated, use -o/--output")
		if deprecated != slices.Contains(args, "--format") {
			t.Errorf("%v: stderr %q", args, errOut)
		}
	}
	_, help, _ := runCLI(t, "render", "--help")
	if !strings.Contains(help, "-o, --output") || !strings.Contains(help, "-f, --pod") || strings.Contains(help, "--format") {
		t.Errorf("render --help does not show -o/--output and -f/--pod only:\n%s", help)
	}
}

// TestCLIExitCodesOnce: the exit-code table is in the root help only; each
// command's help points at it.
func TestCLIExitCodesOnce(t *testing.T) {
	_, root, _ := runCLI(t, "--help")
	if strings.Count(root, "Exit codes:") != 1 || !strings.Contains(root, "3  inspect: ") {
		t.Errorf("root --help should hold the table once:\n%s", root)
	}
	for _, c := range newRoot().Commands() {
		if c.Name() == "help" || c.Name() == "completion" {
			continue
		}
		_, help, _ := runCLI(t, c.Name(), "--help")
		if strings.Contains(help, "3  inspect: ") || !strings.Contains(help, "Exit codes: see redirect --help") {
			t.Errorf("%s --help repeats the table or does not point at it:\n%s", c.Name(), help)
		}
	}
}

// TestMain gives the tests the runtime's GOMAXPROCS back: the CLI runs
// with one P (internal/oneproc, imported by main), its tests need not.
func TestMain(m *testing.M) {
	runtime.GOMAXPROCS(oneproc.Procs)
	code := m.Run()
	if cliBinDir != "" {
		os.RemoveAll(cliBinDir)
	}
	os.Exit(code)
}

// cliBinDir holds the binary cliBinary built; TestMain removes it.
var cliBinDir string

// cliBinary builds the redirect binary once for the tests that look at it
// as a whole: static, as make builds it, with its symbol table.
var cliBinary = func() func(t *testing.T) string {
	var once sync.Once
	var bin string
	var err error
	var out []byte
	return func(t *testing.T) string {
		t.Helper()
		once.Do(func() {
			if cliBinDir, err = os.MkdirTemp("", "redirect-bin-"); err != nil {
				return
			}
			bin = filepath.Join(cliBinDir, "redirect")
			build := exec.Command("go", "build", "-trimpath", "-o", bin, ".")
			build.Env = append(os.Environ(), "CGO_ENABLED=0")
			out, err = build.CombinedOutput()
		})
		if err != nil {
			t.Fatalf("building redirect: %v\n%s", err, out)
		}
		return bin
	}
}()

// TestCLIOneP: the redirect binary sets GOMAXPROCS to 1 before os's
// package initialisation, the first to start goroutines (internal/oneproc):
// nothing it does runs in parallel, and a second P costs an apply a tenth
// of its CPU in idle threads woken for nothing. The binary as built runs
// with GODEBUG=inittrace=1, which prints each package's init in order.
func TestCLIOneP(t *testing.T) {
	cmd := exec.Command(cliBinary(t), "version")
	cmd.Env = append(os.Environ(), "GODEBUG=inittrace=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("redirect version: %v\n%s", err, out)
	}
	at := map[string]int{}
	n := 0
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) > 1 && f[0] == "init" {
			at[f[1]] = n
			n++
		}
	}
	one, ok := at["github.com/nftmesh/nftmesh/internal/oneproc"]
	if osAt, ok2 := at["os"]; !ok || !ok2 || one > osAt {
		t.Errorf("oneproc initialised at %d (found: %t), os at %d (found: %t): want oneproc first\n%s", one, ok, osAt, ok2, out)
	}
}
