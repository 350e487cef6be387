package standin

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nftmesh/nftmesh/netlab"
	"github.com/nftmesh/nftmesh/nft"
	"github.com/nftmesh/nftmesh/redirect"
	"github.com/nftmesh/nftmesh/testkit/syncbuf"
)

func TestParseTarget(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    Target
		wantErr string
	}{
		{in: "10.96.0.10:80", want: Target{"tcp", "10.96.0.10:80"}},
		{in: "tcp://productpage:9080", want: Target{"tcp", "productpage:9080"}},
		{in: "udp://10.96.0.10:53", want: Target{"udp", "10.96.0.10:53"}},
		{in: "[2001:db8::1]:443", want: Target{"tcp", "[2001:db8::1]:443"}},
		{in: "10.0.0.1", wantErr: `target "10.0.0.1" is not host:port`},
		{in: ":80", wantErr: `is not host:port`},
		{in: "10.0.0.1:", wantErr: `is not host:port`},
		{in: "sctp://10.0.0.1:80", wantErr: `protocol "sctp" is not tcp or udp`},
		{in: "", wantErr: `target "" is not host:port`},
	} {
		got, err := ParseTarget(tc.in)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("ParseTarget(%q) error = %v, want it to contain %q", tc.in, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseTarget(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}

func TestPortsAndTargetsFlags(t *testing.T) {
	var p Ports
	if err := p.Set("9080, 9090"); err != nil {
		t.Fatal(err)
	}
	if err := p.Set("15020"); err != nil {
		t.Fatal(err)
	}
	if got := p.String(); got != "9080,9090,15020" {
		t.Errorf("ports = %q", got)
	}
	for _, bad := range []string{"0", "65536", "http", "-1", "9080,x"} {
		var q Ports
		if err := q.Set(bad); err == nil || !strings.Contains(err.Error(), "is not a number from 1 to 65535") {
			t.Errorf("Ports.Set(%q) error = %v", bad, err)
		}
	}
	var ts Targets
	if err := ts.Set("a:1,udp://b:53"); err != nil {
		t.Fatal(err)
	}
	if got := ts.String(); got != "tcp://a:1,udp://b:53" {
		t.Errorf("targets = %q", got)
	}
	if err := ts.Set("a:1,nope"); err == nil {
		t.Error("Targets.Set accepted a target without a port")
	}
}

func FuzzParseTarget(f *testing.F) {
	for _, s := range []string{"10.0.0.1:80", "udp://[::1]:53", "x://y:1", ":", "tcp://"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		tg, err := ParseTarget(s)
		if err != nil {
			if len(err.Error()) > 300 {
				t.Fatalf("error too long (%d bytes): %v", len(err.Error()), err)
			}
			return
		}
		if tg.Proto != "tcp" && tg.Proto != "udp" {
			t.Fatalf("ParseTarget(%q) accepted protocol %q", s, tg.Proto)
		}
		if _, _, err := net.SplitHostPort(tg.Addr); err != nil {
			t.Fatalf("ParseTarget(%q) accepted address %q: %v", s, tg.Addr, err)
		}
	})
}

func FuzzPortsSet(f *testing.F) {
	for _, s := range []string{"80", "1,2,3", "65535", "0", ",,", "99999"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		var p Ports
		if err := p.Set(s); err != nil {
			if len(err.Error()) > 200 {
				t.Fatalf("error too long: %v", err)
			}
			return
		}
		for _, x := range p {
			if x == 0 {
				t.Fatalf("Ports.Set(%q) accepted port 0", s)
			}
		}
	})
}

