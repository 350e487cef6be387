package standin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nftmesh/nftmesh/internal/serve"
	"github.com/nftmesh/nftmesh/internal/sockopt"
)

// ioTimeout bounds every read and write of a server or dialer, so a
// connection whose packets are swallowed fails fast instead of hanging.
const ioTimeout = 3 * time.Second

// Server is a set of running listeners; Close stops them all and waits for
// their goroutines.
type Server struct {
	group serve.Group
	// RelayTimeout bounds a forwarded connection's whole life (0:
	// ioTimeout). Kubernetes' conformance specs hold connections through
	// the proxy for longer than a stand-in's own exchanges take.
	RelayTimeout time.Duration
}

// Close stops every listener and waits for the connections in flight.
func (s *Server) Close() error { return s.group.Close() }

// families are the socket families a server listens on: IPv4 always, IPv6
// where the pod has it (a pod without IPv6 refuses the socket; that is not
// an error). Each family gets its own socket (tcp6 wildcard sockets are
// IPV6_V6ONLY in Go), as Envoy's listeners do.
var families = []struct {
	suffix, host string
}{{"4", "0.0.0.0"}, {"6", "::"}}

// noIPv6 reports whether err says the pod has no IPv6 to listen on.
func noIPv6(err error) bool {
	return errors.Is(err, syscall.EAFNOSUPPORT) || errors.Is(err, syscall.EADDRNOTAVAIL) || errors.Is(err, syscall.EPROTONOSUPPORT)
}

// ServeTCP listens on port (IPv4 and, if present, IPv6) and answers every
// connection with one Reply line: the pod, name, and the connection's
// original destination. transparent sets IP_TRANSPARENT, which a listener
// needs to accept what a TPROXY rule delivers (and which needs
// CAP_NET_ADMIN: without it ServeTCP fails rather than listen in a way
// TPROXY cannot reach).
func (s *Server) ServeTCP(log *Log, name string, port uint16, transparent bool) error {
	return s.listenTCP(log, name, port, transparent, func(c *net.TCPConn) { answerTCP(log, name, c) })
}

// DialFunc opens a forwarding listener's connection to an original
// destination (net.Dialer.DialContext's signature). It must return a
// *net.TCPConn.
type DialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

// ForwardTCP listens like ServeTCP but, as Envoy's outbound listener does,
// relays each connection to its original destination instead of answering
// it: dial connects there (nil means a net.Dialer: from the process's own
// namespace and identity, UID 1337 or GID 1337 in a pod, which capture lets
// out as it lets Envoy's upstream connections out), and bytes flow both
// ways, each direction's end passed on as a half-close, until both ends are
// done. Whoever answers at the destination answers the client.
//
// The "accepted" event comes when the relay ends and holds, besides the
// original destination, ForwardFrom: the local address of the connection
// to the destination, which the destination sees as its peer when no NAT
// lies between. A connection whose original destination is unknown, is
// this listener itself (forwarding it would loop) or cannot be reached is
// closed without a reply and its event holds the error: the client sees
// its connection fail, as behind Envoy, rather than an answer from the
// proxy.
func (s *Server) ForwardTCP(log *Log, name string, port uint16, transparent bool, dial DialFunc) error {
	if dial == nil {
		var d net.Dialer
		dial = d.DialContext
	}
	var inFlight atomic.Int32
	return s.listenTCP(log, name, port, transparent, func(c *net.TCPConn) {
		if n := inFlight.Add(1); n > maxForwards {
			inFlight.Add(-1)
			refuseForward(log, name, c, n-1)
			return
		}
		defer inFlight.Add(-1)
		forwardTCP(log, name, c, dial, s.relayTimeout())
	})
}

// maxForwards bounds the connections a forwarding listener relays at once.
// A stand-in sees a handful; the bound is for a forwarding loop, where
// capture sends the proxy's own connections back to it (the proxy not
// running as the identity capture lets out): each would open the next
// until file descriptors ran out, the pod spinning meanwhile.
const maxForwards = 64

