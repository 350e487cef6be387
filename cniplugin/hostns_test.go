package cniplugin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/nftmesh/nftmesh/internal/hostns"
	"github.com/nftmesh/nftmesh/iptables"
	"github.com/nftmesh/nftmesh/nft"
	"github.com/nftmesh/nftmesh/policyroute"
	"github.com/nftmesh/nftmesh/redirect"
	"github.com/nftmesh/nftmesh/testkit/kubetest"
	"github.com/nftmesh/nftmesh/testkit/spawn"
)

// The stand-in host: a child process of the test binary in new PID, network
// and mount namespaces. Inside, it is PID 1 and its network namespace plays
// the node's: the planted state stands for what the node itself owns (an
// `inet nftmesh` table, fwmark 1337 rules and table 133 routes, ::6 on lo,
// foreign iptables-legacy chains, one named like Istio's). The machine's
// own root namespace is never a target.

const standinEnv = "NFTMESH_TEST_STANDIN_HOST"

// standinAPIPort is where the stand-in forwards to the API server (through
// a unix socket, which crosses network namespaces); its netns is fresh, so
// the port is free.
const standinAPIPort = 16443

// standinJob is what the stand-in runs, one plugin call after another.
type standinJob struct {
	Plugin  string
	APISock string // unix socket forwarding to the API server, if any
	Calls   []standinCall
}

type standinCall struct {
	// Argv, when set, is a command line run instead of the plugin, with
	// "{netns}" replaced by the netns path (the redirect CLI).
	Argv []string
	// Direct, when set, names a backend verb the stand-in calls itself,
	// in process, below every pipeline check (see directVerbs).
	Direct  string
	Cmd     string
	Netns   string // CNI_NETNS; "link:X" is a symlink to X made in the stand-in
	CNIArgs string
	Stdin   []byte
}

type standinReport struct {
	Before  string
	Results []standinResult
	Err     string
}

type standinResult struct {
	Call   standinCall
	OK     bool
	Stdout string
	Stderr string
	After  string
}

// plantHostState is the node's own state in the stand-in.
var plantHostState = [][]string{
	{"ip", "link", "set", "lo", "up"},
	{"nft", "-f", "-", "table inet nftmesh {\n chain nat-istio-output {\n  type nat hook output priority -100; policy accept;\n  tcp dport 9999 redirect to :15001\n }\n}\ntable ip node-foreign {\n chain input {\n  type filter hook input priority 0; policy accept;\n  tcp dport 22 accept\n }\n}\n"},
	{"ip", "rule", "add", "fwmark", "1337", "lookup", "133"},
	{"ip", "-6", "rule", "add", "fwmark", "1337", "lookup", "133"},
	{"ip", "route", "add", "local", "default", "dev", "lo", "table", "133"},
	{"ip", "-6", "route", "add", "local", "default", "dev", "lo", "table", "133"},
	{"ip", "-6", "addr", "add", "::6/128", "dev", "lo", "nodad"},
	{"iptables-legacy", "-t", "nat", "-N", "NODE-FOREIGN"},
	{"iptables-legacy", "-t", "nat", "-A", "NODE-FOREIGN", "-p", "tcp", "--dport", "7", "-j", "RETURN"},
	{"iptables-legacy", "-t", "nat", "-A", "OUTPUT", "-p", "tcp", "--dport", "7", "-j", "NODE-FOREIGN"},
	{"iptables-legacy", "-t", "nat", "-N", "ISTIO_OUTPUT"},
	{"iptables-legacy", "-t", "nat", "-A", "ISTIO_OUTPUT", "-p", "tcp", "--dport", "8", "-j", "RETURN"},
	{"iptables-legacy", "-t", "mangle", "-N", "ISTIO_INBOUND"},
}

// hostState is every reader's view of the state the node owns.
var hostStateReaders = [][]string{
	{"nft", "list", "ruleset"},
	{"ip", "rule"},
	{"ip", "-6", "rule"},
	{"ip", "addr"},
	{"ip", "-6", "addr"},
	{"ip", "route", "show", "table", "133"},
	{"ip", "-6", "route", "show", "table", "133"},
	{"iptables-legacy-save"},
	{"ip6tables-legacy-save"},
}

var counters = regexp.MustCompile(`\[[0-9]+:[0-9]+\]`)