func TestParseEvents(t *testing.T) {
	in := strings.Join([]string{
		`{"time":"2026-01-01T00:00:00Z","prog":"proxy","pod":"p","event":"ready","uid":1337,"gid":1337}`,
		`runtime noise`,
		``,
		`  {"prog":"app","pod":"p","event":"dialed","target":"1.2.3.4:80","reply":{"pod":"p","listener":"outbound-15001","orig":"1.2.3.4:80","local":"127.0.0.1:15001","peer":"10.0.0.2:40000"}}`,
	}, "\n")
	ev, err := ParseEvents(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if len(ev) != 2 {
		t.Fatalf("got %d events, want 2: %+v", len(ev), ev)
	}
	if ev[0].Event != EventReady || ev[0].UID == nil || *ev[0].UID != 1337 {
		t.Errorf("first event = %+v", ev[0])
	}
	if ev[1].Reply == nil || ev[1].Reply.Listener != ListenerOutbound || ev[1].Reply.Orig != "1.2.3.4:80" {
		t.Errorf("second event = %+v", ev[1])
	}

	_, err = ParseEvents(strings.NewReader("noise\n{\"event\": 3}\n"))
	if err == nil || !strings.Contains(err.Error(), "line 2") {
		t.Errorf("a broken event line: error = %v, want one naming line 2", err)
	}
}

// listening returns the address of the first "listening" event of name
// in the log so far.
func listening(t *testing.T, buf *syncbuf.Buffer, name, proto string) string {
	t.Helper()
	ev, err := ParseEvents(strings.NewReader(buf.String()))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ev {
		if e.Event == EventListening && e.Listener == name && e.Proto == proto && strings.HasPrefix(e.Local, "0.0.0.0:") {
			return "127.0.0.1:" + strings.TrimPrefix(e.Local, "0.0.0.0:")
		}
	}
	t.Fatalf("no %s listening event for %s in %s", proto, name, buf.String())
	return ""
}

// TestServeAndDialLoopback: a server answers each connection and datagram
// with a reply naming the pod and listener, the dialer turns it into a
// "dialed" event, and the server logs the same connection as "accepted".
// Without redirection the original destination is the address dialed.
func TestServeAndDialLoopback(t *testing.T) {
	var buf syncbuf.Buffer
	log := NewLog(&buf, "app", "pod-a")
	srv := &Server{}
	t.Cleanup(func() { _ = srv.Close() })
	if err := srv.ServeTCP(log, "app-x", 0, false); err != nil {
		t.Fatal(err)
	}
	if err := srv.ServeUDP(log, "dns-x", 0); err != nil {
		t.Fatal(err)
	}
	tcpAddr := listening(t, &buf, "app-x", "tcp")
	udpAddr := listening(t, &buf, "dns-x", "udp")

	for _, tg := range []Target{{"tcp", tcpAddr}, {"udp", udpAddr}} {
		e := Dial(context.Background(), tg)
		if e.Event != EventDialed || e.Reply == nil {
			t.Fatalf("dial %v: %+v", tg, e)
		}
		if e.Reply.Pod != "pod-a" || e.Reply.Local != tg.Addr || e.Reply.Peer != e.Local {
			t.Errorf("dial %v: reply %+v, local %s", tg, *e.Reply, e.Local)
		}
		if tg.Proto == "tcp" && e.Reply.Orig != tg.Addr {
			t.Errorf("tcp reply orig = %q, want %q", e.Reply.Orig, tg.Addr)
		}
	}
	// The accepted events are written after the reply: wait for them.
	deadline := time.Now().Add(5 * time.Second)
	for {
		ev, err := ParseEvents(strings.NewReader(buf.String()))
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, e := range ev {
			if e.Event == EventAccepted && e.Pod == "pod-a" && e.Prog == "app" && e.Error == "" {
				n++
			}
		}
		if n == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("want 2 accepted events, log:\n%s", buf.String())
		}
		time.Sleep(20 * time.Millisecond)
	}

	// A closed port is a dial_failed event, not a hang.
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()
	if e := Dial(context.Background(), Target{"tcp", closed}); e.Event != EventDialFailed || !strings.Contains(e.Error, "connecting to tcp://"+closed) {
		t.Errorf("dial to a closed port: %+v", e)
	}
}

// TestDialRejectsForeignReply: a server that is not a stand-in does not
// count as an answer, so a test cannot mistake some other listener for one.
func TestDialRejectsForeignReply(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err == nil {
			_, _ = c.Write([]byte("HTTP/1.1 400 Bad Request\n"))
			c.Close()
		}
	}()
	e := Dial(context.Background(), Target{"tcp", ln.Addr().String()})
	if e.Event != EventDialFailed || !strings.Contains(e.Error, "is not a stand-in reply") {
		t.Errorf("got %+v", e)
	}
}

