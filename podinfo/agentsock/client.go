package agentsock

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nftmesh/nftmesh/internal/phase"
)

// ClientTimeout is how long the plugin waits for the agent's answer by
// default: the server's resolve budget plus its I/O.
const ClientTimeout = ResolveTimeout + 500*time.Millisecond

// ErrNoAgent is wrapped by Ask's error when no agent listens on the socket
// (it does not exist, or nobody accepts on it).
var ErrNoAgent = errors.New("no agent on the socket")

// errTimeout is the error of a socket call that ran out of the caller's
// time (the kernel's SO_SNDTIMEO/SO_RCVTIMEO expired, or ctx ended).
var errTimeout = errors.New("i/o timeout")

// Ask sends req to the agent at path and returns its checked answer. ctx
// bounds the whole exchange. Every error means "ask the API server".
//
// The plugin asks once per process, so the exchange is a handful of
// blocking system calls on one socket whose kernel timeouts carry ctx's
// deadline: no netpoller to start, no goroutine, no timer, and the kernel
// wakes the plugin straight from its read when the answer lands. A ctx
// cancelled before its deadline shuts the socket down, which ends any
// call blocked on it.
func Ask(ctx context.Context, path string, req Request) (Answer, error) {
	if err := req.Validate(); err != nil {
		return Answer{}, err
	}
	c, err := dial(ctx, path)
	if err != nil {
		return Answer{}, err
	}
	defer c.close()
	phase.Mark("agent-dialed")
	a, err := c.ask(req)
	if err != nil {
		return Answer{}, fmt.Errorf("asking the agent at %s: %w", path, c.cause(ctx, err))
	}
	return a, nil
}

func (c *conn) ask(req Request) (Answer, error) {
	// Only root can have bound a socket in the root-only directory; the
	// check costs one getsockopt and holds should that ever change.
	cred, err := unix.GetsockoptUcred(c.fd, unix.SOL_SOCKET, unix.SO_PEERCRED)
	if err != nil {
		return Answer{}, fmt.Errorf("reading SO_PEERCRED: %w", err)
	}
	if cred.Uid != PeerUID {
		return Answer{}, fmt.Errorf("%w: uid %d", ErrPeerRefused, cred.Uid)
	}
	if err := c.writeAll(encodeRequest(req)); err != nil {
		return Answer{}, fmt.Errorf("sending the request: %w", err)
	}
	phase.Mark("agent-sent")
	b, err := c.readFrame(MaxAnswer, "answer")
	if err != nil {
		return Answer{}, err
	}
	a, err := decodeAnswer(b)
	if err != nil {
		return Answer{}, err
	}
	if err := CheckAnswer(req, a); err != nil {
		return Answer{}, err
	}
	phase.Mark("agent-answered")
	return a, nil
}

// cause is err, saying so when ctx has ended: a cancelled ctx shuts the
// socket down, which the calls report as an end of file or a broken pipe,
// and a deadline is a timeout whichever of the kernel's timer and ctx's
// saw it first.
func (c *conn) cause(ctx context.Context, err error) error {
	switch cerr := ctx.Err(); {
	case cerr == nil || errors.Is(err, errTimeout) && errors.Is(cerr, context.DeadlineExceeded):
		return err
	case errors.Is(cerr, context.DeadlineExceeded):
		return fmt.Errorf("%w, cut off by the deadline (%w)", err, errTimeout)
	default:
		return fmt.Errorf("%w, cut off by %w", err, cerr)
	}
}

// encodeRequest is req as one frame. A valid request's fields are plain
// ASCII names (Validate), which JSON carries as they are: the encoding is
// written out rather than paid for with encoding/json's first use in a
// fresh process, and is byte for byte what encoding/json writes, so agents
// of either kind read it alike.
func encodeRequest(req Request) []byte {
	b := make([]byte, 4, 64+len(req.Namespace)+len(req.Name)+len(req.UID))
	b = append(b, `{"v":`...)
	b = strconv.AppendInt(b, int64(req.V), 10)
	b = append(b, `,"namespace":"`...)
	b = append(b, req.Namespace...)
	b = append(b, `","name":"`...)
	b = append(b, req.Name...)
	b = append(b, `","uid":"`...)
	b = append(b, req.UID...)
	b = append(b, `"}`...)
	binary.BigEndian.PutUint32(b, uint32(len(b)-4))
	return b
}

// conn is the client's blocking socket.
type conn struct {
	fd       int
	deadline time.Time
	stop     func() bool

	mu     sync.Mutex // orders a cancellation's shutdown before the close
	closed bool
}

