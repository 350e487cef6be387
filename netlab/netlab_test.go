package netlab

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"

	"github.com/nftmesh/nftmesh/redirect"
)

// childEnv makes the test binary, re-executed, send one probe and print the
// reply: the real-process half of TestThreadCredsMatchChildProcess.
const childEnv = "NETLAB_CHILD_PROBE"

func TestMain(m *testing.M) {
	if arg := os.Getenv(childEnv); arg != "" {
		os.Exit(childProbe(arg))
	}
	os.Exit(m.Run())
}

// childProbe runs in a child started inside the pod namespace under the
// probe's credentials; it only sends.
func childProbe(arg string) int {
	proto, dst, ok := strings.Cut(arg, " ")
	if !ok {
		fmt.Fprintf(os.Stderr, "bad %s %q\n", childEnv, arg)
		return 2
	}
	p := redirect.ProtoTCP
	if proto == "udp" {
		p = redirect.ProtoUDP
	}
	line, err := exchange(p, netip.Addr{}, netip.MustParseAddrPort(dst))
	if err != nil {
		fmt.Println(classify(err))
		return 0
	}
	os.Stdout.Write(line)
	return 0
}

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces, veths and netfilter rules")
	}
}

func newTopo(t *testing.T, opts TopologyOptions) (*Topology, *Listeners) {
	t.Helper()
	topo, err := NewTopology(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := topo.Close(); err != nil {
			t.Error(err)
		}
	})
	ls, err := StartListeners(topo, ListenerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := ls.Close(); err != nil {
			t.Error(err)
		}
	})
	return topo, ls
}

// nft installs rules in the pod namespace with the nft binary: an
// independent way to program capture, so the harness is tested without
// depending on our own backends.
func nft(t *testing.T, topo *Topology, script string) {
	t.Helper()
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("needs the nft binary (Debian package nftables)")
	}
	cmd := exec.Command("ip", "netns", "exec", topo.PodNetns, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nft -f in %s: %v\n%s\n%s", topo.PodNetns, err, out, script)
	}
}

func mounted(t *testing.T, name string) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	return strings.Contains(string(b), filepath.Join(netnsDir, name)+" ")
}

func TestTopologyUpDownLeavesNothing(t *testing.T) {
	needRoot(t)
	topo, err := NewTopology(TopologyOptions{Prefix: "nts-updown-"})
	if err != nil {
		t.Fatal(err)
	}
	ls, err := StartListeners(topo, ListenerOptions{})
	if err != nil {
		topo.Close()
		t.Fatal(err)
	}
	names := []string{topo.PodNetns, topo.PeerNetns}
	for _, n := range names {
		if !strings.HasPrefix(n, "nts-updown-") {
			t.Errorf("namespace %q lacks the prefix", n)
		}
		if _, err := os.Stat(filepath.Join(netnsDir, n)); err != nil || !mounted(t, n) {
			t.Errorf("namespace %s not bind-mounted: %v", n, err)
		}
	}
	if r := topo.Probe(Probe{From: FromPeer, Proto: redirect.ProtoTCP, Dst: netip.AddrPortFrom(PodV4, 8080)}); r.Landed != AppListener(8080) {
		t.Errorf("topology not wired: peer → pod landed %s", r)
	}
	if err := ls.Close(); err != nil {
		t.Error(err)
	}
	if err := topo.Close(); err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if _, err := os.Stat(filepath.Join(netnsDir, n)); !os.IsNotExist(err) {
			t.Errorf("namespace %s still in %s after Close: %v", n, netnsDir, err)
		}
		if mounted(t, n) {
			t.Errorf("namespace %s still mounted after Close", n)
		}
	}
	if err := topo.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func TestTopologyPartialCreationCleansUp(t *testing.T) {
	needRoot(t)
	before, _ := filepath.Glob(filepath.Join(netnsDir, "nts-partial-*"))
	// An interface name the kernel refuses (over 15 bytes): the veth step
	// fails after both namespaces exist.
	_, err := NewTopology(TopologyOptions{Prefix: "nts-partial-", PodIface: "much-too-long-interface"})
	if err == nil {
		t.Fatal("NewTopology with an invalid interface name succeeded")
	}
	t.Logf("NewTopology failed as intended: %v", err)
	after, _ := filepath.Glob(filepath.Join(netnsDir, "nts-partial-*"))
	if len(after) != len(before) {
		t.Errorf("failed NewTopology left namespaces behind: %v (error was: %v)", after, err)
	}
}

