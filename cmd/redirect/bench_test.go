package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nftmesh/nftmesh/redirect"
)

// BenchmarkWholeProcess compares whole processes applying the default
// dual-stack pod's rules into a fresh netns, side by side in one run:
// `redirect apply` (nftables and iptables-legacy backends) against
// iptables-legacy-restore + ip6tables-legacy-restore and `nft -f` of the
// same rules (rendered by `redirect render`). Each tool runs under
// `nsenter --net=` so all pay the same process and netns-entry cost; the
// order rotates every round. Reported: the median per tool (ms) and our
// ratios to each competitor. Needs root and the binaries (make bench).
// BENCH_REDIRECT_BASE=/path/to/an/older/redirect runs that build too, in
// the same loop, for a change's before and after (base/nft-f, nft/base).
func BenchmarkWholeProcess(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root: creates network namespaces")
	}
	for _, bin := range []string{"nft", "iptables-legacy-restore", "ip6tables-legacy-restore", "nsenter", "ip"} {
		if _, err := exec.LookPath(bin); err != nil {
			b.Skipf("%s not installed (apt-get install nftables iptables iproute2 util-linux)", bin)
		}
	}
	dir := b.TempDir()
	self := filepath.Join(dir, "redirect")
	// Built as `make build` and the image build it: static (no cgo). A
	// default `go build` links libc for the net package and pays the
	// dynamic loader and cgo's start-up on every run (~0.5 ms here). The
	// version is stamped as make stamps it: unstamped, --version's text is
	// looked up in the build info, twice per run.
	build := exec.Command("go", "build", "-trimpath", "-buildvcs=false", "-ldflags=-s -w -buildid= -X github.com/nftmesh/nftmesh/internal/version.Version=bench", "-o", self, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		b.Fatalf("building redirect: %v\n%s", err, out)
	}
	var nftText, v4, v6 string
	{
		code, out, errOut := runCLI(b, "render", "--defaults", "--ipv6", "-o", "nft")
		if code != 0 {
			b.Fatal(errOut)
		}
		nftText = out
		p, err := redirect.Build(func() redirect.Spec { s := redirect.DefaultSpec(); s.IPv6 = true; return s }())
		if err != nil {
			b.Fatal(err)
		}
		if v4, err = render(p, "iptables"); err != nil {
			b.Fatal(err)
		}
		parts := strings.SplitN(v4, "# ip6tables-save\n", 2)
		v4, v6 = strings.TrimPrefix(parts[0], "# iptables-save\n"), parts[1]
	}
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			b.Fatal(err)
		}
		return p
	}
	nftFile, v4File, v6File := write("rules.nft", nftText), write("rules.v4", v4), write("rules.v6", v6)

	type tool struct {
		name   string
		cmds   [][]string // run one after the other inside the netns
		direct bool       // run as is, with the netns in place of NETNS: no nsenter
		phases bool       // with REDIRECT_PHASES: where its time goes (not in the ratios)
	}
	tools := []tool{
		{"redirect-nft", [][]string{{self, "apply", "--netns", "/proc/self/ns/net", "--backend", "nftables", "--defaults", "--ipv6", "--allow-own-netns"}}, false, false},
		// How it is used: redirect enters the namespace itself, where nft and
		// the restore pair need a helper (nsenter, ip netns exec) to get there.
		{"redirect-nft-direct", [][]string{{self, "apply", "--netns", "NETNS", "--backend", "nftables", "--defaults", "--ipv6"}}, true, false},
		{"redirect-legacy", [][]string{{self, "apply", "--netns", "/proc/self/ns/net", "--backend", "iptables-legacy", "--defaults", "--ipv6", "--allow-own-netns"}}, false, false},
		{"iptables-restore", [][]string{{"iptables-legacy-restore", "--noflush", v4File}, {"ip6tables-legacy-restore", "--noflush", v6File}}, false, false},
		{"nft-f", [][]string{{"nft", "-f", nftFile}}, false, false},
		// redirect-nft-direct again, printing its phase marks: a run of its
		// own so that the figures above measure exactly what users run.
		{"redirect-nft-phases", [][]string{{self, "apply", "--netns", "NETNS", "--backend", "nftables", "--defaults", "--ipv6"}}, true, true},
	}
	// BENCH_REDIRECT_BASE names another redirect binary (an older build)
	// to run the same way as redirect-nft in the same loop: a change's
	// effect, measured side by side with its baseline, on a machine whose
	// load drifts between two runs. Build it as above (static, stamped);
	// its ratio to redirect-nft is base/nft.
	base := os.Getenv("BENCH_REDIRECT_BASE")
	if base != "" {
		tools = append(tools, tool{"redirect-nft-base", [][]string{{base, "apply", "--netns", "/proc/self/ns/net", "--backend", "nftables", "--defaults", "--ipv6", "--allow-own-netns"}}, false, false})
	}
	// steps[name] are the times between consecutive phase marks, µs.
	steps := map[string][]float64{}
	var stepOrder []string
	times := map[string][]time.Duration{}
	// Context switches per run (voluntary + involuntary, from the child's
	// rusage; nsenter execs the tool, so it is one process): on a loaded
	// machine each one is a wait for a CPU, which is where a Go process
	// loses to nft's single thread.
	switches := map[string][]int64{}
	// CPU time (user + system) and minor page faults per run, from the same
	// rusage: steadier than wall time on a shared machine, and a page fault
	// costs some 4 µs on this VM, so they are where a change to the binary
	// (its size, what its inits touch) shows first.
	cpu := map[string][]time.Duration{}
	faults := map[string][]int64{}
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		for j := range tools {
			tl := tools[(i+j)%len(tools)]
			b.StopTimer()
			ns := fmt.Sprintf("bench-%d-%d-%d", os.Getpid(), i, j)
			if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
				b.Fatalf("ip netns add: %v %s", err, out)
			}
			b.StartTimer()
			start := time.Now()
			var cs, flt int64
			var used time.Duration
			for _, c := range tl.cmds {
				cmd := exec.Command("nsenter", append([]string{"--net=/run/netns/" + ns}, c...)...)
				if tl.direct {
					args := slices.Clone(c[1:])
					for k := range args {
						if args[k] == "NETNS" {
							args[k] = "/run/netns/" + ns
						}
					}
					cmd = exec.Command(c[0], args...)
				}
				if tl.phases {
					cmd.Env = append(os.Environ(), "REDIRECT_PHASES=1")
				}
				launched := time.Now()
				out, err := cmd.CombinedOutput()
				ended := time.Now()
				if err != nil {
					b.Fatalf("%s: %v\n%s", tl.name, err, out)
				}
				if tl.phases {
					stepOrder = addSteps(b, steps, stepOrder, string(out), launched, ended)
				}
				if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
					cs += ru.Nvcsw + ru.Nivcsw
					flt += ru.Minflt
					used += time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
				}
			}
			times[tl.name] = append(times[tl.name], time.Since(start))
			switches[tl.name] = append(switches[tl.name], cs)
			faults[tl.name] = append(faults[tl.name], flt)
			cpu[tl.name] = append(cpu[tl.name], used)
			b.StopTimer()
			exec.Command("ip", "netns", "del", ns).Run()
			b.StartTimer()
		}
	}
	b.StopTimer()
	med := map[string]float64{}
	for name, ds := range times {
		slices.Sort(ds)
		med[name] = float64(ds[len(ds)/2].Microseconds()) / 1000
		b.ReportMetric(med[name], name+"-ms")
	}
	for name, f := range faults {
		slices.Sort(f)
		b.ReportMetric(float64(f[len(f)/2]), name+"-faults")
	}
	for name, ds := range cpu {
		slices.Sort(ds)
		b.ReportMetric(float64(ds[len(ds)/2].Microseconds())/1000, name+"-cpu-ms")
	}
	for name, cs := range switches {
		slices.Sort(cs)
		b.ReportMetric(float64(cs[len(cs)/2]), name+"-cs")
	}
	if len(stepOrder) > 0 {
		var line strings.Builder
		for _, name := range stepOrder {
			fmt.Fprintf(&line, " %s %.0f", name, median(steps[name]))
		}
		b.Logf("redirect apply run directly, %.2f ms in all: median µs of each step (start: from launching the process to the first package inits; main: the package inits; then each mark since the previous; exit: the verb's end; teardown: the process's exit as waited for):%s",
			med["redirect-nft-phases"], line.String())
	}
	b.ReportMetric(med["redirect-nft"]/med["nft-f"], "nft/nft-f")
	b.ReportMetric(med["redirect-nft-direct"]/med["nft-f"], "direct/nft-f")
	b.ReportMetric(med["redirect-nft-direct"]/med["iptables-restore"], "direct/ipt-restore")
	b.ReportMetric(med["redirect-nft"]/med["iptables-restore"], "nft/ipt-restore")
	b.ReportMetric(med["redirect-legacy"]/med["iptables-restore"], "legacy/ipt-restore")
	if base != "" {
		b.ReportMetric(med["redirect-nft-base"]/med["nft-f"], "base/nft-f")
		b.ReportMetric(med["redirect-nft"]/med["redirect-nft-base"], "nft/base")
	}
	b.ReportMetric(0, "ns/op") // per-op time mixes five tools; the medians above are the figures
}

