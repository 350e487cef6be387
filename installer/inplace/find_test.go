package inplace

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/nftmesh/nftmesh/testkit/cgrouptest"
)

func TestParseStartTicks(t *testing.T) {
	// Real line shape: 52 fields, starttime is field 22.
	line := func(comm string, start string) string {
		f := []string{"S", "1", "1", "1", "0", "-1", "4194560", "100", "0", "0", "0", "1", "2", "0", "0", "20", "0", "1", "0", start, "1000", "200"}
		for len(f) < 50 {
			f = append(f, "0")
		}
		return "4242 (" + comm + ") " + strings.Join(f, " ") + "\n"
	}
	cases := []struct {
		name, in string
		want     uint64
		err      string
	}{
		{"plain", line("sleep", "123456"), 123456, ""},
		{"comm with spaces and parens", line("a) b (c", "77"), 77, ""},
		{"comm ) 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20", line(") 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20", "9"), 9, ""},
		{"no paren", "4242 sleep S 1 1", 0, "no ')'"},
		{"truncated", "4242 (sleep) S 1 1 1", 0, "fields after the command name"},
		{"not a number", strings.Replace(line("sleep", "x12"), " x12 ", " x12 ", 1), 0, `starttime "x12"`},
		{"empty", "", 0, "no ')'"},
		{"long, quoted and cut", strings.Repeat("x", 100), 0, `/proc stat "` + strings.Repeat("x", 80) + `"... (20 of 100 bytes cut): no ')'`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := parseStartTicks([]byte(c.in))
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("err = %v, want one containing %q", err, c.err)
				}
				return
			}
			if err != nil || got != c.want {
				t.Fatalf("= %d, %v; want %d", got, err, c.want)
			}
		})
	}
}

func FuzzParseStartTicks(f *testing.F) {
	f.Add([]byte("1 (init) S 0 1 1 0 -1 4194560 1 2 3 4 5 6 7 8 20 0 1 0 42 1 2\n"))
	f.Add([]byte("1 (a) b) S"))
	f.Add([]byte(")"))
	f.Fuzz(func(t *testing.T, b []byte) {
		v, err := parseStartTicks(b)
		if err == nil && v > 0 && !strings.Contains(string(b), fmt.Sprint(v)) {
			t.Fatalf("value %d not in the input", v)
		}
	})
}