// refuseForward closes c unanswered and logs why: n relays in flight.
func refuseForward(log *Log, name string, c *net.TCPConn, n int32) {
	defer c.Close()
	log.Emit(Event{Event: EventAccepted, Proto: "tcp", Listener: name, Local: sockopt.AddrPort(c.LocalAddr()).String(), Peer: sockopt.AddrPort(c.RemoteAddr()).String(),
		Error: fmt.Sprintf("not forwarding: %d connections in flight already, the most a stand-in relays at once (a forwarding loop? the proxy's own connections captured back to it)", n)})
}

// listenTCP listens on port (IPv4 and, if present, IPv6) and hands every
// accepted connection to handle in a goroutine of its own.
func (s *Server) listenTCP(log *Log, name string, port uint16, transparent bool, handle func(*net.TCPConn)) error {
	for _, f := range families {
		netw := "tcp" + f.suffix
		addr := net.JoinHostPort(f.host, fmt.Sprint(port))
		lc := net.ListenConfig{}
		if transparent {
			lc.Control = sockopt.Transparent
		}
		ln, err := lc.Listen(context.Background(), netw, addr)
		if err != nil {
			if f.suffix == "6" && noIPv6(err) {
				continue
			}
			return fmt.Errorf("listening for %s on %s %s: %w", name, netw, addr, err)
		}
		s.group.Add(ln.Close)
		uid, gid := Identity()
		log.Emit(Event{Event: EventListening, Proto: "tcp", Listener: name, Local: ln.Addr().String(), UID: uid, GID: gid})
		s.group.Go(func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					if errors.Is(err, net.ErrClosed) {
						return
					}
					// Out of file descriptors and the like: back off
					// instead of spinning.
					time.Sleep(50 * time.Millisecond)
					continue
				}
				s.group.Go(func() { handle(c.(*net.TCPConn)) })
			}
		})
	}
	return nil
}

func answerTCP(log *Log, name string, c *net.TCPConn) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(ioTimeout))
	r := Reply{Pod: log.Pod(), Listener: name, Local: sockopt.AddrPort(c.LocalAddr()).String(), Peer: sockopt.AddrPort(c.RemoteAddr()).String()}
	e := Event{Event: EventAccepted, Proto: "tcp", Listener: name, Local: r.Local, Peer: r.Peer}
	if orig, err := sockopt.Destination(c); err != nil {
		e.Error = err.Error()
	} else {
		r.Orig = orig.String()
		e.Orig = r.Orig
	}
	b, _ := json.Marshal(r)
	if _, err := c.Write(append(b, '\n')); err != nil && e.Error == "" {
		e.Error = fmt.Sprintf("writing reply: %v", err)
	}
	log.Emit(e)
}

func (s *Server) relayTimeout() time.Duration {
	if s.RelayTimeout > 0 {
		return s.RelayTimeout
	}
	return ioTimeout
}

func forwardTCP(log *Log, name string, c *net.TCPConn, dial DialFunc, timeout time.Duration) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	local := sockopt.AddrPort(c.LocalAddr())
	e := Event{Event: EventAccepted, Proto: "tcp", Listener: name, Local: local.String(), Peer: sockopt.AddrPort(c.RemoteAddr()).String()}
	defer func() { log.Emit(e) }()
	orig, err := sockopt.Destination(c)
	if err != nil {
		e.Error = err.Error()
		return
	}
	e.Orig = orig.String()
	if orig == local {
		e.Error = fmt.Sprintf("not forwarding a connection to %s: the original destination is this listener", orig)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), ioTimeout)
	upc, err := dial(ctx, "tcp", orig.String())
	cancel()
	if err != nil {
		e.Error = fmt.Sprintf("forwarding to %s: %v", orig, err)
		return
	}
	defer upc.Close()
	up, ok := upc.(*net.TCPConn)
	if !ok {
		e.Error = fmt.Sprintf("forwarding to %s: the dialer returned a %T, not a TCP connection", orig, upc)
		return
	}
	e.ForwardFrom = sockopt.AddrPort(up.LocalAddr()).String()
	_ = up.SetDeadline(time.Now().Add(timeout))
	if err := relay(c, up); err != nil {
		e.Error = fmt.Sprintf("relaying to %s: %v", orig, err)
	}
}

