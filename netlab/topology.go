package netlab

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/nftmesh/nftmesh/internal/hostns"
)

// netnsDir is where named network namespaces are bind-mounted (as by
// `ip netns add`), so backends and humans can reach them by path.
const netnsDir = "/run/netns"

// Addresses of the topology. Every topology uses the same ones: each lives in
// its own pair of namespaces.
var (
	// The peer's end of the veth (the pod's are PodV4 and PodV6).
	PeerV4 = netip.MustParseAddr("198.18.0.1")
	PeerV6 = netip.MustParseAddr("fd00:6e74:7300::1")

	// Hosts the peer owns, one inside each of the scenarios' ranges and
	// one "other internet" address in neither.
	ExcludedV4Host = netip.MustParseAddr("192.0.2.10")     // scenarios.ExcludedV4
	ExcludedV6Host = netip.MustParseAddr("2001:db8:e::10") // scenarios.ExcludedV6
	IncludedV4Host = netip.MustParseAddr("198.51.100.10")  // scenarios.IncludedV4
	IncludedV6Host = netip.MustParseAddr("2001:db8:1::10") // scenarios.IncludedV6
	OtherV4Host    = netip.MustParseAddr("203.0.113.10")   // TEST-NET-3
	OtherV6Host    = netip.MustParseAddr("2001:db8:f::10") // outside both /48s

	// Destinations nobody owns that the peer routes through the pod, the way
	// a VM behind a reroute-virtual-interface sends its outbound traffic.
	ThroughPodV4 = netip.MustParseAddr("203.0.113.77")
	ThroughPodV6 = netip.MustParseAddr("2001:db8:f::77")

	// PassthroughV4/V6 are the sources Envoy binds to reach the app without
	// being captured again. Only 127.0.0.6 exists by itself (127/8 is on lo);
	// ::6 is added by the backend when the plan turns IPv6 on.
	PassthroughV4 = netip.MustParseAddr("127.0.0.6")
	PassthroughV6 = netip.MustParseAddr("::6")
)

// Default ports. The app ports include the ones Istio always leaves
// uncaptured inbound (15008, 15020, 15021, 15090) so probes can prove they
// reach the app directly.
var (
	DefaultAppPorts     = []uint16{8080, 8081, 9090, 9091, 15008, 15020, 15021, 15090}
	DefaultPeerTCPPorts = []uint16{53, 80, 443, 3306, 5432, 6379, 11211, 15020}
	DefaultPeerUDPPorts = []uint16{53}
)

// TopologyOptions shape a Topology. The zero value is usable.
type TopologyOptions struct {
	// Prefix starts both namespace names ("nts-" if empty); a random suffix
	// makes them unique.
	Prefix string
	// PodIface names the pod's end of the veth ("eth0" if empty).
	PodIface string
	// AppPorts are the TCP ports the pod's app serves (DefaultAppPorts if nil).
	AppPorts []uint16
	// PeerTCPPorts / PeerUDPPorts are served on every peer address (defaults
	// if nil).
	PeerTCPPorts []uint16
	PeerUDPPorts []uint16
	// Stack is the pod's address families, and the order its interface
	// gets them (StackDual if zero).
	Stack Stack
	// NewPodNetns, when set, creates the pod namespace bind-mounted at the
	// path it is given, and returns what removes it (Close calls it): tests
	// make one owned by its own user namespace (hostUsers: false), which
	// takes a process, and this package runs none.
	NewPodNetns func(path string) (io.Closer, error)
	// PodUIDBase / PodGIDBase: in-pod UIDs and GIDs 0, 1, ... are the
	// host's PodUIDBase, PodUIDBase+1, ... (its user namespace's ID map).
	// Probes and the DNS proxy's sockets are created with the host IDs
	// their in-pod IDs map to, the only ones the kernel keeps for a
	// socket's owner. Zero for a pod in the host's user namespace.
	PodUIDBase, PodGIDBase uint32
}

// Topology is a throw-away "pod" network namespace and a "peer" namespace
// joined by a veth pair. The pod has PodV4 and/or PodV6 (as Stack says) and
// a default route via the peer for each; the peer owns the external hosts
// (…Host addresses) on its lo and routes ThroughPodV4/V6 back through the
// pod.
type Topology struct {
	PodNetns, PeerNetns string // names under /run/netns
	PodIface, PeerIface string
	Stack               Stack

	AppPorts     []uint16
	PeerTCPPorts []uint16
	PeerUDPPorts []uint16

	PodUIDBase, PodGIDBase uint32

	made    []string    // namespaces created so far, for Close
	closers []io.Closer // what NewPodNetns returned, for Close
}

