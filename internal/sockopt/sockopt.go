// Package sockopt reads and sets the socket options a stand-in for Envoy
// needs: SO_ORIGINAL_DST (where a connection was going before a REDIRECT),
// IP_TRANSPARENT (to accept connections a TPROXY rule delivers to a socket
// that does not own the destination address) and IP_PKTINFO. netlab and the
// cluster end-to-end stand-in share it, so both read original destinations
// the same way. It owns no sockets and never logs.
package sockopt

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Destination is where an accepted TCP connection was going:
// SO_ORIGINAL_DST, which conntrack answers for every tracked connection
// (after a REDIRECT the destination before it; without NAT, as after
// TPROXY, the local address), or the local address when conntrack does not
// track the connection (ENOENT). The address family follows the local
// address; IPv4-mapped addresses are unmapped.
func Destination(c *net.TCPConn) (netip.AddrPort, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("reading SO_ORIGINAL_DST: %w", err)
	}
	local := AddrPort(c.LocalAddr())
	v6 := local.Addr().Is6()
	// A struct sockaddr_in or sockaddr_in6, the port in network order.
	var sa [unix.SizeofSockaddrInet6]byte
	var serr error
	cerr := rc.Control(func(fd uintptr) {
		// IPv6's IP6T_SO_ORIGINAL_DST (level SOL_IPV6) is 80 as well.
		level, size := unix.SOL_IP, uint32(len(sa))
		if v6 {
			level = unix.SOL_IPV6
		}
		_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, fd, uintptr(level), unix.SO_ORIGINAL_DST,
			uintptr(unsafe.Pointer(&sa[0])), uintptr(unsafe.Pointer(&size)), 0)
		if e != 0 {
			serr = e
		}
	})
	if cerr != nil {
		return netip.AddrPort{}, fmt.Errorf("reading SO_ORIGINAL_DST: %w", cerr)
	}
	if errors.Is(serr, unix.ENOENT) {
		return local, nil
	}
	if serr != nil {
		return netip.AddrPort{}, fmt.Errorf("reading SO_ORIGINAL_DST: %w", serr)
	}
	port := binary.BigEndian.Uint16(sa[2:])
	if v6 {
		return netip.AddrPortFrom(netip.AddrFrom16([16]byte(sa[8:24])).Unmap(), port), nil
	}
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte(sa[4:8])), port), nil
}

// Transparent is a net.ListenConfig Control function that sets
// IP_TRANSPARENT (IPV6_TRANSPARENT on tcp6/udp6 sockets), which a socket
// needs to accept connections a TPROXY rule delivers. It needs
// CAP_NET_ADMIN (or CAP_NET_RAW).
func Transparent(network, _ string, rc syscall.RawConn) error {
	if err := setFlag(rc, network == "tcp6" || network == "udp6", unix.IP_TRANSPARENT, unix.IPV6_TRANSPARENT); err != nil {
		return fmt.Errorf("setting IP_TRANSPARENT on a %s socket: %w", network, err)
	}
	return nil
}

// setFlag sets the int option opt4 of level SOL_IP, or opt6 of SOL_IPV6
// when v6, to 1.
func setFlag(rc syscall.RawConn, v6 bool, opt4, opt6 int) error {
	level, opt := unix.SOL_IP, opt4
	if v6 {
		level, opt = unix.SOL_IPV6, opt6
	}
	var serr error
	if err := rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), level, opt, 1) }); err != nil {
		return err
	}
	return serr
}

// AddrPort is a TCP or UDP socket address as a netip.AddrPort, an
// IPv4-mapped IPv6 address unmapped (the zero AddrPort for other kinds).
func AddrPort(a net.Addr) netip.AddrPort {
	var ap netip.AddrPort // the zero AddrPort stays zero
	switch a := a.(type) {
	case *net.TCPAddr:
		ap = a.AddrPort()
	case *net.UDPAddr:
		ap = a.AddrPort()
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

// RecvPktinfo is a net.ListenConfig Control function that asks for
// IP_PKTINFO (IPV6_RECVPKTINFO on udp6 sockets) on every datagram, so a UDP
// server bound to a wildcard address learns which address each datagram
// reached (PktinfoDst) and can answer from it (PktinfoSrc). Without that a
// reply to a redirected datagram leaves from the wrong source and conntrack
// cannot undo the redirect.
func RecvPktinfo(network, _ string, rc syscall.RawConn) error {
	if err := setFlag(rc, network == "udp6", unix.IP_PKTINFO, unix.IPV6_RECVPKTINFO); err != nil {
		return fmt.Errorf("setting IP_PKTINFO on a %s socket: %w", network, err)
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
		return unix.PktInfo4(&unix.Inet4Pktinfo{Spec_dst: src.As4()})
	}
	return unix.PktInfo6(&unix.Inet6Pktinfo{Addr: src.As16()})
}