// TestOriginalDstThroughRedirect captures outbound TCP with a plain nat
// redirect installed by the nft binary and checks that the probe lands on
// 15001 with SO_ORIGINAL_DST (v4 and v6) holding the real destination, and
// that UDP DNS redirected to 15053 reports its original destination too.
func TestOriginalDstThroughRedirect(t *testing.T) {
	needRoot(t)
	topo, _ := newTopo(t, TopologyOptions{})
	nft(t, topo, `
table inet nts {
	chain out {
		type nat hook output priority -100;
		meta l4proto tcp tcp dport 80 redirect to :15001
		meta l4proto udp udp dport 53 redirect to :15053
	}
	chain in {
		type nat hook prerouting priority -100;
		meta l4proto tcp tcp dport 8080 redirect to :15006
	}
}`)
	for _, c := range []struct {
		p    Probe
		want string
	}{
		{Probe{From: FromApp, UID: AppUID, GID: AppGID, Proto: redirect.ProtoTCP, Dst: netip.AddrPortFrom(OtherV4Host, 80)}, ListenerOutbound},
		{Probe{From: FromApp, UID: AppUID, GID: AppGID, Proto: redirect.ProtoTCP, Dst: netip.AddrPortFrom(OtherV6Host, 80)}, ListenerOutbound},
		{Probe{From: FromApp, UID: AppUID, GID: AppGID, Proto: redirect.ProtoTCP, Dst: netip.AddrPortFrom(ExcludedV4Host, 80)}, ListenerOutbound},
		{Probe{From: FromApp, UID: AppUID, GID: AppGID, Proto: redirect.ProtoTCP, Dst: netip.AddrPortFrom(OtherV4Host, 5432)}, PeerListener(netip.AddrPortFrom(OtherV4Host, 5432))},
		{Probe{From: FromApp, UID: AppUID, GID: AppGID, Proto: redirect.ProtoUDP, Dst: netip.AddrPortFrom(OtherV4Host, 53)}, ListenerDNS},
		{Probe{From: FromApp, UID: AppUID, GID: AppGID, Proto: redirect.ProtoUDP, Dst: netip.AddrPortFrom(OtherV6Host, 53)}, ListenerDNS},
		{Probe{From: FromPeer, Proto: redirect.ProtoTCP, Dst: netip.AddrPortFrom(PodV4, 8080)}, ListenerInbound},
		{Probe{From: FromPeer, Proto: redirect.ProtoTCP, Dst: netip.AddrPortFrom(PodV6, 8080)}, ListenerInbound},
	} {
		r := topo.Probe(c.p)
		if r.Landed != c.want || r.OrigDst != c.p.Dst {
			t.Errorf("%s: got %s, want %s (orig %s)", c.p, r, c.want, c.p.Dst)
		}
		if c.want == ListenerOutbound || c.want == ListenerInbound || c.want == ListenerDNS {
			// The listener really sat behind a NAT: its own address differs
			// from the original destination.
			if r.Local == r.OrigDst {
				t.Errorf("%s: local address %s equals the original destination; the redirect was not observed", c.p, r.Local)
			}
		}
	}
}

// TestThreadCredsMatchChildProcess proves the per-thread identity switch is
// what netfilter's owner match sees: a probe sent by a Go thread that set
// only its own credentials lands exactly where the same probe sent by a real
// child process running as that UID/GID lands.
func TestThreadCredsMatchChildProcess(t *testing.T) {
	needRoot(t)
	topo, _ := newTopo(t, TopologyOptions{})
	child := childBinary(t)
	checkThreadMatchesProcess(t, topo, "a real process", func(p Probe) Result { return childResult(t, topo, child, p) })
	// The test process itself kept its identity: only probe threads changed.
	if os.Getuid() != 0 || os.Getgid() != 0 || syscall.Geteuid() != 0 {
		t.Errorf("process identity changed: uid %d gid %d", os.Getuid(), os.Getgid())
	}
}