func TestLogStampsEvents(t *testing.T) {
	var buf syncbuf.Buffer
	l := NewLog(&buf, "proxy", "pod-b")
	l.now = func() time.Time { return time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC) }
	l.Emit(Event{Event: EventStopping, Prog: "ignored", Pod: "ignored"})
	var e map[string]any
	if err := json.Unmarshal(bytes.TrimSpace([]byte(buf.String())), &e); err != nil {
		t.Fatal(err)
	}
	if e["prog"] != "proxy" || e["pod"] != "pod-b" || e["event"] != "stopping" || e["time"] != "2026-01-02T03:04:05Z" {
		t.Errorf("event = %v", e)
	}
	if _, ok := e["uid"]; ok {
		t.Errorf("unset uid was written: %v", e)
	}
}

// forwardLab is a throw-away pod namespace with the default Istio capture
// applied by the nft backend, wired to a peer namespace.
type forwardLab struct {
	topo *netlab.Topology
	ctx  context.Context
}

func newForwardLab(t *testing.T) *forwardLab {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces, applies nftables rules, dials as UID 1337")
	}
	topo, err := netlab.NewTopology(netlab.TopologyOptions{Prefix: "sti-"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := topo.Close(); err != nil {
			t.Error(err)
		}
	})
	plan, err := redirect.Build(redirect.DefaultSpec())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	if err := nft.New().Apply(ctx, topo.PodNetnsPath(), plan); err != nil {
		t.Fatal(err)
	}
	return &forwardLab{topo: topo, ctx: ctx}
}

