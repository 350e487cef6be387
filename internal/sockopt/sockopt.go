// Package sockopt reads and sets the socket options a stand-in for Envoy
// needs: SO_ORIGINAL_DST (where a connection was going before a REDIRECT)
// and IP_TRANSPARENT (to accept connections a TPROXY rule delivers to a
// socket that does not own the destination address).
//
// It is shared by the real-traffic lab (netlab) and the stand-in
// proxy the cluster end-to-end test runs in place of Envoy, so both read
// original destinations the same way. It owns no sockets and never logs.
package sockopt

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// soOriginalDst is SO_ORIGINAL_DST (IPv4, level SOL_IP) and
// IP6T_SO_ORIGINAL_DST (IPv6, level SOL_IPV6): both 80.
const soOriginalDst = 80

// ErrNoOriginalDst is returned by OriginalDst when conntrack does not track
// the connection, so the kernel knows no destination other than the
// socket's local address.
var ErrNoOriginalDst = errors.New("connection has no original destination (not redirected)")

// OriginalDst reads SO_ORIGINAL_DST of an accepted TCP connection: the
// destination before a REDIRECT (nat) rule changed it. The address family
// follows the connection's local address; IPv4-mapped addresses are
// unmapped.
func OriginalDst(c *net.TCPConn) (netip.AddrPort, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("reading SO_ORIGINAL_DST: %w", err)
	}
	v6 := AddrPort(c.LocalAddr()).Addr().Is6()
	var out netip.AddrPort
	var serr error
	cerr := rc.Control(func(fd uintptr) {
		if v6 {
			var sa unix.RawSockaddrInet6
			size := uint32(unsafe.Sizeof(sa))
			serr = getsockopt(fd, unix.SOL_IPV6, soOriginalDst, unsafe.Pointer(&sa), &size)
			out = netip.AddrPortFrom(netip.AddrFrom16(sa.Addr).Unmap(), ntohs(sa.Port))
			return
		}
		var sa unix.RawSockaddrInet4
		size := uint32(unsafe.Sizeof(sa))
		serr = getsockopt(fd, unix.SOL_IP, soOriginalDst, unsafe.Pointer(&sa), &size)
		out = netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), ntohs(sa.Port))
	})
	if cerr != nil {
		return netip.AddrPort{}, fmt.Errorf("reading SO_ORIGINAL_DST: %w", cerr)
	}
	if errors.Is(serr, unix.ENOENT) {
		return netip.AddrPort{}, ErrNoOriginalDst
	}
	if serr != nil {
		return netip.AddrPort{}, fmt.Errorf("reading SO_ORIGINAL_DST: %w", serr)
	}
	return out, nil
}

// Destination is where an accepted connection was going: SO_ORIGINAL_DST,
// which conntrack answers for every tracked connection (after a REDIRECT the
// destination before it; without NAT, as after TPROXY, the local address),
// or the local address when conntrack does not track the connection.
func Destination(c *net.TCPConn) (netip.AddrPort, error) {
	orig, err := OriginalDst(c)
	if errors.Is(err, ErrNoOriginalDst) {
		return AddrPort(c.LocalAddr()), nil
	}
	return orig, err
}

// Transparent is a net.ListenConfig Control function that sets
// IP_TRANSPARENT (IPV6_TRANSPARENT on tcp6/udp6 sockets), which a socket
// needs to accept connections a TPROXY rule delivers. It needs
// CAP_NET_ADMIN (or CAP_NET_RAW).
func Transparent(network, _ string, rc syscall.RawConn) error {
	v6 := network == "tcp6" || network == "udp6"
	var serr error
	err := rc.Control(func(fd uintptr) {
		if v6 {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_IPV6, unix.IPV6_TRANSPARENT, 1)
			return
		}
		serr = unix.SetsockoptInt(int(fd), unix.SOL_IP, unix.IP_TRANSPARENT, 1)
	})
	if err != nil {
		return fmt.Errorf("setting IP_TRANSPARENT on a %s socket: %w", network, err)
	}
	if serr != nil {
		return fmt.Errorf("setting IP_TRANSPARENT on a %s socket: %w", network, serr)
	}
	return nil
}

