package cniplugin

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"github.com/nftmesh/nftmesh/capture"
	"github.com/nftmesh/nftmesh/internal/cnisock"
	"github.com/nftmesh/nftmesh/podinfo/agentsock"
)

// Server runs, inside the node agent, the CNI calls the nftmesh-cni front
// hands over its socket (internal/cnisock): Run on the call's variables and
// config, its pod from the agent's informer, its network namespace through
// the descriptor the front passed. A call it cannot run as the plugin's own
// process would is declined untouched, and the front runs the standalone
// plugin.
type Server struct {
	// RunDir is the agent_run_dir the plugin's config must name (the same
	// path on the host and in the agent's pod).
	RunDir string
	// Resolver answers the calls' pod lookups (the agent's informer).
	Resolver agentsock.Resolver
	// AllowUID is the only peer uid served (agentsock.PeerUID: root).
	AllowUID uint32
	// HostNetns returns nil once the host's network namespace is
	// registered to be refused (capture.AddHostNetnsFromProc), else why
	// not: the host's is then not told from a pod's, and every call is
	// declined, as with a nil HostNetns.
	HostNetns func() error
	// ProcDir is a proc file system of the node's PID namespace, where a
	// peer's capabilities are read (agentsock.CheckAdminPeer); empty is
	// /proc, for an agent in that namespace.
	ProcDir string
	// Observe, when set, is told each connection's outcome.
	Observe func(agentsock.Outcome)
	// Log (AgentLog) takes the calls' log lines, and Decided, when set,
	// each call's decision: the plugin's log file is only the standalone
	// plugin's.
	Log     zerolog.LevelWriter
	Decided func(agentsock.Decision)
	// MaxBytesInFlight bounds the request bytes of the calls being read or
	// run, across all connections; zero is DefaultMaxBytesInFlight.
	MaxBytesInFlight int64

	inFlight atomic.Int64
}

// DefaultMaxBytesInFlight is the request bytes the agent holds at once: the
// socket's 256 calls of a few kilobytes fit many times over, calls at
// cnisock.MaxRequest 32 at once. A call costs a few times its request, so
// the budget keeps the agent tens of MiB from the chart's memory limit
// whatever the fronts send (TestServeMemoryBound). A call over the budget
// is declined before its body is read.
const DefaultMaxBytesInFlight = 2 << 20

// reserve takes n bytes of the budget; false when they are not left.
func (s *Server) reserve(n int64) bool {
	limit := s.MaxBytesInFlight
	if limit <= 0 {
		limit = DefaultMaxBytesInFlight
	}
	for {
		cur := s.inFlight.Load()
		if cur+n > limit {
			return false
		}
		if s.inFlight.CompareAndSwap(cur, cur+n) {
			return true
		}
	}
}

var errOverBudget = errors.New("over the agent's budget of request bytes in flight")

// Bounds of one connection.
const (
	readTimeout  = 2 * time.Second
	writeTimeout = 2 * time.Second
)

// Serve runs calls until ctx ends or the listener fails; it closes l and
// waits for the calls in progress. A connection beyond the socket's bound
// (256 at once), or one accepted while the agent is out of descriptors, is
// declined at once: the front runs the call itself.
func (s *Server) Serve(ctx context.Context, l *agentsock.Listener) error {
	return l.ServeConns(ctx, agentsock.Handlers{
		Serve: func(c *net.UnixConn) { s.handle(ctx, c) },
		Busy: func(c *net.UnixConn) {
			s.declineAtOnce(c, agentsock.Outcome{Status: agentsock.OutcomeBusy, Reason: "every call slot of the socket is taken"})
		},
		Starved: func(c *net.UnixConn, err error) {
			o := agentsock.Outcome{Status: agentsock.OutcomeStarved, Resource: agentsock.StarvedOf(err), Reason: "accepting the call: " + err.Error()}
			if c == nil {
				o.Reason += " (the connection waits in the backlog)"
				s.observe(o)
				return
			}
			s.declineAtOnce(c, o)
		},
	})
}

// declineAtOnce answers c with a decline, unread, and closes it.
func (s *Server) declineAtOnce(c *net.UnixConn, o agentsock.Outcome) {
	defer c.Close()
	_ = c.SetWriteDeadline(time.Now().Add(writeTimeout))
	if _, err := c.Write(declinedReply); err != nil {
		o.Status, o.Reason = agentsock.OutcomeWriteError, err.Error()
	}
	s.observe(o)
}

var declinedReply = cnisock.AppendReply(nil, cnisock.Reply{Status: cnisock.StatusDeclined})

func (s *Server) observe(o agentsock.Outcome) {
	if s.Observe != nil {
		s.Observe(o)
	}
}