// checkThreadMatchesProcess installs rules that capture outbound TCP by the
// proxy's UID (port 80) and GID (port 5432), then sends probes as every mix
// of those IDs both from a Go thread with switched credentials and through
// proc (a real process, what the thread stands in for): both must land
// alike, where the rules send them.
func checkThreadMatchesProcess(t *testing.T, topo *Topology, what string, proc func(Probe) Result) {
	t.Helper()
	nft(t, topo, `
table inet nts {
	chain out {
		type nat hook output priority -100;
		meta skuid 1337 meta l4proto tcp tcp dport 80 redirect to :15001
		meta skgid 1337 meta l4proto tcp tcp dport 5432 redirect to :15001
	}
}`)
	for _, c := range []struct {
		uid, gid uint32
		dst      netip.AddrPort
		want     string
	}{
		{1337, 1337, netip.AddrPortFrom(OtherV4Host, 80), ListenerOutbound},
		{1337, 1000, netip.AddrPortFrom(OtherV6Host, 80), ListenerOutbound},
		{1000, 1000, netip.AddrPortFrom(OtherV4Host, 80), PeerListener(netip.AddrPortFrom(OtherV4Host, 80))},
		{1000, 1337, netip.AddrPortFrom(OtherV4Host, 5432), ListenerOutbound},
		{1337, 1000, netip.AddrPortFrom(OtherV4Host, 5432), PeerListener(netip.AddrPortFrom(OtherV4Host, 5432))},
	} {
		p := Probe{From: FromApp, UID: c.uid, GID: c.gid, Proto: redirect.ProtoTCP, Dst: c.dst}
		thread := topo.Probe(p)
		got := proc(p)
		if thread != got {
			t.Errorf("%s: thread credentials gave %s, %s %s", p, thread, what, got)
		}
		if thread.Landed != c.want || thread.OrigDst != c.dst {
			t.Errorf("%s: got %s, want %s (orig %s)", p, thread, c.want, c.dst)
		}
	}
}

// childBinary copies the test binary where an unprivileged UID can run it
// (go test's build directory is private to root).
func childBinary(t *testing.T) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "netlab-child-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(dir, "netlab.test")
	in, err := os.Open(self)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
	return dst
}

// childResult starts the child from a thread inside the pod namespace (the
// child inherits it) with the probe's credentials.
func childResult(t *testing.T, topo *Topology, bin string, p Probe) Result {
	t.Helper()
	var out []byte
	err := inNetns(topo.PodNetnsPath(), nil, func() error {
		cmd := exec.CommandContext(context.Background(), bin)
		cmd.Env = []string{childEnv + "=" + fmt.Sprintf("%s %s", p.Proto, p.Dst)}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: p.UID, Gid: p.GID}}
		var err error
		out, err = cmd.Output()
		return err
	})
	if err != nil {
		t.Fatalf("child probe %s: %v", p, err)
	}
	line, _ := bufio.NewReader(strings.NewReader(string(out))).ReadString('\n')
	var r Reply
	if err := json.Unmarshal([]byte(line), &r); err != nil {
		return Result{Landed: strings.TrimSpace(line)}
	}
	orig, _ := netip.ParseAddrPort(r.Orig)
	local, _ := netip.ParseAddrPort(r.Local)
	return Result{Landed: r.Listener, OrigDst: orig, Local: local}
}

// TestThreadCredsStayOnTheirThread: after many probes under other
// identities, the process and a fresh thread are still root.
func TestThreadCredsStayOnTheirThread(t *testing.T) {
	needRoot(t)
	topo, _ := newTopo(t, TopologyOptions{})
	for i := 0; i < 20; i++ {
		topo.Probe(Probe{From: FromApp, UID: 4000 + uint32(i), GID: 4000, Proto: redirect.ProtoTCP, Dst: netip.AddrPortFrom(PodV4, 8080)})
	}
	done := make(chan [2]int)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		done <- [2]int{syscall.Getuid(), syscall.Getgid()}
	}()
	if ids := <-done; ids != [2]int{0, 0} {
		t.Errorf("a thread of the test process runs as uid/gid %v", ids)
	}
}

// TestDoAs: fn runs in the pod namespace (it sees the pod's address) as the
// identity asked for, and the process keeps its own.
func TestDoAs(t *testing.T) {
	needRoot(t)
	topo, _ := newTopo(t, TopologyOptions{})
	var ids [2]int
	var addrs []net.Addr
	if err := topo.DoAs(1337, 1338, func() error {
		ids = [2]int{syscall.Getuid(), syscall.Getgid()}
		var err error
		addrs, err = net.InterfaceAddrs()
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if ids != [2]int{1337, 1338} {
		t.Errorf("fn ran as uid/gid %v, want [1337 1338]", ids)
	}
	found := false
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr() == PodV4 {
			found = true
		}
	}
	if !found {
		t.Errorf("fn did not run in the pod namespace: addresses %v, want %s among them", addrs, PodV4)
	}
	if uid := syscall.Getuid(); uid != 0 {
		t.Errorf("the calling thread runs as uid %d after DoAs", uid)
	}
}