// relay copies a to b and b to a until each side has sent its end, passing
// each end on as a half-close, and returns the copies' errors.
func relay(a, b *net.TCPConn) error {
	errc := make(chan error, 2)
	pipe := func(dst, src *net.TCPConn) {
		_, err := io.Copy(dst, src)
		if cerr := dst.CloseWrite(); err == nil && cerr != nil {
			err = fmt.Errorf("passing on the end of the stream: %w", cerr)
		}
		errc <- err
	}
	go pipe(b, a)
	go pipe(a, b)
	return errors.Join(<-errc, <-errc)
}

// ServeUDP listens for datagrams on port (IPv4 and, if present, IPv6) and
// answers each with a Reply datagram sent from the address it reached, so
// conntrack recognises the answer and undoes a REDIRECT on the way back.
// The original destination of a datagram is not known without conntrack
// queries (which need CAP_NET_ADMIN), so Reply.Orig stays empty: a datagram
// that reached this port was redirected to it.
func (s *Server) ServeUDP(log *Log, name string, port uint16) error {
	for _, f := range families {
		netw := "udp" + f.suffix
		addr := net.JoinHostPort(f.host, fmt.Sprint(port))
		lc := net.ListenConfig{Control: sockopt.RecvPktinfo}
		pc, err := lc.ListenPacket(context.Background(), netw, addr)
		if err != nil {
			if f.suffix == "6" && noIPv6(err) {
				continue
			}
			return fmt.Errorf("listening for %s on %s %s: %w", name, netw, addr, err)
		}
		s.group.Add(pc.Close)
		uid, gid := Identity()
		log.Emit(Event{Event: EventListening, Proto: "udp", Listener: name, Local: pc.LocalAddr().String(), UID: uid, GID: gid})
		s.group.Go(func() { answerUDP(log, name, pc.(*net.UDPConn)) })
	}
	return nil
}

func answerUDP(log *Log, name string, c *net.UDPConn) {
	port := sockopt.AddrPort(c.LocalAddr()).Port()
	var e Event
	serve.AnswerDatagrams(c, ioTimeout, func(dst netip.Addr, from netip.AddrPort) []byte {
		r := Reply{Pod: log.Pod(), Listener: name, Local: netip.AddrPortFrom(dst, port).String(), Peer: from.String()}
		e = Event{Event: EventAccepted, Proto: "udp", Listener: name, Local: r.Local, Peer: r.Peer}
		b, _ := json.Marshal(r)
		return b
	}, func(err error) {
		if err != nil {
			e.Error = fmt.Sprintf("writing reply: %v", err)
		}
		log.Emit(e)
	})
}

// ServeHTTP serves h on port over TCP (IPv4 and, if present, IPv6): the
// proxy's readiness (15021) and status (15020) ports, which kubelet probes
// from the node and which capture excludes.
func (s *Server) ServeHTTP(log *Log, name string, port uint16, h http.Handler) error {
	for _, f := range families {
		netw := "tcp" + f.suffix
		addr := net.JoinHostPort(f.host, fmt.Sprint(port))
		ln, err := net.Listen(netw, addr)
		if err != nil {
			if f.suffix == "6" && noIPv6(err) {
				continue
			}
			return fmt.Errorf("listening for %s on %s %s: %w", name, netw, addr, err)
		}
		srv := &http.Server{Handler: h, ReadHeaderTimeout: ioTimeout}
		s.group.Add(srv.Close)
		log.Emit(Event{Event: EventListening, Proto: "tcp", Listener: name, Local: ln.Addr().String()})
		s.group.Go(func() { _ = srv.Serve(ln) })
	}
	return nil
}