func hostState() (string, error) {
	var b strings.Builder
	for _, r := range hostStateReaders {
		out, err := exec.Command(r[0], r[1:]...).CombinedOutput()
		if err != nil {
			return "", fmt.Errorf("%s: %v\n%s", strings.Join(r, " "), err, out)
		}
		fmt.Fprintf(&b, "== %s\n", strings.Join(r, " "))
		for _, line := range strings.Split(string(out), "\n") {
			if !strings.HasPrefix(line, "#") { // iptables-save's dated header
				// Packet counters move with the test's own traffic (the
				// API forwarder on lo); they are not state anyone owns.
				b.WriteString(counters.ReplaceAllString(line, "[-:-]") + "\n")
			}
		}
	}
	return b.String(), nil
}

// standinMain runs as PID 1 of the stand-in host.
func standinMain() int {
	var job standinJob
	rep := standinReport{}
	enc := json.NewEncoder(os.Stdout)
	fail := func(err error) int {
		rep.Err = err.Error()
		_ = enc.Encode(rep)
		return 0
	}
	if err := json.Unmarshal([]byte(os.Getenv(standinEnv)), &job); err != nil {
		return fail(err)
	}
	// Our mounts stay ours: nothing propagates to the machine's.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fail(fmt.Errorf("making mounts private: %w", err))
	}
	if err := unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fail(fmt.Errorf("mounting /proc: %w", err))
	}
	if os.Getpid() != 1 {
		return fail(fmt.Errorf("stand-in is PID %d, not 1", os.Getpid()))
	}
	for _, c := range plantHostState {
		cmd := exec.Command(c[0], c[1:]...)
		if c[0] == "nft" {
			cmd = exec.Command(c[0], c[1:3]...)
			cmd.Stdin = strings.NewReader(c[3])
		}
		if out, err := cmd.CombinedOutput(); err != nil {
			return fail(fmt.Errorf("planting %v: %v\n%s", c[:min(len(c), 3)], err, out))
		}
	}
	if job.APISock != "" {
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", standinAPIPort))
		if err != nil {
			return fail(err)
		}
		defer ln.Close()
		go kubetest.ForwardTo(ln, "unix", job.APISock)
	}
	dir, err := os.MkdirTemp("", "standin-")
	if err != nil {
		return fail(err)
	}
	defer os.RemoveAll(dir)
	// A bind mount of PID 1's namespace, as /run/netns/NAME would be.
	bind := filepath.Join(dir, "bind")
	if err := os.WriteFile(bind, nil, 0o600); err != nil {
		return fail(err)
	}
	if err := unix.Mount("/proc/1/ns/net", bind, "", unix.MS_BIND, ""); err != nil {
		return fail(fmt.Errorf("bind-mounting PID 1's netns: %w", err))
	}
	if rep.Before, err = hostState(); err != nil {
		return fail(err)
	}
	for i, c := range job.Calls {
		netnsPath := c.Netns
		switch {
		case strings.HasPrefix(c.Netns, "link:"):
			netnsPath = filepath.Join(dir, fmt.Sprintf("link%d", i))
			if err := os.Symlink(strings.TrimPrefix(c.Netns, "link:"), netnsPath); err != nil {
				return fail(err)
			}
		case c.Netns == "bind":
			netnsPath = bind
		}
		cmd := exec.Command(job.Plugin)
		cmd.Env = []string{"CNI_COMMAND=" + c.Cmd, "CNI_CONTAINERID=standin-" + fmt.Sprint(i), "CNI_NETNS=" + netnsPath,
			"CNI_IFNAME=eth0", "CNI_ARGS=" + c.CNIArgs, "CNI_PATH=" + filepath.Dir(job.Plugin)}
		cmd.Stdin = bytes.NewReader(c.Stdin)
		if len(c.Argv) > 0 {
			argv := make([]string, len(c.Argv))
			for k, a := range c.Argv {
				argv[k] = strings.ReplaceAll(a, "{netns}", netnsPath)
			}
			cmd = exec.Command(argv[0], argv[1:]...)
		}
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		var err error
		if c.Direct != "" {
			err = directVerbs[c.Direct](netnsPath)
			if err != nil {
				errb.WriteString(err.Error())
				if errors.Is(err, hostns.ErrOwnNetns) {
					out.WriteString("refused")
				}
			}
		} else {
			err = cmd.Run()
		}
		after, serr := hostState()
		if serr != nil {
			return fail(serr)
		}
		rep.Results = append(rep.Results, standinResult{Call: c, OK: err == nil, Stdout: out.String(), Stderr: errb.String(), After: after})
	}
	_ = enc.Encode(rep)
	return 0
}

