package nft

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// nsPrefix keeps this package's namespaces apart from other packages' tests.
const nsPrefix = "nfa-"

// newNetns creates a named namespace with lo up and returns its path and a
// cleanup function. It switches a locked thread into the new namespace and
// straight back, so the calling goroutine's namespace never changes.
func newNetns(tb testing.TB) (string, func()) {
	tb.Helper()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	name := nsPrefix + hex.EncodeToString(b)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		tb.Fatalf("getting current netns: %v", err)
	}
	defer orig.Close()
	h, err := netns.NewNamed(name)
	if serr := netns.Set(orig); serr != nil {
		// The thread is stuck in the wrong namespace: keep it locked so
		// the runtime throws it away instead of reusing it.
		runtime.LockOSThread()
		tb.Fatalf("switching back to the original netns: %v", serr)
	}
	if err != nil {
		tb.Fatalf("creating netns %s: %v", name, err)
	}
	path := "/var/run/netns/" + name
	cleanup := func() {
		h.Close()
		if err := netns.DeleteNamed(name); err != nil {
			tb.Errorf("deleting netns %s: %v", name, err)
		}
	}
	nh, err := netlink.NewHandleAt(h)
	if err != nil {
		cleanup()
		tb.Fatalf("rtnetlink in %s: %v", name, err)
	}
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

// podNetns is a fresh "pod" namespace joined by a veth pair to a "peer"
// namespace, both with IPv4 and IPv6 addresses, so IPv6 is live.
func podNetns(t *testing.T) string {
	t.Helper()
	pod, cleanPod := newNetns(t)
	t.Cleanup(cleanPod)
	peer, cleanPeer := newNetns(t)
	t.Cleanup(cleanPeer)
	podNS, err := netns.GetFromPath(pod)
	if err != nil {
		t.Fatal(err)
	}
	defer podNS.Close()
	peerNS, err := netns.GetFromPath(peer)
	if err != nil {
		t.Fatal(err)
	}
	defer peerNS.Close()
	hp, err := netlink.NewHandleAt(podNS)
	if err != nil {
		t.Fatal(err)
	}
	defer hp.Close()
	hq, err := netlink.NewHandleAt(peerNS)
	if err != nil {
		t.Fatal(err)
	}
	defer hq.Close()
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}, PeerName: "eth0p", PeerNamespace: netlink.NsFd(int(peerNS))}
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
