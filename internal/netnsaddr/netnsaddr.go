// Package netnsaddr reads the addresses of a network namespace in the order
// the kernel lists them, which is what decides a pod's IPv6 capture
// (meshpod.IPv6Capture). It reads through an rtnetlink socket created
// inside the namespace by a thread that enters it and leaves
// (hostns.Netns.Do); the caller's thread never changes namespace and
// nothing is executed.
//
// It owns only the reading: no decision, no writes.
package netnsaddr

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/nftmesh/nftmesh/internal/hostns"
)

// dumpAttempts bounds the retries of an address dump that the kernel
// reports as interrupted (addresses changed while it ran).
const dumpAttempts = 3

// errDumpInterrupted is a dump the kernel marked NLM_F_DUMP_INTR: the
// addresses changed while it ran, so it may be inconsistent.
var errDumpInterrupted = errors.New("address dump interrupted by a change")

// List returns every address on every interface of the network namespace at
// path (such as /var/run/netns/NAME or /proc/PID/ns/net), loopback and
// link-local ones included, in the order the kernel lists them.
//
// That order is one RTM_GETADDR dump for all families, as net.InterfaceAddrs
// gets it inside the namespace (and so as Istio sees them): every IPv4
// address, interface by interface, then every IPv6 one. For a
// point-to-point address it is the local end.
func List(path string) ([]netip.Addr, error) {
	// Opened without blocking and checked to be a network namespace: the
	// path comes from CNI_NETNS or --netns and may name a FIFO.
	n, err := hostns.Open(path)
	if err != nil {
		return nil, fmt.Errorf("listing addresses: %w", err)
	}
	defer n.Close()
	return ListIn(n, path)
}

// ListIn is List of the namespace n, which path names (in errors).
func ListIn(n *hostns.Netns, path string) ([]netip.Addr, error) {
	var out []netip.Addr
	err := n.Do(func() (err error) {
		out, err = ListHere()
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("listing addresses in %s: %w", path, err)
	}
	return out, nil
}

// ListHere is List for the calling thread's network namespace: it must run
// on a thread inside it (hostns.Netns.Do).
func ListHere() ([]netip.Addr, error) {
	for attempt := 1; ; attempt++ {
		// AF_UNSPEC asks for one dump of every family, in the kernel's
		// order, not two dumps concatenated in ours. The standard
		// library's dump is plain system calls on a socket of its own,
		// created here, in this thread's namespace.
		rib, err := syscall.NetlinkRIB(syscall.RTM_GETADDR, syscall.AF_UNSPEC)
		if err != nil {
			return nil, fmt.Errorf("dumping addresses: %w", err)
		}
		out, err := parseAddrs(rib)
		if errors.Is(err, errDumpInterrupted) && attempt < dumpAttempts {
			continue
		}
		return out, err
	}
}

// parseAddrs reads the addresses of an RTM_GETADDR dump in order: of each
// message, IFA_LOCAL where it is there (the local end of a point-to-point
// address), else IFA_ADDRESS; messages with neither are skipped.
func parseAddrs(rib []byte) ([]netip.Addr, error) {
	msgs, err := syscall.ParseNetlinkMessage(rib)
	if err != nil {
		return nil, fmt.Errorf("parsing the address dump: %w", err)
	}
	out := make([]netip.Addr, 0, len(msgs))
	for _, m := range msgs {
		if m.Header.Flags&unix.NLM_F_DUMP_INTR != 0 {
			return nil, errDumpInterrupted
		}
		if m.Header.Type != syscall.RTM_NEWADDR {
			continue
		}
		if len(m.Data) < syscall.SizeofIfAddrmsg {
			return nil, fmt.Errorf("parsing the address dump: short address message (%d bytes)", len(m.Data))
		}
		// Attributes are walked here: the standard library's parser
		// (ParseNetlinkRouteAttr) slices past the end of a message whose
		// last attribute's padding is cut off, and panics.
		var local, addr []byte
		for b := m.Data[syscall.SizeofIfAddrmsg:]; len(b) >= syscall.SizeofRtAttr; {
			l := int(binary.NativeEndian.Uint16(b[0:2]))
			if l < syscall.SizeofRtAttr || l > len(b) {
				return nil, fmt.Errorf("parsing an address message: attribute of %d bytes in %d", l, len(b))
			}
			switch binary.NativeEndian.Uint16(b[2:4]) {
			case syscall.IFA_LOCAL:
				local = b[syscall.SizeofRtAttr:l]
			case syscall.IFA_ADDRESS:
				addr = b[syscall.SizeofRtAttr:l]
			}
			b = b[min((l+syscall.RTA_ALIGNTO-1)&^(syscall.RTA_ALIGNTO-1), len(b)):]
		}
		if local != nil {
			addr = local
		}
		if ip, ok := netip.AddrFromSlice(addr); ok {
			out = append(out, ip)
		}
	}
	return out, nil
}