func (s *Server) handle(ctx context.Context, c *net.UnixConn) {
	defer c.Close()
	start := time.Now()
	o := agentsock.Outcome{}
	defer func() {
		// Nothing a connection sends may take the agent down: the front
		// sees the connection end and runs the standalone plugin.
		if p := recover(); p != nil {
			o.Status, o.Reason = agentsock.OutcomeBadRequest, fmt.Sprintf("panic: %v", p)
		}
		o.Duration = time.Since(start)
		s.observe(o)
	}()
	uid, err := agentsock.PeerUIDOf(c)
	o.PeerUID = uid
	if err != nil || uid != s.AllowUID {
		o.Status, o.Reason = agentsock.OutcomeRefused, fmt.Sprintf("peer uid %d is not %d", uid, s.AllowUID)
		if err != nil {
			o.Reason = err.Error()
		}
		return
	}
	// Root is not enough: changing a namespace's rules takes CAP_NET_ADMIN
	// in the initial user namespace.
	if err := agentsock.CheckAdminPeer(c, cmp.Or(s.ProcDir, "/proc")); err != nil {
		o.Status, o.Reason = agentsock.OutcomeRefused, err.Error()
		if o.Resource = agentsock.StarvedOf(err); o.Resource != "" {
			// The check reads a file: no answer about the peer, a
			// decline for the front, which then runs as itself.
			o.Status = agentsock.OutcomeStarved
			_ = c.SetWriteDeadline(time.Now().Add(writeTimeout))
			_, _ = c.Write(declinedReply)
		}
		return
	}
	_ = c.SetReadDeadline(time.Now().Add(readTimeout))
	req, fds, size, err := s.readRequest(c)
	defer s.inFlight.Add(-size)
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	reply := cnisock.Reply{Status: cnisock.StatusDeclined}
	switch {
	case errors.Is(err, errOverBudget):
		o.Status, o.Reason = agentsock.OutcomeBusy, err.Error()
	case agentsock.StarvedOf(err) != "":
		o.Status, o.Resource, o.Reason = agentsock.OutcomeStarved, agentsock.StarvedOf(err), err.Error()
	case err != nil:
		o.Status, o.Reason = agentsock.OutcomeBadRequest, err.Error()
	default:
		o.Command = getenv(req.Env, "CNI_COMMAND")
		cctx, stop := watchHangUp(ctx, c)
		reply = s.call(cctx, req, fds, &o)
		if stop() {
			o.Reason = joinReason(o.Reason, "the front hung up")
		}
	}
	_ = c.SetWriteDeadline(time.Now().Add(writeTimeout))
	if _, err := c.Write(cnisock.AppendReply(nil, reply)); err != nil {
		o.Status, o.Reason = agentsock.OutcomeWriteError, err.Error()
	}
}

// call runs one well-formed request and says in o what became of it.
func (s *Server) call(ctx context.Context, req cnisock.Request, fds []int, o *agentsock.Outcome) cnisock.Reply {
	declined := cnisock.Reply{Status: cnisock.StatusDeclined}
	o.Status = agentsock.OutcomeDeclined
	if s.HostNetns == nil {
		o.Reason = hostNetnsUnknown
		return declined
	}
	if err := s.HostNetns(); err != nil {
		o.Reason = hostNetnsUnknown + ": " + err.Error()
		return declined
	}
	// One descriptor exactly when the call names a namespace.
	netns := getenv(req.Env, "CNI_NETNS")
	if (netns != "") != (len(fds) == 1) || len(fds) > 1 {
		o.Status, o.Reason = agentsock.OutcomeBadRequest, fmt.Sprintf("%d descriptors for CNI_NETNS %q", len(fds), netns)
		return declined
	}
	var out, errOut bytes.Buffer
	e := Env{
		Context: ctx,
		Getenv:  func(k string) string { return getenv(req.Env, k) },
		Stdin:   bytes.NewReader(req.Stdin),
		Stdout:  &out,
		Stderr:  &errOut,
		Ask: func(r agentsock.Request) (agentsock.Answer, error) {
			return agentsock.Lookup(ctx, s.Resolver, r), nil
		},
		RunDir:  filepath.Clean(s.RunDir), // as the plugin cleans the config's
		Log:     s.Log,
		Decided: s.Decided,
	}
	if netns != "" {
		e.Pipeline = capture.LinuxVia(netns, fds[0])
	}
	code, err := runGuarded(e)
	switch {
	case errors.Is(err, ErrDeclined):
		o.Reason = "no answer for the pod here"
		if err != ErrDeclined { // with the error that made it go elsewhere
			o.Reason = err.Error()
		}
		if o.Resource = agentsock.StarvedOf(err); o.Resource != "" {
			o.Status = agentsock.OutcomeStarved
		}
		return declined
	case err != nil:
		o.Reason = err.Error()
		return declined
	case code != 0 && ctx.Err() != nil:
		// The agent is stopping (or the front hung up): the error says so,
		// not what the pod needs. Declined, the front runs the call itself.
		o.Reason = "cut short: " + context.Cause(ctx).Error()
		return declined
	}
	o.Status = agentsock.OutcomeOK
	reply := cnisock.Reply{Status: cnisock.StatusOK, Stdout: out.Bytes(), Stderr: errOut.Bytes()}
	if code != 0 {
		reply.Status, o.Status = cnisock.StatusError, agentsock.OutcomeError
	}
	return reply
}

