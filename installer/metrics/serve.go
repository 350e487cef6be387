package metrics

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"
)

// limits bound what one server's clients can hold: anyone who can reach
// the agent's address can connect, and the agent's descriptors and memory
// are also what its CNI calls need.
type limits struct {
	readHeader, read, write, idle time.Duration
	maxHeaderBytes                int
	// maxConns is the most connections open at once; past it one not
	// inside a request is closed (connCap).
	maxConns int
}

// defaults: kubelet's probes (one connection each, not kept alive) and a
// few scrapers need a handful of connections; 64 leave room and cost at
// most ~64 descriptors and ~2 MiB (buffers and goroutine stacks) per
// server. The write timeout is Prometheus' default scrape timeout; the
// idle timeout outlasts Prometheus' default scrape interval (1 min), so a
// scraper keeps its connection.
var defaults = limits{
	readHeader:     5 * time.Second,
	read:           10 * time.Second,
	write:          10 * time.Second,
	idle:           90 * time.Second,
	maxHeaderBytes: 16 << 10,
	maxConns:       64,
}

// Server is a started HTTP listener.
type Server struct {
	srv  *http.Server
	Addr net.Addr
	done chan error
	cap  *connCap
}

// Serve listens on addr and serves h until Shutdown, within the package's
// limits: timeouts on every phase of a request and between requests, a
// header size cap, and at most 64 open connections, where a new one
// closes one of the source that holds the most (connCap), so that a flood
// of held connections neither exhausts the agent nor keeps kubelet's probe
// out.
func Serve(addr string, h http.Handler) (*Server, error) {
	return serve(addr, h, defaults)
}

func serve(addr string, h http.Handler, l limits) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", addr, err)
	}
	cc := newConnCap(l.maxConns)
	s := &Server{
		cap: cc,
		srv: &http.Server{
			Handler:           h,
			ReadHeaderTimeout: l.readHeader,
			ReadTimeout:       l.read,
			WriteTimeout:      l.write,
			IdleTimeout:       l.idle,
			MaxHeaderBytes:    l.maxHeaderBytes,
			ConnState:         cc.track,
		},
		Addr: ln.Addr(),
		done: make(chan error, 1),
	}
	go func() { s.done <- s.srv.Serve(ln) }()
	return s, nil
}

// Shutdown stops the server and waits for it.
func (s *Server) Shutdown(ctx context.Context) error {
	err := s.srv.Shutdown(ctx)
	if serr := <-s.done; serr != nil && !errors.Is(serr, http.ErrServerClosed) && err == nil {
		err = serr
	}
	return err
}

// connCap keeps a server at max open connections. When one more arrives
// it closes one that is not inside a request: from the source address
// holding the most connections, an idle one (between requests) before one
// that has not yet sent a whole request, the least recently active first;
// the newcomer when every other one is inside a request (those are left to
// the write timeout). Unlike a listener that stops accepting at the cap
// (golang.org/x/net/netutil.LimitListener), held connections buy an
// attacker nothing: a flood, held or opened over and over, only ever
// closes its own connections, while kubelet's probe, from the node's
// address with one connection, is served.
type connCap struct {
	max      int
	mu       sync.Mutex
	order    *list.List // of net.Conn, least recently active first
	conns    map[net.Conn]*capEntry
	bySource map[netip.Addr]int
}

type capEntry struct {
	el     *list.Element
	state  http.ConnState // StateNew, StateActive or StateIdle
	source netip.Addr
}

func newConnCap(max int) *connCap {
	return &connCap{max: max, order: list.New(), conns: map[net.Conn]*capEntry{}, bySource: map[netip.Addr]int{}}
}

// track is the server's ConnState hook. net/http calls it for StateNew in
// its accept loop, before it serves the connection or accepts the next.
func (c *connCap) track(conn net.Conn, state http.ConnState) {
	c.mu.Lock()
	var victim net.Conn
	switch state {
	case http.StateNew:
		e := &capEntry{el: c.order.PushBack(conn), state: state, source: sourceOf(conn)}
		c.conns[conn] = e
		c.bySource[e.source]++
		if len(c.conns) > c.max {
			victim = c.victimLocked()
			c.forgetLocked(victim)
		}
	case http.StateActive, http.StateIdle:
		// A connection closed here may still report a request it had
		// read: it stays forgotten.
		if e, ok := c.conns[conn]; ok {
			e.state = state
			c.order.MoveToBack(e.el)
		}
	case http.StateHijacked, http.StateClosed:
		c.forgetLocked(conn)
	}
	c.mu.Unlock()
	if victim != nil {
		// The server's goroutine for it sees its read fail and ends.
		_ = victim.Close()
	}
}

// victimLocked picks the connection to close. The newcomer is outside a
// request, so there always is one.
func (c *connCap) victimLocked() net.Conn {
	var (
		victim         net.Conn
		held           int
		idle, haveBest bool
	)
	for el := c.order.Front(); el != nil; el = el.Next() {
		conn := el.Value.(net.Conn)
		e := c.conns[conn]
		if e.state == http.StateActive {
			continue
		}
		n, isIdle := c.bySource[e.source], e.state == http.StateIdle
		// Strictly better only: among equals the least recently active.
		if !haveBest || n > held || (n == held && isIdle && !idle) {
			victim, held, idle, haveBest = conn, n, isIdle, true
		}
	}
	return victim
}

func (c *connCap) forgetLocked(conn net.Conn) {
	e, ok := c.conns[conn]
	if !ok {
		return
	}
	c.order.Remove(e.el)
	delete(c.conns, conn)
	if c.bySource[e.source]--; c.bySource[e.source] == 0 {
		delete(c.bySource, e.source)
	}
}

// sourceOf is a connection's remote address (the zero Addr for a listener
// that is not TCP: one source).
func sourceOf(conn net.Conn) netip.Addr {
	if a, ok := conn.RemoteAddr().(*net.TCPAddr); ok {
		return a.AddrPort().Addr().Unmap()
	}
	return netip.Addr{}
}
