package standin

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/nftmesh/nftmesh/netlab"
	"github.com/nftmesh/nftmesh/redirect"
	"github.com/nftmesh/nftmesh/testkit/syncbuf"
)

// passthroughAs is PassthroughDial from the pod namespace as uid/gid.
func (l *forwardLab) passthroughAs(uid, gid uint32) DialFunc {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		err := l.topo.DoAs(uid, gid, func() error {
			var err error
			c, err = PassthroughDial(ctx, network, addr)
			return err
		})
		return c, err
	}
}

// peerDial connects to target from the peer namespace (inbound to the pod).
func (l *forwardLab) peerDial(t *testing.T, target string) Event {
	t.Helper()
	var e Event
	if err := netlab.Do(l.topo.PeerNetnsPath(), func() error {
		e = Dial(l.ctx, Target{"tcp", target})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return e
}

// TestForwardInboundThroughCapture: a forwarding inbound listener behind
// real capture (what -forward-inbound runs, for the conformance run's
// meshed pods) hands a peer's connection to the pod's app: the peer is
// answered by the app on its port, not by the proxy; the app sees the
// proxy's passthrough source 127.0.0.6, the proxy logged the peer and
// the app's address as original destination. The same relay dialing from
// the pod's own address instead (a plain dialer as UID 1337) is captured
// back to 15006 and never reaches the app: why PassthroughDial binds
// 127.0.0.6.
func TestForwardInboundThroughCapture(t *testing.T) {
	lab := newForwardLab(t)
	app := netip.AddrPortFrom(netlab.PodV4, 7070)
	var proxyBuf, appBuf syncbuf.Buffer
	srv := &Server{RelayTimeout: 10 * time.Second}
	t.Cleanup(func() { _ = srv.Close() })
	if err := netlab.Do(lab.topo.PodNetnsPath(), func() error {
		if err := srv.ForwardTCP(NewLog(&proxyBuf, "proxy", "server"), ListenerInbound, 15006, false,
			lab.passthroughAs(redirect.DefaultProxyID, redirect.DefaultProxyID)); err != nil {
			return err
		}
		return srv.ServeTCP(NewLog(&appBuf, "app", "server"), AppListener(7070), 7070, false)
	}); err != nil {
		t.Fatal(err)
	}

	e := lab.peerDial(t, app.String())
	if e.Event != EventDialed || e.Reply == nil {
		t.Fatalf("the peer's connection to %s: %+v\nproxy log:\n%s", app, e, proxyBuf.String())
	}
	if r := *e.Reply; r.Listener != AppListener(7070) || r.Orig != app.String() || !strings.HasPrefix(r.Peer, "127.0.0.6:") {
		t.Fatalf("the peer's connection to %s was answered by %+v, want the app's %s seeing a peer from 127.0.0.6", app, r, AppListener(7070))
	}
	pe := waitAccepted(t, &proxyBuf, func(x Event) bool { return x.Orig == app.String() })
	if pe.Listener != ListenerInbound || pe.Peer != e.Local || pe.ForwardFrom != e.Reply.Peer || pe.Error != "" {
		t.Errorf("the proxy logged %+v, want %s from the peer's %s forwarded from %s", pe, ListenerInbound, e.Local, e.Reply.Peer)
	}

	// From the pod's own address the relay is captured again.
	var loopBuf syncbuf.Buffer
	loop := &Server{}
	t.Cleanup(func() { _ = loop.Close() })
	if err := netlab.Do(lab.topo.PodNetnsPath(), func() error {
		_ = srv.Close() // frees 15006 for the plain relay
		return loop.ForwardTCP(NewLog(&loopBuf, "proxy", "server"), ListenerInbound, 15006, false,
			lab.dialAs(redirect.DefaultProxyID, redirect.DefaultProxyID))
	}); err != nil {
		t.Fatal(err)
	}
	if e := lab.peerDial(t, app.String()); e.Event != EventDialFailed {
		t.Errorf("through a relay dialing from the pod's address the peer got %+v, want a failed connection (captured back to 15006)", e)
	}
}