// directVerbs are the backends' own writing verbs, called with no pipeline
// in front: each must refuse the host's namespace itself.
var directVerbs = map[string]func(path string) error{
	"nft.Apply":       func(p string) error { return nft.New().Apply(context.Background(), p, standinPlan()) },
	"nft.Remove":      func(p string) error { return nft.New().Remove(context.Background(), p) },
	"iptables.Apply":  func(p string) error { return iptables.New().Apply(context.Background(), p, standinPlan()) },
	"iptables.Remove": func(p string) error { return iptables.New().Remove(context.Background(), p) },
	"policyroute.Apply": func(p string) error {
		return withFd(p, func(h netns.NsHandle) error { return policyroute.Apply(hostns.Guard{}, h, standinPlan(), true) })
	},
	"policyroute.Remove": func(p string) error {
		return withFd(p, func(h netns.NsHandle) error { return policyroute.Remove(hostns.Guard{}, h) })
	},
}

// standinPlan has TPROXY routes and ::6, so every kind of write is tried.
func standinPlan() redirect.Plan {
	s := redirect.DefaultSpec()
	s.InterceptionMode = redirect.ModeTProxy
	s.IPv6 = true
	p, err := redirect.Build(s)
	if err != nil {
		panic(err)
	}
	return p
}

// withFd opens path plainly (no guard: policyroute must hold on its own).
func withFd(path string, fn func(netns.NsHandle) error) error {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return fn(netns.NsHandle(fd))
}

// runStandin runs job in a fresh stand-in host and returns its report.
func runStandin(t *testing.T, job standinJob) standinReport {
	t.Helper()
	data, err := json.Marshal(job)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), standinEnv+"="+string(data))
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID | syscall.CLONE_NEWNET | syscall.CLONE_NEWNS, Pdeathsig: syscall.SIGKILL}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := spawn.Run(cmd); err != nil {
		t.Fatalf("stand-in host: %v\n%s", err, errb.String())
	}
	var rep standinReport
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("stand-in report: %v\n%s\n%s", err, out.String(), errb.String())
	}
	if rep.Err != "" {
		t.Fatalf("stand-in host: %s", rep.Err)
	}
	return rep
}