const hostNetnsUnknown = "the host's network namespace is not known to the agent"

// runGuarded runs a call; a panic outside the verbs' own guard declines
// it (the standalone plugin then answers the runtime).
func runGuarded(e Env) (code int, err error) {
	defer func() {
		if p := recover(); p != nil {
			code, err = 1, fmt.Errorf("panic: %v", p)
		}
	}()
	return Run(e)
}

// watchHangUp returns a context of ctx that ends when the front at the
// other end of c closes its end (killed, or out of time), so that a call
// nobody waits for stops at its next wait instead of holding one of the
// socket's slots to its own timeout. stop ends the watch and reports
// whether the front had hung up.
func watchHangUp(ctx context.Context, c *net.UnixConn) (context.Context, func() bool) {
	cctx, cancel := context.WithCancel(ctx)
	raw, err := c.SyscallConn()
	if err != nil {
		return cctx, func() bool { cancel(); return false }
	}
	// No read deadline while the call runs: the watch waits as long.
	_ = c.SetReadDeadline(time.Time{})
	var hungUp bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		// Read only waits in the runtime's poller and calls the function
		// again; it reads nothing. POLLHUP: the peer's end is closed, which
		// a half-close (POLLRDHUP alone: that front still waits for the
		// reply) or extra bytes are not.
		_ = raw.Read(func(fd uintptr) bool {
			p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN | unix.POLLRDHUP}}
			if n, err := unix.Poll(p, 0); err == nil && n > 0 && p[0].Revents&(unix.POLLHUP|unix.POLLERR) != 0 {
				hungUp = true
				cancel()
				return true
			}
			return false
		})
	}()
	return cctx, func() bool {
		// A deadline in the past ends the wait in Read.
		_ = c.SetReadDeadline(time.Unix(1, 0))
		<-done
		cancel()
		return hungUp
	}
}

func joinReason(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}

func getenv(env []string, key string) string {
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok && k == key {
			return v
		}
	}
	return ""
}

// readRequest reads one request frame and the descriptors sent with it,
// once its size is reserved in the budget; reserved is what to give back.
// Descriptors are returned (to be closed) even with an error.
func (s *Server) readRequest(c *net.UnixConn) (req cnisock.Request, fds []int, reserved int64, err error) {
	var hdr [cnisock.HeaderLen]byte
	if err := readMsgFull(c, hdr[:], &fds); err != nil {
		return req, fds, 0, err
	}
	size, err := cnisock.BodyLen(hdr, cnisock.RequestMagic)
	if err != nil {
		return req, fds, 0, err
	}
	if !s.reserve(int64(size)) {
		return req, fds, 0, fmt.Errorf("request of %d bytes: %w", size, errOverBudget)
	}
	body := make([]byte, size)
	if err := readMsgFull(c, body, &fds); err != nil {
		return req, fds, int64(size), err
	}
	req, err = cnisock.ParseRequest(body)
	return req, fds, int64(size), err
}

// readMsgFull fills b from c, collecting the descriptors that come along.
func readMsgFull(c *net.UnixConn, b []byte, fds *[]int) error {
	oob := make([]byte, unix.CmsgSpace(4*4))
	for len(b) > 0 {
		n, oobn, flags, _, err := c.ReadMsgUnix(b, oob)
		if oobn > 0 {
			got, perr := rights(oob[:oobn])
			*fds = append(*fds, got...)
			if perr != nil {
				return perr
			}
		}
		if flags&unix.MSG_CTRUNC != 0 {
			// The kernel drops descriptors it cannot install: past our
			// room for them, or with this process's table full.
			if perr := fdProbe(); perr != nil {
				return fmt.Errorf("receiving the request's descriptors: %w", perr)
			}
			return errors.New("control data truncated (too many descriptors)")
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return fmt.Errorf("reading the request: %w", err)
		}
		if n == 0 {
			return fmt.Errorf("reading the request: %w", io.ErrUnexpectedEOF)
		}
		b = b[n:]
	}
	return nil
}

// rights returns the descriptors in control messages.
func rights(oob []byte) ([]int, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, fmt.Errorf("reading control data: %w", err)
	}
	var fds []int
	for i := range msgs {
		got, err := unix.ParseUnixRights(&msgs[i])
		if err != nil {
			return fds, fmt.Errorf("reading control data: %w", err)
		}
		fds = append(fds, got...)
	}
	return fds, nil
}