// addSteps adds the times between consecutive phase marks of one run's
// "redirect: phases_us: t0=UNIXµs a=1 b=2 ..." line to steps, and returns
// the marks' order as first seen. t0, when the marks start counting, lines
// them up with the run as seen from here: "start" is from launching the
// process (fork, exec, the runtime's start-up, the first package inits) to
// t0, "teardown" from the last mark to the process's end as waited for
// here (the exit and its threads' teardown).
func addSteps(b *testing.B, steps map[string][]float64, order []string, out string, launched, ended time.Time) []string {
	_, line, ok := strings.Cut(out, "redirect: phases_us: ")
	if !ok {
		b.Fatalf("no phase marks in the output of redirect apply with REDIRECT_PHASES=1:\n%s", out)
	}
	line, _, _ = strings.Cut(line, "\n")
	add := func(name string, us float64) {
		if _, seen := steps[name]; !seen {
			order = append(order, name)
		}
		steps[name] = append(steps[name], us)
	}
	var t0, prev float64
	for i, f := range strings.Fields(line) {
		name, v, ok := strings.Cut(f, "=")
		us, err := strconv.ParseFloat(v, 64)
		if !ok || err != nil || (i == 0) != (name == "t0") {
			b.Fatalf("bad phase mark %q in %q (want t0=UNIXµs first)", f, line)
		}
		if i == 0 {
			t0 = us
			add("start", t0-float64(launched.UnixMicro()))
			continue
		}
		add(name, us-prev)
		prev = us
	}
	add("teardown", float64(ended.UnixMicro())-(t0+prev))
	return order
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}