// TestHostNetnsUntouched: DEL, ADD and CHECK with CNI_NETNS naming the
// host's own network namespace (PID 1's, the plugin's own, symlinks and a
// bind mount to them), with every backend, are refused with a CNI error and
// leave every bit of the host's state as it was, as four independent
// readers see it; so are `redirect clean` and `redirect apply`, and, below
// the pipeline, each backend's Apply and Remove and the route helper.
func TestHostNetnsUntouched(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (PID, network and mount namespaces)")
	}
	if env.pluginBin == "" {
		t.Skipf("skipping: %s", env.skip)
	}
	for _, bin := range []string{"nft", "ip", "iptables-legacy", "iptables-legacy-save", "ip6tables-legacy-save"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("%s missing: %v", bin, err)
		}
	}
	runDir := t.TempDir()
	targets := []string{"/proc/1/ns/net", "/proc/self/ns/net", "/proc/thread-self/ns/net", "link:/proc/1/ns/net", "link:/proc/self/ns/net", "bind"}
	job := standinJob{Plugin: env.pluginBin}
	cniArgs := "IgnoreUnknown=1;K8S_POD_NAMESPACE=shop;K8S_POD_NAME=web;K8S_POD_INFRA_CONTAINER_ID=x"
	verbs := []string{"DEL"}
	// ADD and CHECK look the pod up before they touch the kernel: with
	// the API server, the pod exists and is in the mesh, so only the guard
	// stands between them and the host.
	if env.api != nil {
		verbs = append(verbs, "ADD", "CHECK")
		sockDir := t.TempDir()
		sock := filepath.Join(sockDir, "api.sock")
		ln, err := net.Listen("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		go kubetest.Forward(ln, strings.TrimPrefix(env.api.Host, "https://"))
		job.APISock = sock
		if err := env.api.WriteKubeconfigHost(filepath.Join(runDir, "kubeconfig"), fmt.Sprintf("https://127.0.0.1:%d", standinAPIPort), env.token); err != nil {
			t.Fatal(err)
		}
		pod := createPod(t, env.api, loadPod(t, "injected.yaml"))
		cniArgs = cniArgsFor(pod, "x")
	} else {
		t.Logf("no API server (%s): DEL only", env.skip)
	}
	for _, backend := range []string{"auto", "nftables", "iptables-legacy"} {
		for _, v := range verbs {
			for _, target := range targets {
				conf := directConf(t, "1.0.0", runDir, prevResultV4("1.0.0", "198.51.100.7/24"), map[string]any{"backend": backend})
				job.Calls = append(job.Calls, standinCall{Cmd: v, Netns: target, CNIArgs: cniArgs, Stdin: conf})
			}
		}
	}
	// The CLI's writing verbs, as an operator with a wrong --netns runs them.
	cli := filepath.Join(t.TempDir(), "redirect")
	if out, err := exec.Command("go", "build", "-o", cli, "../cmd/redirect").CombinedOutput(); err != nil {
		t.Fatalf("building redirect: %v\n%s", err, out)
	}
	for _, backend := range []string{"auto", "nftables", "iptables-legacy"} {
		for _, target := range targets {
			for _, argv := range [][]string{
				{cli, "clean", "--netns", "{netns}", "--backend", backend, "--run-dir", runDir},
				{cli, "apply", "--netns", "{netns}", "--backend", backend, "--run-dir", runDir, "-a", "sidecar.istio.io/interceptionMode=TPROXY", "--ipv6"},
			} {
				job.Calls = append(job.Calls, standinCall{Argv: argv, Netns: target})
			}
		}
	}
	// Below the pipeline: each backend and the route helper on their own.
	for name := range directVerbs {
		for _, target := range targets {
			job.Calls = append(job.Calls, standinCall{Direct: name, Netns: target})
		}
	}
	rep := runStandin(t, job)
	for _, want := range []string{"table inet nftmesh", "fwmark 0x539 lookup 133", "::6/128", "local default dev lo", ":NODE-FOREIGN", ":ISTIO_OUTPUT", ":ISTIO_INBOUND"} {
		if !strings.Contains(rep.Before, want) {
			t.Fatalf("planted state lacks %q:\n%s", want, rep.Before)
		}
	}
	// Each call is compared with the state just before it, so a report
	// names the call that did the damage.
	prev := rep.Before
	for _, r := range rep.Results {
		name := fmt.Sprintf("%s CNI_NETNS=%s backend=%s", r.Call.Cmd, r.Call.Netns, backendOf(r.Call.Stdin))
		if r.Call.Direct != "" {
			name = fmt.Sprintf("%s(%s)", r.Call.Direct, r.Call.Netns)
		}
		if len(r.Call.Argv) > 0 {
			name = fmt.Sprintf("%s (netns %s)", strings.Join(r.Call.Argv[1:], " "), r.Call.Netns)
		}
		if r.After != prev {
			t.Errorf("%s changed the host's state:\n%s", name, lineDiff(prev, r.After))
		}
		prev = r.After
		if r.Call.Direct != "" {
			if r.OK || r.Stdout != "refused" {
				t.Errorf("%s(%s): want an error wrapping hostns.ErrOwnNetns, got ok=%t %s", r.Call.Direct, r.Call.Netns, r.OK, r.Stderr)
			}
			continue
		}
		if len(r.Call.Argv) > 0 {
			if r.OK || !strings.Contains(r.Stderr, "host's network namespace") {
				t.Errorf("%s: want a failure refusing the host's namespace, got ok=%t stderr %s", name, r.OK, r.Stderr)
			}
			continue
		}
		if r.OK {
			t.Errorf("%s succeeded; want a CNI error refusing the host's namespace\nstdout %s", name, r.Stdout)
			continue
		}
		var e types.Error
		if err := json.Unmarshal([]byte(r.Stdout), &e); err != nil || e.Code != types.ErrInvalidEnvironmentVariables || !strings.Contains(e.Msg, "host's network namespace") {
			t.Errorf("%s: want CNI error %d naming the host's namespace, got %s (stderr %s)", name, types.ErrInvalidEnvironmentVariables, r.Stdout, r.Stderr)
		}
	}
}

func backendOf(conf []byte) string {
	var c struct{ Backend string }
	_ = json.Unmarshal(conf, &c)
	return c.Backend
}

// lineDiff lists the lines only in a ("-") or only in b ("+").
func lineDiff(a, b string) string {
	in := func(s string) map[string]int {
		m := map[string]int{}
		for _, l := range strings.Split(s, "\n") {
			m[l]++
		}
		return m
	}
	ma, mb := in(a), in(b)
	var out []string
	for _, l := range strings.Split(a, "\n") {
		if mb[l] < ma[l] {
			out = append(out, "- "+l)
		}
	}
	for _, l := range strings.Split(b, "\n") {
		if ma[l] < mb[l] {
			out = append(out, "+ "+l)
		}
	}
	return strings.Join(out, "\n")
}
