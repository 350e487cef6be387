package metrics

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"
)

// limits bound what one server's clients can hold: anyone who can reach
// the agent's address can connect, and the agent's descriptors and memory
// are also what its CNI calls need.
type limits struct {
	readHeader, read, write, idle time.Duration
	maxHeaderBytes                int
	// maxConns is the most connections open at once; past it the least
	// recently active connection not inside a request is closed (connCap).
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
}

// Serve listens on addr and serves h until Shutdown, within the package's
// limits: timeouts on every phase of a request and between requests, a
// header size cap, and at most 64 open connections, where a new one
// closes an idle one (or one that has not sent a whole request), so that
// a flood of held connections neither exhausts the agent nor keeps
// kubelet's probe out.
func Serve(addr string, h http.Handler) (*Server, error) {
	return serve(addr, h, defaults)
}

func serve(addr string, h http.Handler, l limits) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", addr, err)
	}
	s := &Server{
		srv: &http.Server{
			Handler:           h,
			ReadHeaderTimeout: l.readHeader,
			ReadTimeout:       l.read,
			WriteTimeout:      l.write,
			IdleTimeout:       l.idle,
			MaxHeaderBytes:    l.maxHeaderBytes,
			ConnState:         newConnCap(l.maxConns).track,
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
// it closes the least recently active idle connection (between requests),
// else the oldest that has not yet sent a whole request, else the
// newcomer: connections inside a request are left to the write timeout.
// Unlike a listener that stops accepting at the cap
// (golang.org/x/net/netutil.LimitListener), held connections buy an
// attacker nothing: the connection that arrives last, kubelet's probe, is
// served, and an attacker's idle connections go before it.
type connCap struct {
	max   int
	mu    sync.Mutex
	order *list.List // of net.Conn, least recently active first
	conns map[net.Conn]*capEntry
}

type capEntry struct {
	el    *list.Element
	state http.ConnState // StateNew, StateActive or StateIdle
}

func newConnCap(max int) *connCap {
	return &connCap{max: max, order: list.New(), conns: map[net.Conn]*capEntry{}}
}

// track is the server's ConnState hook. net/http calls it for StateNew in
// its accept loop, before it serves the connection or accepts the next.
func (c *connCap) track(conn net.Conn, state http.ConnState) {
	c.mu.Lock()
	var victim net.Conn
	switch state {
	case http.StateNew:
		c.conns[conn] = &capEntry{el: c.order.PushBack(conn), state: state}
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

// victimLocked picks the connection to close; the newcomer, last in
// order, is a new one, so there always is one.
func (c *connCap) victimLocked() net.Conn {
	var firstNew net.Conn
	for el := c.order.Front(); el != nil; el = el.Next() {
		conn := el.Value.(net.Conn)
		switch c.conns[conn].state {
		case http.StateIdle:
			return conn
		case http.StateNew:
			if firstNew == nil {
				firstNew = conn
			}
		}
	}
	return firstNew
}

func (c *connCap) forgetLocked(conn net.Conn) {
	if e, ok := c.conns[conn]; ok {
		c.order.Remove(e.el)
		delete(c.conns, conn)
	}
}