// dialAs is a DialFunc that connects from the pod namespace as uid/gid.
func (l *forwardLab) dialAs(uid, gid uint32) DialFunc {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		err := l.topo.DoAs(uid, gid, func() error {
			var err error
			c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}
}

// serveIn starts a Server's listeners in the namespace at ns through start.
func serveIn(t *testing.T, ns string, start func(*Server) error) {
	t.Helper()
	srv := &Server{}
	t.Cleanup(func() { _ = srv.Close() })
	if err := netlab.Do(ns, func() error { return start(srv) }); err != nil {
		t.Fatal(err)
	}
}

// appDial connects to target as the pod's app (UID 1000: captured).
func (l *forwardLab) appDial(t *testing.T, target string) Event {
	t.Helper()
	var e Event
	if err := l.topo.DoAs(netlab.AppUID, netlab.AppGID, func() error {
		e = Dial(l.ctx, Target{"tcp", target})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return e
}

// TestForwardTCPThroughCapture: a forwarding outbound listener, behind real
// capture, makes the app's connection one connection end to end, as Envoy
// does: the app (UID 1000, captured) is answered by the destination in the
// peer namespace, not by the proxy; the proxy logged the connection with
// its original destination, the app's address as peer and the address its
// own connection left from (UID 1337, let out), and the destination saw
// exactly that address as its peer. Without forwarding the proxy answers
// the app itself. A connection that cannot be forwarded (its destination
// refuses; it was made to the listener itself) fails at the app, with the
// reason in the proxy's event.
func TestForwardTCPThroughCapture(t *testing.T) {
	lab := newForwardLab(t)
	var proxyBuf, serverBuf syncbuf.Buffer
	serveIn(t, lab.topo.PodNetnsPath(), func(s *Server) error {
		return s.ForwardTCP(NewLog(&proxyBuf, "proxy", "client"), ListenerOutbound, 15001, false,
			lab.dialAs(redirect.DefaultProxyID, redirect.DefaultProxyID))
	})
	serveIn(t, lab.topo.PeerNetnsPath(), func(s *Server) error {
		return s.ServeTCP(NewLog(&serverBuf, "proxy", "server"), ListenerInbound, 7070, false)
	})
	dst := netip.AddrPortFrom(netlab.OtherV4Host, 7070)

	e := lab.appDial(t, dst.String())
	if e.Event != EventDialed || e.Reply == nil {
		t.Fatalf("the app's connection to %s: %+v\nproxy log:\n%s", dst, e, proxyBuf.String())
	}
	if r := *e.Reply; r.Pod != "server" || r.Listener != ListenerInbound || r.Orig != dst.String() {
		t.Fatalf("the app's connection to %s was answered by %+v, want the server's %s (orig %s)", dst, r, ListenerInbound, dst)
	}
	from := e.Reply.Peer
	pe := waitAccepted(t, &proxyBuf, func(x Event) bool { return x.Orig == dst.String() })
	if pe.Listener != ListenerOutbound || pe.Peer != e.Local || pe.ForwardFrom != from || pe.Error != "" {
		t.Errorf("the proxy logged %+v, want %s from the app's %s forwarded from %s", pe, ListenerOutbound, e.Local, from)
	}
	if ap, err := netip.ParseAddrPort(from); err != nil || ap.Addr() != netlab.PodV4 {
		t.Errorf("the forwarded connection came from %q, want the pod's address %s", from, netlab.PodV4)
	}
	se := waitAccepted(t, &serverBuf, func(x Event) bool { return x.Peer == from })
	if se.Orig != dst.String() || se.Error != "" {
		t.Errorf("the server logged %+v, want orig %s", se, dst)
	}

	// Refused at the destination: the app's connection fails, the proxy
	// says why.
	refused := netip.AddrPortFrom(netlab.OtherV4Host, 7071)
	if e := lab.appDial(t, refused.String()); e.Event != EventDialFailed {
		t.Errorf("a connection to %s, where nothing listens, got %+v through the proxy", refused, e)
	}
	pe = waitAccepted(t, &proxyBuf, func(x Event) bool { return x.Orig == refused.String() })
	if !strings.Contains(pe.Error, "forwarding to "+refused.String()) || !strings.Contains(pe.Error, "refused") || pe.ForwardFrom != "" {
		t.Errorf("the proxy logged %+v for a refused destination", pe)
	}

	// Made to the listener itself (loopback is not captured): forwarding
	// it would loop.
	self := "127.0.0.1:15001"
	if e := lab.appDial(t, self); e.Event != EventDialFailed {
		t.Errorf("a connection to the listener itself got %+v", e)
	}
	pe = waitAccepted(t, &proxyBuf, func(x Event) bool { return x.Orig == self })
	if !strings.Contains(pe.Error, "the original destination is this listener") {
		t.Errorf("the proxy logged %+v for a connection to itself", pe)
	}
}

// TestForwardTCPLoopIsBounded: a proxy whose own connections are captured
// (here it dials as root, which the capture does not let out) forwards
// each connection back to itself; the chain stops at maxForwards relays,
// the refused one says why, the app's connection fails and every relay
// ends.
func TestForwardTCPLoopIsBounded(t *testing.T) {
	lab := newForwardLab(t)
	var proxyBuf syncbuf.Buffer
	serveIn(t, lab.topo.PodNetnsPath(), func(s *Server) error {
		return s.ForwardTCP(NewLog(&proxyBuf, "proxy", "client"), ListenerOutbound, 15001, false, lab.dialAs(0, 0))
	})
	dst := netip.AddrPortFrom(netlab.OtherV4Host, 7070).String()
	if e := lab.appDial(t, dst); e.Event != EventDialFailed {
		t.Errorf("the app's connection through a looping proxy got %+v", e)
	}
	pe := waitAccepted(t, &proxyBuf, func(x Event) bool { return strings.Contains(x.Error, "in flight already") })
	if !strings.Contains(pe.Error, fmt.Sprintf("not forwarding: %d connections", maxForwards)) || pe.Orig != "" {
		t.Errorf("the refused connection's event: %+v", pe)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		ev, err := ParseEvents(strings.NewReader(proxyBuf.String()))
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, e := range ev {
			if e.Event == EventAccepted {
				n++
			}
		}
		if n == maxForwards+1 {
			break
		}
		if n > maxForwards+1 || time.Now().After(deadline) {
			t.Fatalf("%d accepted events, want %d (every relay of the loop ended, the one refused)", n, maxForwards+1)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitAccepted returns the first "accepted" event in buf for which match
// is true, waiting up to 5 s for it.
func waitAccepted(t *testing.T, buf *syncbuf.Buffer, match func(Event) bool) Event {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		ev, err := ParseEvents(strings.NewReader(buf.String()))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ev {
			if e.Event == EventAccepted && match(e) {
				return e
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no matching accepted event within 5s; log:\n%s", buf.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}
