package nft

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/nftmesh/nftmesh/internal/hostns"
)

// nsPrefix keeps this package's namespaces apart from other packages' tests.
const nsPrefix = "nfa-"

// newNetns creates a named namespace with lo up and returns its path and a
// cleanup function. hostns creates it on a thread that then ends, so the
// calling goroutine's namespace never changes.
func newNetns(tb testing.TB) (string, func()) {
	tb.Helper()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	name := nsPrefix + hex.EncodeToString(b)
	path := "/var/run/netns/" + name
	if err := hostns.Create(path); err != nil {
		tb.Fatal(err)
	}
	cleanup := func() {
		if err := netns.DeleteNamed(name); err != nil {
			tb.Errorf("deleting netns %s: %v", name, err)
		}
	}
	nh := handleIn(tb, path)
	defer nh.Close()
	lo, err := nh.LinkByName("lo")
	if err == nil {
		err = nh.LinkSetUp(lo)
	}
	if err != nil {
		cleanup()
		tb.Fatalf("bringing lo up in %s: %v", name, err)
	}
	return path, cleanup
}

// handleIn is an rtnetlink handle whose socket was opened inside the
// namespace at path (hostns.Do): it acts there from any thread.
func handleIn(tb testing.TB, path string) *netlink.Handle {
	tb.Helper()
	ns, err := hostns.Open(path)
	if err != nil {
		tb.Fatal(err)
	}
	defer ns.Close()
	var h *netlink.Handle
	if err := ns.Do(func() (err error) {
		h, err = netlink.NewHandle(unix.NETLINK_ROUTE)
		return err
	}); err != nil {
		tb.Fatalf("rtnetlink in %s: %v", path, err)
	}
	return h
}

// podNetns is a fresh "pod" namespace joined by a veth pair to a "peer"
// namespace, both with IPv4 and IPv6 addresses, so IPv6 is live.
func podNetns(t *testing.T) string {
	t.Helper()
	pod, cleanPod := newNetns(t)
	t.Cleanup(cleanPod)
	peer, cleanPeer := newNetns(t)
	t.Cleanup(cleanPeer)
	peerNS, err := hostns.Open(peer)
	if err != nil {
		t.Fatal(err)
	}
	defer peerNS.Close()
	hp := handleIn(t, pod)
	defer hp.Close()
	hq := handleIn(t, peer)
	defer hq.Close()
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}, PeerName: "eth0p", PeerNamespace: netlink.NsFd(peerNS.Fd())}
	if err := hp.LinkAdd(veth); err != nil {
		t.Fatalf("adding veth: %v", err)
	}
	setup := func(h *netlink.Handle, name, v4, v6 string) {
		l, err := h.LinkByName(name)
		if err != nil {
			t.Fatalf("finding %s: %v", name, err)
		}
		for _, a := range []string{v4, v6} {
			addr, err := netlink.ParseAddr(a)
			if err != nil {
				t.Fatal(err)
			}
			addr.Flags = 0x80 // IFA_F_NODAD: the address is usable at once
			if err := h.AddrAdd(l, addr); err != nil {
				t.Fatalf("adding %s to %s: %v", a, name, err)
			}
		}
		if err := h.LinkSetUp(l); err != nil {
			t.Fatal(err)
		}
	}
	setup(hp, "eth0", "203.0.113.2/24", "2001:db8:ff::2/64")
	setup(hq, "eth0p", "203.0.113.1/24", "2001:db8:ff::1/64")
	return pod
}

// inNetnsStart starts a long-running process in the namespace and returns
// its pid; it is killed at cleanup.
func inNetnsStart(t *testing.T, path string, args ...string) int {
	t.Helper()
	cmd := exec.Command("nsenter", append([]string{"--net=" + path, "--"}, args...)...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	// nsenter joins the namespace after it starts: wait until it has.
	want, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		got, err := os.Stat(fmt.Sprintf("/proc/%d/ns/net", cmd.Process.Pid))
		if err == nil && os.SameFile(got, want) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d did not enter %s", cmd.Process.Pid, path)
		}
	}
	return cmd.Process.Pid
}
