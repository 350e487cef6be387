// Package serve is what the small answering servers of nftmesh share (the
// real-traffic lab's listeners and the stand-ins the cluster end-to-end test
// runs in place of Envoy and the app): a group of listeners stopped
// together, and the UDP loop that answers each datagram from the address it
// reached. It never logs; callers report through their answer functions.
package serve

import (
	"errors"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/nftmesh/nftmesh/internal/sockopt"
)

// Group is a set of running listeners and the goroutines serving them. The
// zero value is ready to use.
type Group struct {
	mu      sync.Mutex
	closers []func() error
	wg      sync.WaitGroup
}

// Add registers what stops one listener.
func (g *Group) Add(stop func() error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.closers = append(g.closers, stop)
}

// Go runs fn in a goroutine Close waits for.
func (g *Group) Go(fn func()) {
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		fn()
	}()
}

// Close stops every listener and waits for the goroutines. A listener
// already closed is not an error.
func (g *Group) Close() error {
	g.mu.Lock()
	closers := g.closers
	g.closers = nil
	g.mu.Unlock()
	var errs []error
	for _, c := range closers {
		if err := c(); err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, err)
		}
	}
	g.wg.Wait()
	return errors.Join(errs...)
}

// AnswerDatagrams reads datagrams from c, a socket listening with
// sockopt.RecvPktinfo, until c is closed. Each is answered with what answer
// returns for the address it reached and its sender, sent from that address
// (a wildcard socket has none of its own) so conntrack recognises the answer
// and undoes a REDIRECT; sent, if not nil, learns how each send went. A
// datagram without its destination is dropped.
func AnswerDatagrams(c *net.UDPConn, timeout time.Duration, answer func(dst netip.Addr, from netip.AddrPort) []byte, sent func(error)) {
	buf := make([]byte, 1500)
	oob := make([]byte, 256)
	for {
		_, oobn, _, from, err := c.ReadMsgUDPAddrPort(buf, oob)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		from = netip.AddrPortFrom(from.Addr().Unmap(), from.Port())
		dst, ok := sockopt.PktinfoDst(oob[:oobn])
		if !ok {
			continue
		}
		dst = dst.Unmap()
		b := answer(dst, from)
		_ = c.SetWriteDeadline(time.Now().Add(timeout))
		_, _, err = c.WriteMsgUDPAddrPort(b, sockopt.PktinfoSrc(dst), from)
		if sent != nil {
			sent(err)
		}
	}
}