// hostCreds returns the host identity of in-pod uid and gid.
func (t *Topology) hostCreds(uid, gid uint32) *creds {
	return &creds{t.PodUIDBase + uid, t.PodGIDBase + gid}
}

// DoAs runs fn on a fresh OS thread in the pod namespace as in-pod uid and
// gid (mapped as for Probe): the sockets fn creates are the pod's, owned for
// netfilter as a pod process of that identity would own them. The thread
// dies when fn returns.
func (t *Topology) DoAs(uid, gid uint32, fn func() error) error {
	return inNetns(t.PodNetnsPath(), t.hostCreds(uid, gid), fn)
}

// PodNetnsPath is the pod namespace's path, what a Backend's Apply takes.
func (t *Topology) PodNetnsPath() string { return filepath.Join(netnsDir, t.PodNetns) }

// PeerNetnsPath is the peer namespace's path.
func (t *Topology) PeerNetnsPath() string { return filepath.Join(netnsDir, t.PeerNetns) }

// ExternalHosts are the addresses the peer owns.
func ExternalHosts() []netip.Addr {
	return []netip.Addr{ExcludedV4Host, ExcludedV6Host, IncludedV4Host, IncludedV6Host, OtherV4Host, OtherV6Host}
}

// NewTopology builds the namespaces, the veth pair, addresses and routes. On
// error everything created so far is removed again.
func NewTopology(opts TopologyOptions) (_ *Topology, err error) {
	opts.Prefix = cmp.Or(opts.Prefix, "nts-")
	opts.PodIface = cmp.Or(opts.PodIface, "eth0")
	// The suffix only has to differ from concurrent topologies' (a clash
	// fails), not be secret: crypto/rand would link the FIPS module into
	// the redirect CLI, whose every run pays its package inits.
	base := fmt.Sprintf("%s%08x", opts.Prefix, rand.Uint32())
	t := &Topology{
		PodNetns:     base + "-pod",
		PeerNetns:    base + "-peer",
		PodIface:     opts.PodIface,
		PeerIface:    "peer0",
		Stack:        opts.Stack,
		AppPorts:     orDefault(opts.AppPorts, DefaultAppPorts),
		PeerTCPPorts: orDefault(opts.PeerTCPPorts, DefaultPeerTCPPorts),
		PeerUDPPorts: orDefault(opts.PeerUDPPorts, DefaultPeerUDPPorts),
		PodUIDBase:   opts.PodUIDBase,
		PodGIDBase:   opts.PodGIDBase,
	}
	if t.PodIface == t.PeerIface {
		t.PeerIface = "peer1"
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, t.Close())
		}
	}()
	for _, name := range []string{t.PodNetns, t.PeerNetns} {
		if name == t.PodNetns && opts.NewPodNetns != nil {
			c, err := opts.NewPodNetns(filepath.Join(netnsDir, name))
			if err != nil {
				return nil, fmt.Errorf("creating pod network namespace %s: %w", name, err)
			}
			t.closers = append(t.closers, c)
		} else if err := createNamedNetns(name); err != nil {
			return nil, err
		}
		t.made = append(t.made, name)
	}
	if err := t.wire(); err != nil {
		return nil, fmt.Errorf("wiring topology %s: %w", base, err)
	}
	return t, nil
}

func orDefault(v, def []uint16) []uint16 {
	if v == nil {
		return slices.Clone(def)
	}
	return slices.Clone(v)
}

// createNamedNetns creates a network namespace bind-mounted at
// /run/netns/name (hostns.Create: a thread unshares into it, then dies).
func createNamedNetns(name string) error {
	return hostns.Create(filepath.Join(netnsDir, name))
}

// handleAt opens a netlink handle inside the named namespace: its sockets
// are made inside hostns's Do and stay there.
func handleAt(path string) (*netlink.Handle, error) {
	n, err := hostns.Open(path)
	if err != nil {
		return nil, fmt.Errorf("opening network namespace %s: %w", path, err)
	}
	defer n.Close()
	var h *netlink.Handle
	if err := n.Do(func() (err error) { h, err = netlink.NewHandle(); return err }); err != nil {
		return nil, fmt.Errorf("opening netlink in %s: %w", path, err)
	}
	return h, nil
}

