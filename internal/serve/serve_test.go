package serve

import (
	"context"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/nftmesh/nftmesh/internal/sockopt"
)

// TestAnswerDatagrams: each datagram is answered with what answer returns
// for the address it reached, from that address; sent hears of each send;
// Close stops the loop and waits for it.
func TestAnswerDatagrams(t *testing.T) {
	lc := net.ListenConfig{Control: sockopt.RecvPktinfo}
	pc, err := lc.ListenPacket(context.Background(), "udp4", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	port := sockopt.AddrPort(pc.LocalAddr()).Port()
	var g Group
	g.Add(pc.Close)
	sent := make(chan error, 4)
	g.Go(func() {
		AnswerDatagrams(pc.(*net.UDPConn), time.Second, func(dst netip.Addr, from netip.AddrPort) []byte {
			return []byte(dst.String() + " " + from.Addr().String())
		}, func(err error) { sent <- err })
	})
	for _, dst := range []string{"127.0.0.1", "127.0.0.2"} {
		c, err := net.Dial("udp4", netip.AddrPortFrom(netip.MustParseAddr(dst), port).String())
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 100)
		n, err := c.Read(buf) // a connected socket: only an answer from dst itself arrives
		c.Close()
		if err != nil {
			t.Fatalf("answer to a datagram for %s: %v", dst, err)
		}
		if got, want := string(buf[:n]), dst+" 127.0.0.1"; got != want { // lo sends from 127.0.0.1
			t.Errorf("answer %q, want %q", got, want)
		}
		if err := <-sent; err != nil {
			t.Errorf("sent: %v", err)
		}
	}
	if err := g.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if err := g.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func TestAddrPortUnmaps(t *testing.T) {
	a := &net.UDPAddr{IP: net.ParseIP("192.0.2.1"), Port: 53} // 16-byte form
	if got := sockopt.AddrPort(a); got != netip.MustParseAddrPort("192.0.2.1:53") {
		t.Errorf("AddrPort(%v) = %v", a, got)
	}
	if got := sockopt.AddrPort(&net.UnixAddr{Name: "x"}); got.IsValid() {
		t.Errorf("AddrPort of a unix address = %v, want the zero value", got)
	}
}
