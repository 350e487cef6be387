package standin

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"strings"
	"testing"
	"time"

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
