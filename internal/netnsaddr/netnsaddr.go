// Package netnsaddr reads the addresses of a network namespace in the order
// the kernel lists them, which decides a pod's IPv6 capture
// (meshpod.IPv6Capture). It owns only the reading: no decision, no writes.
package netnsaddr

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"

	"github.com/nftmesh/nftmesh/internal/hostns"
)

// dumpAttempts bounds the retries of an address dump that the kernel
// reports as interrupted (addresses changed while it ran).
const dumpAttempts = 3

// List returns every address on every interface of the network namespace at
// path (such as /var/run/netns/NAME or /proc/PID/ns/net), loopback and
// link-local ones included, in the order the kernel lists them.
//
// That order is one RTM_GETADDR dump for all families, as net.InterfaceAddrs
// gets it inside the namespace (and so as Istio sees them): every IPv4
// address, interface by interface, then every IPv6 one. For a
// point-to-point address it is the local end.
func List(path string) ([]netip.Addr, error) {
	// The path comes from CNI_NETNS or --netns and may name a FIFO.
	n, err := hostns.Open(path)
	if err != nil {
		return nil, fmt.Errorf("listing addresses: %w", err)
	}
	defer n.Close()
	return ListIn(n, path)
}

// ListIn is List of the namespace n, which path names (in errors): the
// one address lister of nftmesh (the plugin's IPv6 decision, the in-place
// repair's search for a pod's namespace). The dump runs inside
// hostns.Netns.Do (netlink's package-level AddrList opens its socket on the
// calling thread), not on a handle from netlink.NewHandleAt, which moves
// the caller's own thread into n and back and ignores a failure to move
// back; a thread Do cannot move back dies. An interrupted dump is retried;
// a third interruption is an error, never a partial list.
func ListIn(n *hostns.Netns, path string) ([]netip.Addr, error) {
	var as []netlink.Addr
	err := n.Do(func() (err error) {
		for attempt := 1; ; attempt++ {
			// FAMILY_ALL is AF_UNSPEC: one dump of all families, in the
			// kernel's order, not two dumps concatenated in ours.
			as, err = netlink.AddrList(nil, netlink.FAMILY_ALL)
			if !errors.Is(err, netlink.ErrDumpInterrupted) || attempt == dumpAttempts {
				return err
			}
		}
	})
	if err != nil {
		return nil, fmt.Errorf("listing addresses in %s: %w", path, err)
	}
	out := make([]netip.Addr, 0, len(as))
	for _, a := range as {
		// IPNet is the local end of a point-to-point address (IFA_LOCAL),
		// else IFA_ADDRESS; nil when the message has neither.
		if a.IPNet == nil {
			continue
		}
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			out = append(out, ip)
		}
	}
	return out, nil
}
