package agentsock

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nftmesh/nftmesh/internal/phase"
)

// ClientTimeout is the plugin's default wait for an answer: the server's
// resolve budget plus its I/O.
const ClientTimeout = ResolveTimeout + 500*time.Millisecond

// ErrNoAgent is wrapped by Ask's error when no agent listens on the socket.
var ErrNoAgent = errors.New("no agent on the socket")

// Ask sends req to the agent at path and returns its checked answer. ctx
// bounds the whole exchange (ClientTimeout when it has no deadline). Every
// error means "ask the API server".
func Ask(ctx context.Context, path string, req Request) (Answer, error) {
	if err := req.Validate(); err != nil {
		return Answer{}, err
	}
	if err := ctx.Err(); err != nil {
		return Answer{}, fmt.Errorf("asking the agent at %s: %w", path, err)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, ClientTimeout)
		defer cancel()
	}
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unix", path)
	switch {
	case err == nil:
	case errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ECONNREFUSED):
		// The usual case when no agent runs: short, for the log line.
		return Answer{}, fmt.Errorf("%w (%s)", ErrNoAgent, path)
	case errors.Is(err, unix.EAGAIN):
		return Answer{}, fmt.Errorf("asking the agent at %s: connecting: the agent's backlog is full: %w", path, err)
	default:
		return Answer{}, fmt.Errorf("asking the agent at %s: connecting: %w", path, cause(ctx, err))
	}
	c := nc.(*net.UnixConn)
	defer c.Close()
	// The deadline bounds the whole exchange; a cancelled ctx ends it at
	// once (a deadline in the past ends any read or write in progress).
	deadline, _ := ctx.Deadline()
	_ = c.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	phase.Mark("agent-dialed")
	a, err := ask(c, req)
	if err != nil {
		return Answer{}, fmt.Errorf("asking the agent at %s: %w", path, cause(ctx, err))
	}
	return a, nil
}

func ask(c *net.UnixConn, req Request) (Answer, error) {
	// Only root can have bound a socket in the root-only directory; the
	// check costs one getsockopt and holds should that ever change.
	uid, err := PeerUIDOf(c)
	if err != nil {
		return Answer{}, err
	}
	if uid != PeerUID {
		return Answer{}, fmt.Errorf("%w: uid %d", ErrPeerRefused, uid)
	}
	b, err := appendFrame(req, MaxRequest)
	if err != nil {
		return Answer{}, err
	}
	if _, err := c.Write(b); err != nil {
		return Answer{}, fmt.Errorf("sending the request: %w", err)
	}
	phase.Mark("agent-sent")
	payload, err := readPayload(c, MaxAnswer, "answer")
	if err != nil {
		return Answer{}, err
	}
	a, err := decode[Answer](payload, "answer")
	if err != nil {
		return Answer{}, err
	}
	if err := CheckAnswer(req, a); err != nil {
		return Answer{}, err
	}
	phase.Mark("agent-answered")
	return a, nil
}

// cause is err, saying so when ctx has ended: a cancelled ctx ends the
// exchange with a deadline in the past, which the calls report as a
// timeout.
func cause(ctx context.Context, err error) error {
	switch cerr := ctx.Err(); {
	case cerr == nil || errors.Is(err, os.ErrDeadlineExceeded) && errors.Is(cerr, context.DeadlineExceeded):
		return err
	case errors.Is(cerr, context.DeadlineExceeded):
		return fmt.Errorf("%w, cut off by the deadline (%w)", err, os.ErrDeadlineExceeded)
	default:
		return fmt.Errorf("%w, cut off by %w", err, cerr)
	}
}
