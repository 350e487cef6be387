package cniplugin

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nftmesh/nftmesh/internal/cnisock"
	"github.com/nftmesh/nftmesh/podinfo/agentsock"
	"github.com/nftmesh/nftmesh/testkit/nstest"
)

// The tests in this file need root (a throw-away netns to pass) but no API
// server: the agent's server runs with a resolver of their own.

// serveWith serves the CNI socket in a fresh run dir with srv (RunDir and
// AllowUID filled in) until the test ends, and returns the run dir.
func serveWith(t testing.TB, srv *Server) string {
	t.Helper()
	runDir := t.TempDir()
	ln, err := agentsock.ListenAt(runDir, cnisock.SocketName)
	if err != nil {
		t.Fatal(err)
	}
	srv.RunDir = runDir
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return runDir
}

// dialCNI connects to the CNI socket in runDir and sends frame with fds.
func dialCNI(t testing.TB, runDir string, frame []byte, fds ...int) *net.UnixConn {
	t.Helper()
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: cnisock.Path(runDir), Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	if _, _, err := c.WriteMsgUnix(frame, oob, nil); err != nil {
		c.Close()
		t.Fatal(err)
	}
	return c
}

// TestServeStopsWhenTheFrontHangsUp: a call whose front closes its end (killed,
// or out of its own time) is stopped at once, its context cancelled, and
// its slot freed, instead of running to its own timeout for nobody. A front
// that only shuts its writing half down still waits, and its call runs on.
func TestServeStopsWhenTheFrontHangsUp(t *testing.T) {
	nstest.NeedRoot(t)
	pod := loadPod(t, "injected.yaml")
	pod.UID = "uid-hangup"
	type ended struct {
		err error
		at  time.Time
	}
	entered := make(chan struct{}, 1)
	ends := make(chan ended, 1)
	outcomes := make(chan ServeOutcome, 1)
	srv := &Server{AllowUID: agentsock.PeerUID, Resolver: agentsock.ResolverFunc(func(ctx context.Context, _ agentsock.Request) agentsock.Answer {
		entered <- struct{}{}
		<-ctx.Done()
		ends <- ended{ctx.Err(), time.Now()}
		return agentsock.Unknown("stopped")
	}), Observe: func(o ServeOutcome) { outcomes <- o }}
	runDir := serveWith(t, srv)
	_, nsPath := nstest.New(t, "cni-hangup-")
	c := dialCNI(t, runDir, callFrame(t, "ADD", nsPath, runDir, pod), openPath(t, nsPath))
	<-entered
	closed := time.Now()
	c.Close()
	select {
	case e := <-ends:
		if !errors.Is(e.err, context.Canceled) {
			t.Fatalf("the call's context ended with %v, want cancelled by the hang-up", e.err)
		}
		if d := e.at.Sub(closed); d > time.Second {
			t.Fatalf("the call was stopped %v after its front hung up", d)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the call runs on 5 s after its front hung up")
	}
	select {
	case o := <-outcomes:
		if o.Status == OutcomeOK || o.Status == OutcomeError {
			t.Fatalf("outcome %+v for a call whose front hung up", o)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the call's slot is still held 5 s after its front hung up")
	}
	assertNoRules(t, nsPath)

	// Half-closed: the front still reads; its call is not cancelled.
	srv.Resolver = agentsock.ResolverFunc(func(ctx context.Context, _ agentsock.Request) agentsock.Answer {
		select {
		case <-ctx.Done():
			ends <- ended{ctx.Err(), time.Now()}
		case <-time.After(300 * time.Millisecond):
			ends <- ended{nil, time.Now()}
		}
		return agentsock.Unknown("not here")
	})
	c = dialCNI(t, runDir, callFrame(t, "ADD", nsPath, runDir, pod), openPath(t, nsPath))
	defer c.Close()
	if err := c.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if e := <-ends; e.err != nil {
		t.Fatalf("a half-closed front's call was cancelled: %v", e.err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	var hdr [cnisock.HeaderLen]byte
	if _, err := c.Read(hdr[:]); err != nil {
		t.Fatalf("a half-closed front got no reply: %v", err)
	}
	if o := <-outcomes; o.Status != OutcomeDeclined {
		t.Fatalf("outcome %+v, want declined (no answer for the pod)", o)
	}
}

