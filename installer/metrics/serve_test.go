package metrics

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

const getHealthz = "GET /healthz HTTP/1.1\r\nHost: agent\r\n\r\n"

func healthy() error { return nil }

func startServer(t *testing.T, h http.Handler, l *limits) string {
	t.Helper()
	var (
		s   *Server
		err error
	)
	if l == nil {
		s, err = Serve("127.0.0.1:0", h)
	} else {
		s, err = serve("127.0.0.1:0", h, *l)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.srv.Close() })
	return s.Addr.String()
}

// held is a client connection the test keeps open.
type held struct {
	net.Conn
	r *bufio.Reader
}

func dial(t *testing.T, addr string) *held {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &held{c, bufio.NewReader(c)}
}

// get sends one GET /healthz and reads its answer, keeping the connection.
func (h *held) get() error {
	_ = h.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := io.WriteString(h, getHealthz); err != nil {
		return err
	}
	resp, err := http.ReadResponse(h.r, nil)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return errors.New(resp.Status)
	}
	return nil
}

// closedByServer says for each connection whether the server has closed
// it (a read ends before d).
func closedByServer(conns []*held, d time.Duration) []bool {
	closed := make([]bool, len(conns))
	var wg sync.WaitGroup
	deadline := time.Now().Add(d)
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = c.SetReadDeadline(deadline)
			_, err := c.r.ReadByte()
			closed[i] = err != nil && !errors.Is(err, os.ErrDeadlineExceeded)
		}()
	}
	wg.Wait()
	return closed
}

func (h *held) closedByServer(d time.Duration) bool { return closedByServer([]*held{h}, d)[0] }

// A flood of held connections (idle after a request, silent, or stopped
// half-way through a header) costs the server at most its cap: each one
// past it closes the least recently active held one, oldest first, and a
// new client (kubelet's probe) is served at once. Before the cap, every
// held connection stayed open.
func TestServeClosesHeldConnectionsPastTheCap(t *testing.T) {
	const extra = 36
	for _, tc := range []struct {
		name string
		hold func(*held) error
	}{
		{"idle after a request", (*held).get},
		{"silent", func(*held) error { return nil }},
		{"half a header", func(h *held) error { _, err := io.WriteString(h, "GET /healthz HTTP/1.1\r\nX-Slow: "); return err }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := startServer(t, HealthHandler(healthy), nil)
			conns := make([]*held, defaults.maxConns+extra)
			for i := range conns {
				conns[i] = dial(t, addr)
				if err := tc.hold(conns[i]); err != nil {
					t.Fatalf("connection %d: %v", i, err)
				}
			}
			// Closing happens in the server's accept loop, before it serves
			// the newest connection: all of it is done by now.
			closed := closedByServer(conns, 300*time.Millisecond)
			n := 0
			for _, c := range closed {
				if c {
					n++
				}
			}
			if n != extra {
				t.Fatalf("%d of %d held connections closed, want %d (the cap is %d)", n, len(conns), extra, defaults.maxConns)
			}
			// The newest are kept (the least recently active go first; a
			// request's end may be noted just after the next client came).
			for i, c := range closed[len(conns)-defaults.maxConns/2:] {
				if c {
					t.Errorf("one of the newest held connections (%d) was closed", len(conns)-defaults.maxConns/2+i)
				}
			}
			start := time.Now()
			if err := dial(t, addr).get(); err != nil || time.Since(start) > 2*time.Second {
				t.Fatalf("a new client under the flood: %v after %v", err, time.Since(start))
			}
		})
	}
}

// Connections inside a request are not closed to make room: at the cap
// with every one of them in a handler, a newcomer is closed instead, and
// once they are answered newcomers are served again.
func TestServeKeepsRequestsInFlight(t *testing.T) {
	release := make(chan struct{})
	entered := make(chan struct{}, 8)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			entered <- struct{}{}
			<-release
		}
		io.WriteString(w, "ok\n")
	})
	l := defaults
	l.maxConns = 4
	addr := startServer(t, h, &l)
	busy := make([]*held, l.maxConns)
	for i := range busy {
		busy[i] = dial(t, addr)
		if _, err := io.WriteString(busy[i], "GET /slow HTTP/1.1\r\nHost: agent\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		<-entered
	}
	if c := dial(t, addr); !c.closedByServer(2 * time.Second) {
		t.Fatal("a newcomer was let in past the cap while every connection was in a request")
	}
	close(release)
	for i, c := range busy {
		_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
		if resp, err := http.ReadResponse(c.r, nil); err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("request in flight %d was not answered: %v", i, err)
		}
	}
	if err := dial(t, addr).get(); err != nil {
		t.Fatalf("a new client after the requests ended: %v", err)
	}
}