func TestStartTicksOfThisProcess(t *testing.T) {
	self, err := StartTicks("/proc", os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	init, err := StartTicks("/proc", 1)
	if err != nil {
		t.Skipf("cannot read PID 1: %v", err)
	}
	if !(init < self) {
		t.Fatalf("PID 1 started at %d, this test at %d: init must be older", init, self)
	}
}

func needRoot(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("skipping: -short (needs root, network namespaces and nftables)")
	}
	if os.Geteuid() != 0 {
		t.Skip("skipping: needs root (network namespaces, netlink in other namespaces, nftables)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("skipping: needs the ip command (iproute2) to build test namespaces")
	}
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func sh(t testing.TB, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}

// podNetns makes a named netns ("e2e-…") holding a veth end with the
// given addresses (the other end in a second throw-away netns, so the
// machine's own namespace is never touched). Both go away in t.Cleanup.
func podNetns(t testing.TB, addrs ...netip.Prefix) string {
	t.Helper()
	id := randHex(4)
	name, peer := "e2e-rp-"+id, "e2e-rq-"+id
	for _, n := range []string{name, peer} {
		sh(t, "ip", "netns", "add", n)
		n := n
		t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", n).Run() })
	}
	sh(t, "ip", "-n", name, "link", "add", "eth0", "type", "veth", "peer", "name", "p0", "netns", peer)
	sh(t, "ip", "-n", name, "link", "set", "lo", "up")
	sh(t, "ip", "-n", name, "link", "set", "eth0", "up")
	sh(t, "ip", "-n", peer, "link", "set", "p0", "up")
	for _, a := range addrs {
		args := []string{"-n", name, "addr", "add", a.String(), "dev", "eth0"}
		if a.Addr().Is6() {
			args = append(args, "nodad")
		}
		sh(t, "ip", args...)
	}
	return name
}

// sleeper starts `sleep` inside the named netns (ip netns exec execs it, so
// the PID is the sleeper's; wrapper, e.g. setpriv, execs too) and kills it
// in t.Cleanup.
func sleeper(t testing.TB, netnsName string, wrapper ...string) int {
	t.Helper()
	args := append(append([]string{"netns", "exec", netnsName}, wrapper...), "sleep", "300")
	cmd := exec.Command("ip", args...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	// Wait until the exec happened: the process shows the target netns.
	want, err := nsIdentity("/run/netns/" + netnsName)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		id, err := nsIdentity(fmt.Sprintf("/proc/%d/ns/net", cmd.Process.Pid))
		if err == nil && id == want {
			if b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", cmd.Process.Pid)); strings.TrimSpace(string(b)) == "sleep" {
				return cmd.Process.Pid
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d never ran sleep in %s", cmd.Process.Pid, netnsName)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// uniqueAddrs returns a v4 and a v6 address no other test uses.
func uniqueAddrs() (netip.Prefix, netip.Prefix) {
	var b [3]byte
	_, _ = rand.Read(b[:])
	v4 := netip.AddrFrom4([4]byte{100, 64 + b[0]%64, b[1], b[2]%250 + 2})
	v6 := netip.MustParseAddr(fmt.Sprintf("fd00:e2e:%x::%x", uint16(b[0])<<8|uint16(b[1]), uint16(b[2])+2))
	return netip.PrefixFrom(v4, 24), netip.PrefixFrom(v6, 64)
}

// FindNetns picks the namespace that holds the pod's IP and, in it, the
// oldest process; decoy namespaces and processes are ignored.
func TestFindNetns(t *testing.T) {
	needRoot(t)
	v4, v6 := uniqueAddrs()
	decoy4, _ := uniqueAddrs()
	pod := podNetns(t, v4, v6)
	decoy := podNetns(t, decoy4)
	_ = sleeper(t, decoy)
	oldest := sleeper(t, pod)
	time.Sleep(20 * time.Millisecond) // a later start tick for the second one
	_ = sleeper(t, pod)

	podID, err := nsIdentity("/run/netns/" + pod)
	if err != nil {
		t.Fatal(err)
	}
	for _, ips := range [][]netip.Addr{{v4.Addr()}, {v6.Addr()}, {netip.MustParseAddr("192.0.2.99"), v4.Addr()}} {
		start := time.Now()
		got, err := FindNetns("/proc", "", ips)
		if err != nil {
			t.Fatalf("FindNetns(%v): %v", ips, err)
		}
		t.Logf("FindNetns(%v) = pid %d %s (%d candidates) in %v", ips, got.PID, got.Path, got.Candidates, time.Since(start).Round(time.Microsecond))
		if got.PID != oldest || got.Path != fmt.Sprintf("/proc/%d/ns/net", oldest) {
			t.Errorf("picked pid %d (%s), want the oldest sleeper %d", got.PID, got.Path, oldest)
		}
		if (nsID{got.Dev, got.Inode}) != podID || got.Candidates != 1 {
			t.Errorf("picked namespace %d:%d with %d candidates, want %d:%d and 1", got.Dev, got.Inode, got.Candidates, podID.dev, podID.ino)
		}
	}

	_, err = FindNetns("/proc", "", []netip.Addr{netip.MustParseAddr("192.0.2.99")})
	if !errors.Is(err, ErrNotFound) {
		t.Errorf("an IP nobody holds: err = %v, want ErrNotFound", err)
	}
	if _, err := FindNetns("/proc", "", nil); err == nil || !strings.Contains(err.Error(), "no IPs") {
		t.Errorf("no IPs: err = %v", err)
	}
	if _, err := FindNetns("/nonexistent/proc", "", []netip.Addr{v4.Addr()}); err == nil || !strings.Contains(err.Error(), "/nonexistent/proc") {
		t.Errorf("missing proc dir: err = %v", err)
	}
}

// BenchmarkFindNetns walks this machine's /proc for a namespace held by a
// sleeper, the cost of locating one pod.
func BenchmarkFindNetns(b *testing.B) {
	needRoot(b)
	v4, _ := uniqueAddrs()
	pod := podNetns(b, v4)
	_ = sleeper(b, pod)
	for b.Loop() {
		if _, err := FindNetns("/proc", "", []netip.Addr{v4.Addr()}); err != nil {
			b.Fatal(err)
		}
	}
}

// Another network namespace on the machine holds the pod's IP too (a second
// cluster, a kind cluster in a CI pod), and its process is older than the
// pod's: FindNetns picks the namespace whose process is in the pod's
// cgroup, whichever cgroup driver named it. A lookup by IP alone (the
// oldest holder) picks the stranger.
func TestFindNetnsPicksThePodsCgroup(t *testing.T) {
	needRoot(t)
	for _, driver := range []string{"cgroupfs", "systemd"} {
		t.Run(driver, func(t *testing.T) {
			v4, _ := uniqueAddrs()
			uid := cgrouptest.NewUID()
			leaf := cgrouptest.CgroupfsLeaf(uid)
			if driver == "systemd" {
				leaf = cgrouptest.SystemdLeaf(uid)
			}
			decoy := podNetns(t, v4)
			stranger := sleeper(t, decoy)
			time.Sleep(20 * time.Millisecond) // a later start tick for the pod
			pod := podNetns(t, v4)
			pause := sleeper(t, pod)
			cgrouptest.MovePod(t, pause, leaf)
			podID, err := nsIdentity("/run/netns/" + pod)
			if err != nil {
				t.Fatal(err)
			}

			got, err := FindNetns("/proc", uid, []netip.Addr{v4.Addr()})
			if err != nil {
				t.Fatalf("FindNetns: %v", err)
			}
			t.Logf("FindNetns = pid %d (%s, %d candidates); the stranger is %d", got.PID, got.Match, got.Candidates, stranger)
			if got.PID != pause || (nsID{got.Dev, got.Inode}) != podID || got.Match != MatchCgroup || got.Candidates != 2 {
				t.Errorf("picked pid %d in %d:%d (%s, %d candidates), want the pod's %d in %d:%d by its cgroup among 2",
					got.PID, got.Dev, got.Inode, got.Match, got.Candidates, pause, podID.dev, podID.ino)
			}
		})
	}
}

// The only namespace holding the pod's IP belongs to another pod (its
// process is in that pod's cgroup): not the pod's, whatever its address;
// neither is one in no pod's cgroup on a host whose pods have cgroups. The
// lookup fails (retried later) instead of programming a stranger.
func TestFindNetnsRefusesAStranger(t *testing.T) {
	needRoot(t)
	uid := cgrouptest.NewUID()

	v4, _ := uniqueAddrs()
	other := podNetns(t, v4)
	cgrouptest.MovePod(t, sleeper(t, other), cgrouptest.CgroupfsLeaf(cgrouptest.NewUID()))
	_, err := FindNetns("/proc", uid, []netip.Addr{v4.Addr()})
	if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "1 in other pods' cgroups") {
		t.Errorf("IP held by another pod's namespace: err = %v, want ErrNotFound naming it", err)
	}

	// other's process makes this a host whose pods have cgroups.
	w4, _ := uniqueAddrs()
	plain := podNetns(t, w4)
	_ = sleeper(t, plain)
	_, err = FindNetns("/proc", uid, []netip.Addr{w4.Addr()})
	if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "none in the cgroup of pod "+uid) {
		t.Errorf("IP held by a namespace in no pod's cgroup: err = %v, want ErrNotFound", err)
	}
}

func TestPodUIDsInCgroups(t *testing.T) {
	const uid = "6387570a-0130-442b-bbdb-e69e3c110c0c"
	for _, tc := range []struct {
		name, file string
		want       []string
	}{
		{"cgroupfs v1", "9:name=systemd:/nftmesh-e2e-1/kubepods/besteffort/pod" + uid + "/c786ee1f\n4:memory:/kubepods/besteffort/pod" + uid + "/c786ee1f\n", []string{uid}},
		{"systemd v2", "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + strings.ReplaceAll(uid, "-", "_") + ".slice/cri-containerd-c786.scope\n", []string{uid}},
		{"guaranteed, upper case", "0::/kubepods/pod" + strings.ToUpper(uid) + "/x\n", []string{uid}},
		{"cgroup namespace", "0::/../../pod" + uid + "/c786\n", []string{uid}},
		{"nested: a kind node's pod", "0::/docker/ab12/kubelet/kubepods/pod" + uid + "/x\n", []string{uid}},
		{"two pods", "1:cpu:/kubepods/pod" + uid + "\n2:pids:/kubepods/pod11111111-2222-3333-4444-555555555555\n", []string{uid, "11111111-2222-3333-4444-555555555555"}},
		{"no pod", "0::/user.slice/session-1.scope\n9:name=systemd:/\n", nil},
		{"not a UUID", "0::/kubepods/poduid-0000/x\n", nil},
		{"pod in the controller field only", "3:pod" + uid + ":/x\n", nil},
		{"empty", "", nil},
		{"no colons", "pod" + uid + "\n", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := PodUIDsInCgroups([]byte(tc.file))
			if strings.Join(got, ",") != strings.Join(tc.want, ",") {
				t.Errorf("PodUIDsInCgroups(%q) = %q, want %q", tc.file, got, tc.want)
			}
		})
	}
}

func FuzzPodUIDsInCgroups(f *testing.F) {
	f.Add([]byte("0::/kubepods/besteffort/pod6387570a-0130-442b-bbdb-e69e3c110c0c/x\n"))
	f.Add([]byte("1:cpu:/kubepods-pod6387570a_0130_442b_bbdb_e69e3c110c0c.slice\n"))
	f.Add([]byte("::\n:"))
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, u := range PodUIDsInCgroups(b) {
			if len(u) != 36 || strings.Count(u, "-") != 4 || strings.ToLower(u) != u {
				t.Fatalf("%q is not a UID in API form", u)
			}
			if !bytes.Contains(bytes.ReplaceAll(bytes.ToLower(b), []byte("_"), []byte("-")), []byte(u)) {
				t.Fatalf("UID %q not in the input", u)
			}
		}
	})
}