// AddrPort is a TCP or UDP socket address as a netip.AddrPort, an
// IPv4-mapped IPv6 address unmapped (the zero AddrPort for other kinds).
func AddrPort(a net.Addr) netip.AddrPort {
	var ap netip.AddrPort
	switch a := a.(type) {
	case *net.TCPAddr:
		ap = a.AddrPort()
	case *net.UDPAddr:
		ap = a.AddrPort()
	default:
		return netip.AddrPort{}
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

func getsockopt(fd uintptr, level, opt int, val unsafe.Pointer, size *uint32) error {
	_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, fd, uintptr(level), uintptr(opt), uintptr(val), uintptr(unsafe.Pointer(size)), 0)
	if e != 0 {
		return e
	}
	return nil
}

// ntohs reads a port stored in network byte order.
func ntohs(p uint16) uint16 {
	b := (*[2]byte)(unsafe.Pointer(&p))
	return uint16(b[0])<<8 | uint16(b[1])
}

// RecvPktinfo is a net.ListenConfig Control function that asks for
// IP_PKTINFO (IPV6_RECVPKTINFO on udp6 sockets) on every datagram, so a UDP
// server bound to a wildcard address learns which address each datagram
// reached (PktinfoDst) and can answer from it (PktinfoSrc). Without that a
// reply to a redirected datagram leaves from the wrong source and conntrack
// cannot undo the redirect.
func RecvPktinfo(network, _ string, rc syscall.RawConn) error {
	v6 := network == "udp6"
	var serr error
	err := rc.Control(func(fd uintptr) {
		if v6 {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_RECVPKTINFO, 1)
			return
		}
		serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_PKTINFO, 1)
	})
	if err != nil {
		return fmt.Errorf("setting IP_PKTINFO on a %s socket: %w", network, err)
	}
	if serr != nil {
		return fmt.Errorf("setting IP_PKTINFO on a %s socket: %w", network, serr)
	}
	return nil
}

// PktinfoDst reads the destination address of a datagram from the control
// messages RecvPktinfo asked for.
func PktinfoDst(oob []byte) (netip.Addr, bool) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return netip.Addr{}, false
	}
	for _, m := range msgs {
		switch {
		case m.Header.Level == unix.IPPROTO_IP && m.Header.Type == unix.IP_PKTINFO && len(m.Data) >= unix.SizeofInet4Pktinfo:
			pi := (*unix.Inet4Pktinfo)(unsafe.Pointer(&m.Data[0]))
			return netip.AddrFrom4(pi.Addr), true
		case m.Header.Level == unix.IPPROTO_IPV6 && m.Header.Type == unix.IPV6_PKTINFO && len(m.Data) >= unix.SizeofInet6Pktinfo:
			pi := (*unix.Inet6Pktinfo)(unsafe.Pointer(&m.Data[0]))
			return netip.AddrFrom16(pi.Addr), true
		}
	}
	return netip.Addr{}, false
}

// PktinfoSrc is a control message that sends a datagram from src.
func PktinfoSrc(src netip.Addr) []byte {
	if src.Is4() {
		b := make([]byte, unix.CmsgSpace(unix.SizeofInet4Pktinfo))
		h := (*unix.Cmsghdr)(unsafe.Pointer(&b[0]))
		h.Level, h.Type = unix.IPPROTO_IP, unix.IP_PKTINFO
		h.SetLen(unix.CmsgLen(unix.SizeofInet4Pktinfo))
		pi := (*unix.Inet4Pktinfo)(unsafe.Pointer(&b[unix.CmsgLen(0)]))
		pi.Spec_dst = src.As4()
		return b
	}
	b := make([]byte, unix.CmsgSpace(unix.SizeofInet6Pktinfo))
	h := (*unix.Cmsghdr)(unsafe.Pointer(&b[0]))
	h.Level, h.Type = unix.IPPROTO_IPV6, unix.IPV6_PKTINFO
	h.SetLen(unix.CmsgLen(unix.SizeofInet6Pktinfo))
	pi := (*unix.Inet6Pktinfo)(unsafe.Pointer(&b[unix.CmsgLen(0)]))
	pi.Addr = src.As16()
	return b
}