// Every phase of a connection has a deadline: the header, the time between
// requests, the answer's write; and a header has a size limit.
func TestServeTimeouts(t *testing.T) {
	wrote := make(chan error, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/big" {
			io.WriteString(w, "ok\n")
			return
		}
		chunk := bytes.Repeat([]byte("x"), 1<<20)
		for {
			if _, err := w.Write(chunk); err != nil {
				wrote <- err
				return
			}
		}
	})
	l := limits{readHeader: 300 * time.Millisecond, read: time.Second, write: 500 * time.Millisecond,
		idle: 300 * time.Millisecond, maxHeaderBytes: 4 << 10, maxConns: 8}
	addr := startServer(t, h, &l)

	idle := dial(t, addr)
	if err := idle.get(); err != nil {
		t.Fatal(err)
	}
	if !idle.closedByServer(3 * time.Second) {
		t.Error("an idle keep-alive connection outlived the idle timeout")
	}
	slow := dial(t, addr)
	io.WriteString(slow, "GET / HTTP/1.1\r\nX-Slow: ")
	if !slow.closedByServer(3 * time.Second) {
		t.Error("a half-sent header outlived the header timeout")
	}
	big := dial(t, addr)
	_ = big.SetDeadline(time.Now().Add(2 * time.Second))
	io.WriteString(big, "GET / HTTP/1.1\r\nHost: agent\r\nX-Big: "+strings.Repeat("a", 64<<10)+"\r\n\r\n")
	if resp, err := http.ReadResponse(big.r, nil); err != nil || resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("a 64 KiB header: %v %v, want 431", resp, err)
	}
	// A client that never reads a large answer: the handler's write fails
	// at the write timeout instead of holding the connection.
	reader := dial(t, addr)
	io.WriteString(reader, "GET /big HTTP/1.1\r\nHost: agent\r\n\r\n")
	select {
	case err := <-wrote:
		if err == nil {
			t.Error("write to a client that does not read did not fail")
		}
	case <-time.After(5 * time.Second):
		t.Error("a write to a client that does not read outlived the write timeout")
	}
}

// Idle connections go before ones that have not sent a request yet, which
// may be a probe that has just connected: the older silent ones stay while
// an idle one is there to close, and go oldest first after.
func TestServeClosesIdleBeforeSilent(t *testing.T) {
	l := defaults
	l.maxConns = 4
	s, err := serve("127.0.0.1:0", HealthHandler(healthy), l)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.srv.Close() })
	addr := s.Addr.String()
	silent := []*held{dial(t, addr), dial(t, addr)}
	idle := []*held{dial(t, addr), dial(t, addr)}
	for _, c := range idle {
		if err := c.get(); err != nil {
			t.Fatal(err)
		}
	}
	// The server notes a request's end just after the answer is sent (a
	// fixed 100 ms wait was too short on a loaded machine).
	waitIdle(t, s.cap, 2)
	dial(t, addr)
	if got := closedByServer(append(silent, idle...), 300*time.Millisecond); !slices.Equal(got, []bool{false, false, true, false}) {
		t.Fatalf("closed (silent, silent, idle, idle) = %v, want the older idle one only", got)
	}
	// Two more: the other idle one goes, then the oldest silent one.
	dial(t, addr)
	dial(t, addr)
	if got := closedByServer(append(silent, idle[1]), 300*time.Millisecond); !slices.Equal(got, []bool{true, false, true}) {
		t.Fatalf("closed (silent, silent, idle) = %v after two more, want the idle and the oldest silent one", got)
	}
}

func dialFrom(t *testing.T, src, addr string) *held {
	t.Helper()
	d := net.Dialer{Timeout: 2 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &held{c, bufio.NewReader(c)}
}

// A flood from one address only ever closes its own connections: a lone
// connection from another address (kubelet's probe, from the node), even
// the oldest and silent, stays while the flooding address holds more, and
// a newcomer from a third address is served. Without this, a flood opening
// connections faster than the server reads their requests closed probes
// that had just connected (3 of 32 in the flood test).
func TestServeClosesTheBiggestSourceFirst(t *testing.T) {
	l := defaults
	l.maxConns = 4
	addr := startServer(t, HealthHandler(healthy), &l)
	lone := dialFrom(t, "127.0.0.1", addr)
	for range 3 {
		if err := dialFrom(t, "127.0.0.2", addr).get(); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(100 * time.Millisecond)
	var flood []*held
	for range 8 {
		flood = append(flood, dialFrom(t, "127.0.0.2", addr))
	}
	if lone.closedByServer(300 * time.Millisecond) {
		t.Fatal("the lone connection was closed while another address held more")
	}
	if got := closedByServer(flood, 300*time.Millisecond); slices.Contains(got[5:], true) || !slices.Equal(got[:5], []bool{true, true, true, true, true}) {
		t.Errorf("flooding connections closed: %v, want the 5 oldest", got)
	}
	if err := dialFrom(t, "127.0.0.3", addr).get(); err != nil {
		t.Errorf("a newcomer from a third address under the flood: %v", err)
	}
	if err := lone.get(); err != nil {
		t.Errorf("the lone connection's request: %v", err)
	}
}

// waitIdle waits until c counts n connections between requests.
func waitIdle(t *testing.T, c *connCap, n int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		c.mu.Lock()
		got := 0
		for _, e := range c.conns {
			if e.state == http.StateIdle {
				got++
			}
		}
		c.mu.Unlock()
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the server counts %d idle connections, want %d", got, n)
		}
	}
}