// wiring is the netlink handles in both namespaces and the links wire
// brings up.
type wiring struct {
	pod, peer                 *netlink.Handle
	podLink, peerLink, peerLo netlink.Link
}

func (t *Topology) wire() error {
	pod, err := handleAt(t.PodNetnsPath())
	if err != nil {
		return err
	}
	defer pod.Close()
	peer, err := handleAt(t.PeerNetnsPath())
	if err != nil {
		return err
	}
	defer peer.Close()
	w := &wiring{pod: pod, peer: peer}
	// No duplicate address detection on the links' link-local addresses
	// either: while fe80:: is tentative, the first IPv6 connection is
	// sometimes delayed by a second.
	for _, ns := range []string{t.PodNetnsPath(), t.PeerNetnsPath()} {
		if err := inNetns(ns, nil, func() error {
			return os.WriteFile("/proc/sys/net/ipv6/conf/default/accept_dad", []byte("0"), 0o644)
		}); err != nil {
			return fmt.Errorf("turning off IPv6 DAD in %s: %w", ns, err)
		}
	}

	if err := t.linkUp(w); err != nil {
		return err
	}
	if err := t.address(w); err != nil {
		return err
	}
	if err := t.neighbours(w); err != nil {
		return err
	}
	return t.route(w)
}

// linkUp adds the veth pair and brings it and both lo up.
func (t *Topology) linkUp(w *wiring) error {
	pod, peer := w.pod, w.peer
	peerNS, err := hostns.Open(t.PeerNetnsPath())
	if err != nil {
		return fmt.Errorf("opening network namespace %s: %w", t.PeerNetnsPath(), err)
	}
	defer peerNS.Close()
	// Created in the pod namespace with the peer end straight in the peer
	// namespace: the root namespace never sees either end.
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: t.PodIface},
		PeerName:      t.PeerIface,
		PeerNamespace: netlink.NsFd(peerNS.Fd()),
	}
	if err := pod.LinkAdd(veth); err != nil {
		return fmt.Errorf("adding veth %s/%s: %w", t.PodIface, t.PeerIface, err)
	}

	if w.podLink, err = setUp(pod, t.PodIface); err != nil {
		return err
	}
	if w.peerLink, err = setUp(peer, t.PeerIface); err != nil {
		return err
	}
	if _, err := setUp(pod, "lo"); err != nil {
		return err
	}
	if w.peerLo, err = setUp(peer, "lo"); err != nil {
		return err
	}

	// Until the kernel's linkwatch has processed the carrier change (up to a
	// second later), a veth still has its no-op qdisc and drops what is sent:
	// the first ARP/ND probe would be lost and the first connection would
	// stall for a retransmit.
	for _, l := range []struct {
		h    *netlink.Handle
		name string
	}{{pod, t.PodIface}, {peer, t.PeerIface}} {
		if err := waitOperUp(l.h, l.name); err != nil {
			return err
		}
	}
	return nil
}

func (t *Topology) address(w *wiring) error {
	// The pod's addresses in the order of its Stack: the kernel lists them
	// in its own order, which the IPv6 decision depends on.
	for _, a := range t.Stack.Added() {
		bits := 24
		if a.Is6() {
			bits = 64
		}
		if err := addAddr(w.pod, w.podLink, netip.PrefixFrom(a, bits)); err != nil {
			return err
		}
	}
	for _, a := range []netip.Prefix{netip.PrefixFrom(PeerV4, 24), netip.PrefixFrom(PeerV6, 64)} {
		if err := addAddr(w.peer, w.peerLink, a); err != nil {
			return err
		}
	}
	for _, h := range ExternalHosts() {
		if err := addAddr(w.peer, w.peerLo, netip.PrefixFrom(h, h.BitLen())); err != nil {
			return err
		}
	}
	return nil
}

// neighbours adds static neighbour entries for the veth's two ends: a lost
// first ARP or ND solicitation would cost a one-second retransmit.
func (t *Topology) neighbours(w *wiring) error {
	pod, peer := w.pod, w.peer
	podLink, peerLink := refresh(pod, w.podLink), refresh(peer, w.peerLink)
	for _, n := range []struct {
		h    *netlink.Handle
		link netlink.Link
		ip   netip.Addr
		mac  net.HardwareAddr
	}{
		{pod, podLink, PeerV4, peerLink.Attrs().HardwareAddr},
		{pod, podLink, PeerV6, peerLink.Attrs().HardwareAddr},
		{peer, peerLink, PodV4, podLink.Attrs().HardwareAddr},
		{peer, peerLink, PodV6, podLink.Attrs().HardwareAddr},
	} {
		fam := netlink.FAMILY_V4
		if n.ip.Is6() {
			fam = netlink.FAMILY_V6
		}
		if !t.hasFamily(n.ip) {
			continue
		}
		neigh := &netlink.Neigh{LinkIndex: n.link.Attrs().Index, Family: fam, State: netlink.NUD_PERMANENT,
			IP: net.IP(n.ip.AsSlice()), HardwareAddr: n.mac}
		if err := n.h.NeighSet(neigh); err != nil {
			return fmt.Errorf("adding neighbour %s on %s: %w", n.ip, n.link.Attrs().Name, err)
		}
	}
	return nil
}