// dial connects to path within ctx.
func dial(ctx context.Context, path string) (*conn, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("asking the agent at %s: %w", path, err)
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(ClientTimeout)
	}
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("asking the agent at %s: creating a socket: %w", path, err)
	}
	c := &conn{fd: fd, deadline: deadline}
	c.stop = context.AfterFunc(ctx, c.shutdown)
	for {
		if err = c.setTimeout(unix.SO_SNDTIMEO); err == nil {
			// A unix socket's connect waits for room in a full backlog
			// for the send timeout at most.
			err = unix.Connect(fd, &unix.SockaddrUnix{Name: path})
		}
		if err != unix.EINTR {
			break
		}
	}
	switch {
	case err == nil:
		return c, nil
	case err == unix.ENOENT || err == unix.ECONNREFUSED:
		// The usual case when no agent runs: short, for the log line.
		err = fmt.Errorf("%w (%s)", ErrNoAgent, path)
	case err == unix.EAGAIN:
		err = fmt.Errorf("asking the agent at %s: connecting: %w (the agent's backlog is full)", path, errTimeout)
	default:
		err = fmt.Errorf("asking the agent at %s: connecting: %w", path, c.cause(ctx, err))
	}
	c.close()
	return nil, err
}

// setTimeout sets the kernel timeout opt to the time left before the
// deadline; none left is errTimeout.
func (c *conn) setTimeout(opt int) error {
	left := time.Until(c.deadline)
	if left <= 0 {
		return errTimeout
	}
	// A zero timeval means "no timeout" to the kernel: round up.
	tv := unix.NsecToTimeval(max(left, time.Microsecond).Nanoseconds())
	if err := unix.SetsockoptTimeval(c.fd, unix.SOL_SOCKET, opt, &tv); err != nil {
		return fmt.Errorf("setting the socket's timeout: %w", err)
	}
	return nil
}

// shutdown ends the calls blocked on the socket (ctx was cancelled).
func (c *conn) shutdown() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.closed {
		_ = unix.Shutdown(c.fd, unix.SHUT_RDWR)
	}
}

func (c *conn) close() {
	c.stop()
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.closed {
		c.closed = true
		_ = unix.Close(c.fd)
	}
}

// sysErr names a failed socket call: EAGAIN is the kernel's timeout.
func sysErr(err error) error {
	if err == unix.EAGAIN {
		return errTimeout
	}
	return err
}

// writeAll sends b. The send timeout set for connect still holds: a
// request of a few hundred bytes into a fresh socket's buffer does not
// wait, and the time connect took is the most the bound can be late by
// (ctx's own shutdown is at the deadline). After a short send or a signal
// the timeout is set again to the time left.
func (c *conn) writeAll(b []byte) error {
	for first := true; len(b) > 0; first = false {
		if !first {
			if err := c.setTimeout(unix.SO_SNDTIMEO); err != nil {
				return err
			}
		}
		// MSG_NOSIGNAL: an agent gone away is EPIPE, not a SIGPIPE.
		n, err := unix.SendmsgN(c.fd, b, nil, nil, unix.MSG_NOSIGNAL)
		switch {
		case err == unix.EINTR:
			// A signal cut a timed call short: retry with the time left.
			continue
		case err != nil:
			return sysErr(err)
		}
		b = b[n:]
	}
	return nil
}

var errUnexpectedEOF = errors.New("unexpected EOF")

// firstRead is the buffer of the first read, which holds a usual answer
// whole: one system call for it.
const firstRead = 16 << 10

// readFrame reads one frame of at most max bytes and returns its payload.
// Each read waits for the time left at most; the whole frame comes in the
// first one unless it is large.
func (c *conn) readFrame(max int, what string) ([]byte, error) {
	buf := make([]byte, 0, firstRead)
	need := 4 // the header; then the whole frame
	for len(buf) < need {
		if err := c.setTimeout(unix.SO_RCVTIMEO); err != nil {
			return nil, readErr(need, what, err)
		}
		n, err := unix.Read(c.fd, buf[len(buf):cap(buf)])
		switch {
		case err == unix.EINTR:
			continue
		case err != nil:
			return nil, readErr(need, what, sysErr(err))
		case n == 0:
			return nil, readErr(need, what, errUnexpectedEOF)
		}
		buf = buf[:len(buf)+n]
		if buf, need, err = frameLength(buf, need, max, what); err != nil {
			return nil, err
		}
	}
	return framePayload(buf, need, what)
}
