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
// fresh process. The server decodes it with the same strict decoder as
// any other frame.
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

func (c *conn) writeAll(b []byte) error {
	for len(b) > 0 {
		if err := c.setTimeout(unix.SO_SNDTIMEO); err != nil {
			return err
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

// readFull reads len(b) bytes; the first read's timeout is set to the
// time left, and again after a signal.
func (c *conn) readFull(b []byte) error {
	for len(b) > 0 {
		if err := c.setTimeout(unix.SO_RCVTIMEO); err != nil {
			return err
		}
		n, err := unix.Read(c.fd, b)
		switch {
		case err == unix.EINTR:
			continue
		case err != nil:
			return sysErr(err)
		case n == 0:
			return errUnexpectedEOF
		}
		b = b[n:]
	}
	return nil
}

var errUnexpectedEOF = errors.New("unexpected EOF")

// readFrame reads one frame of at most max bytes and returns its payload.
func (c *conn) readFrame(max int, what string) ([]byte, error) {
	var hdr [4]byte
	if err := c.readFull(hdr[:]); err != nil {
		return nil, fmt.Errorf("reading %s length: %w", what, err)
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n == 0 || n > uint32(max) {
		return nil, &FieldError{what, "length", fmt.Sprint(n), fmt.Sprintf("is not within 1..%d bytes", max)}
	}
	b := make([]byte, n)
	if err := c.readFull(b); err != nil {
		return nil, fmt.Errorf("reading %s of %d bytes: %w", what, n, err)
	}
	return b, nil
}