func (t *Topology) route(w *wiring) error {
	pod, peer, podLink, peerLink := w.pod, w.peer, w.podLink, w.peerLink
	routes := []struct {
		h    *netlink.Handle
		link netlink.Link
		dst  netip.Prefix
		gw   netip.Addr
	}{
		{pod, podLink, netip.MustParsePrefix("0.0.0.0/0"), PeerV4},
		{pod, podLink, netip.MustParsePrefix("::/0"), PeerV6},
		{peer, peerLink, netip.PrefixFrom(ThroughPodV4, 32), PodV4},
		{peer, peerLink, netip.PrefixFrom(ThroughPodV6, 128), PodV6},
	}
	for _, r := range routes {
		if !t.hasFamily(r.gw) {
			continue
		}
		route := &netlink.Route{LinkIndex: r.link.Attrs().Index, Dst: ipNet(r.dst), Gw: net.IP(r.gw.AsSlice())}
		if err := r.h.RouteAdd(route); err != nil {
			return fmt.Errorf("adding route %s via %s: %w", r.dst, r.gw, err)
		}
	}
	return nil
}

// hasFamily reports whether the pod has an address of a's family.
func (t *Topology) hasFamily(a netip.Addr) bool {
	if a.Is4() {
		return t.Stack.Has4()
	}
	return t.Stack.Has6()
}

// refresh re-reads a link's attributes, such as the MAC.
func refresh(h *netlink.Handle, l netlink.Link) netlink.Link {
	if nl, err := h.LinkByIndex(l.Attrs().Index); err == nil {
		return nl
	}
	return l
}

func waitOperUp(h *netlink.Handle, name string) error {
	deadline := time.Now().Add(5 * time.Second)
	for {
		l, err := h.LinkByName(name)
		if err != nil {
			return fmt.Errorf("finding link %s: %w", name, err)
		}
		if l.Attrs().OperState == netlink.OperUp {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("waiting for link %s to come up: still %s after 5s", name, l.Attrs().OperState)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func setUp(h *netlink.Handle, name string) (netlink.Link, error) {
	l, err := h.LinkByName(name)
	if err != nil {
		return nil, fmt.Errorf("finding link %s: %w", name, err)
	}
	if err := h.LinkSetUp(l); err != nil {
		return nil, fmt.Errorf("setting link %s up: %w", name, err)
	}
	return l, nil
}

// addAddr adds an address; IPv6 ones skip duplicate address detection so
// they are usable at once instead of "tentative" for a second or two.
func addAddr(h *netlink.Handle, l netlink.Link, p netip.Prefix) error {
	a := &netlink.Addr{IPNet: ipNet(p)}
	if p.Addr().Is6() {
		a.Flags = unix.IFA_F_NODAD
	}
	if err := h.AddrAdd(l, a); err != nil {
		return fmt.Errorf("adding address %s to %s: %w", p, l.Attrs().Name, err)
	}
	return nil
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// Close deletes both namespaces and all they hold. It is safe on a partly
// built topology and more than once. Sockets still open in a namespace keep
// it alive (unnamed): close Listeners first.
func (t *Topology) Close() error {
	var errs []error
	for _, name := range t.made {
		if err := deleteNamedNetns(name); err != nil {
			errs = append(errs, err)
		}
	}
	t.made = nil
	for _, c := range t.closers {
		if err := c.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	t.closers = nil
	return errors.Join(errs...)
}

// deleteNamedNetns unmounts and removes /run/netns/name. Unlike
// vishvananda/netns's DeleteNamed it also removes a mount point left unmounted by a failed
// creation, and treats "already gone" as success.
func deleteNamedNetns(name string) error {
	path := filepath.Join(netnsDir, name)
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmounting network namespace %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing network namespace %s: %w", path, err)
	}
	return nil
}
