package sockopt

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"strconv"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// TestDestinationWithoutRedirect: a connection nothing redirected reports
// the address it was made to (conntrack's tuple or, untracked, the local
// address). The REDIRECT and TPROXY cases need a network namespace with
// rules: testkit/nettest and the stand-in tests prove them.
func TestDestinationWithoutRedirect(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp4", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	a, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	got, err := Destination(a.(*net.TCPConn))
	if err != nil {
		t.Fatal(err)
	}
	if want := netip.MustParseAddrPort(ln.Addr().String()); got != want {
		t.Errorf("Destination = %v, want %v", got, want)
	}
}

// TestPktinfoRoundTrip: a wildcard UDP socket learns the address each
// datagram reached and answers from it.
func TestPktinfoRoundTrip(t *testing.T) {
	lc := net.ListenConfig{Control: RecvPktinfo}
	pc, err := lc.ListenPacket(context.Background(), "udp4", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	port := pc.LocalAddr().(*net.UDPAddr).Port
	cl, err := net.Dial("udp4", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := cl.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	buf, oob := make([]byte, 16), make([]byte, 256)
	_, oobn, _, from, err := pc.(*net.UDPConn).ReadMsgUDPAddrPort(buf, oob)
	if err != nil {
		t.Fatal(err)
	}
	dst, ok := PktinfoDst(oob[:oobn])
	if !ok || dst != netip.MustParseAddr("127.0.0.1") {
		t.Fatalf("PktinfoDst = %v, %v; want 127.0.0.1", dst, ok)
	}
	if _, _, err := pc.(*net.UDPConn).WriteMsgUDPAddrPort([]byte("y"), PktinfoSrc(dst), from); err != nil {
		t.Fatal(err)
	}
	if n, err := cl.Read(buf); err != nil || string(buf[:n]) != "y" {
		t.Fatalf("answer: %q, %v", buf[:n], err)
	}
	if _, ok := PktinfoDst(nil); ok {
		t.Error("PktinfoDst found an address in no control message")
	}
}

func TestTransparent(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("IP_TRANSPARENT needs CAP_NET_ADMIN: run as root")
	}
	for _, netw := range []string{"tcp4", "tcp6"} {
		lc := net.ListenConfig{Control: Transparent}
		host := "127.0.0.1:0"
		if netw == "tcp6" {
			host = "[::1]:0"
		}
		ln, err := lc.Listen(context.Background(), netw, host)
		if err != nil {
			t.Fatalf("%s: %v", netw, err)
		}
		rc, _ := ln.(*net.TCPListener).SyscallConn()
		var v int
		var gerr error
		_ = rc.Control(func(fd uintptr) {
			if netw == "tcp6" {
				v, gerr = unix.GetsockoptInt(int(fd), unix.SOL_IPV6, unix.IPV6_TRANSPARENT)
			} else {
				v, gerr = unix.GetsockoptInt(int(fd), unix.SOL_IP, unix.IP_TRANSPARENT)
			}
		})
		ln.Close()
		if gerr != nil || v != 1 {
			t.Errorf("%s: transparent = %d, %v; want 1", netw, v, gerr)
		}
	}
}

// TestTransparentNeedsPrivilege: without CAP_NET_ADMIN the option is
// refused with an error naming it, so a TPROXY listener never silently
// comes up without it.
func TestTransparentNeedsPrivilege(t *testing.T) {
	if os.Geteuid() == 0 {
		t.Skip("runs as root: the option is granted")
	}
	lc := net.ListenConfig{Control: Transparent}
	_, err := lc.Listen(context.Background(), "tcp4", "127.0.0.1:0")
	if err == nil {
		t.Fatal("IP_TRANSPARENT was granted without privilege")
	}
	if !errors.Is(err, syscall.EPERM) {
		t.Errorf("error = %v, want EPERM", err)
	}
}
