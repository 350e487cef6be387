package agentsock

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The socket's place under the agent's run dir: a directory of its own,
// mode 0700, so that only root reaches the socket (0600) whatever the run
// dir's mode (the plugin's log there is group-readable).
const (
	DirName    = "agent-sock"
	SocketName = "pod.sock"
	dirMode    = 0o700
	socketMode = 0o600
)

// Path is the socket's path for the agent run dir runDir.
func Path(runDir string) string { return filepath.Join(runDir, DirName, SocketName) }

// PeerUID is the one user the server answers and the client accepts as a
// server: root, as the runtime runs the plugin and as the agent runs.
const PeerUID = 0

// ErrPeerRefused: the process at the other end of the socket is not root.
var ErrPeerRefused = errors.New("peer is not root")

// PeerUIDOf is the uid of the process at the other end of c (SO_PEERCRED).
func PeerUIDOf(c *net.UnixConn) (uint32, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return 0, err
	}
	if cerr != nil {
		return 0, fmt.Errorf("reading SO_PEERCRED: %w", cerr)
	}
	return cred.Uid, nil
}

// Listener is the agent's socket.
type Listener struct {
	*net.UnixListener
	path string
	ino  uint64

	closeOnce sync.Once
}

// Listen creates the socket for runDir: the directory (0700, owned by this
// process's user, not a symlink), then the socket (0600), replacing one a
// previous agent left.
func Listen(runDir string) (*Listener, error) { return ListenAt(runDir, SocketName) }

// ListenAt is Listen for the agent's other sockets in the same directory.
func ListenAt(runDir, name string) (*Listener, error) {
	// The installer creates the run dir too; the socket may come first.
	if err := os.MkdirAll(runDir, 0o755); err != nil {
		return nil, fmt.Errorf("creating run dir %s: %w", runDir, err)
	}
	dir := filepath.Join(runDir, DirName)
	if err := os.Mkdir(dir, dirMode); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, fmt.Errorf("creating socket dir %s: %w", dir, err)
	}
	st, err := os.Lstat(dir)
	if err != nil {
		return nil, fmt.Errorf("checking socket dir %s: %w", dir, err)
	}
	sys, _ := st.Sys().(*syscall.Stat_t)
	switch {
	case !st.IsDir():
		return nil, fmt.Errorf("checking socket dir %s: it is a %s, not a directory", dir, st.Mode().Type())
	case sys == nil || int(sys.Uid) != os.Geteuid():
		return nil, fmt.Errorf("checking socket dir %s: not owned by uid %d", dir, os.Geteuid())
	}
	if st.Mode().Perm() != dirMode {
		if err := os.Chmod(dir, dirMode); err != nil {
			return nil, fmt.Errorf("restricting socket dir %s to mode %o: %w", dir, dirMode, err)
		}
	}
	path := filepath.Join(dir, name)
	// unlink and bind never follow a symlink at path: the old socket (or
	// a link put in its place) goes, not what it leads to.
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("removing the old socket %s: %w", path, err)
	}
	ln, err := restricted.Listen(context.Background(), "unix", path)
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", path, err)
	}
	ul := ln.(*net.UnixListener)
	ul.SetUnlinkOnClose(false)
	l := &Listener{UnixListener: ul, path: path}
	var sst unix.Stat_t
	if err := unix.Lstat(path, &sst); err != nil {
		ul.Close()
		return nil, fmt.Errorf("checking socket %s: %w", path, err)
	}
	if sst.Mode&unix.S_IFMT != unix.S_IFSOCK || sst.Mode&0o777&^socketMode != 0 {
		ul.Close()
		return nil, fmt.Errorf("checking socket %s: mode %#o, want a socket of mode %#o", path, sst.Mode, socketMode)
	}
	l.ino = sst.Ino
	return l, nil
}

// restricted binds a socket file of socketMode, the second wall should the
// directory ever be opened up: bind gives the file the socket's own mode
// (less the umask), set here before it, so no chmod by path follows, which
// a symlink put in the socket's place meanwhile would lead elsewhere.
var restricted = net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
	var err error
	if cerr := c.Control(func(fd uintptr) { err = unix.Fchmod(int(fd), socketMode) }); cerr != nil {
		return cerr
	}
	if err != nil {
		return fmt.Errorf("restricting the socket to mode %o: %w", socketMode, err)
	}
	return nil
}}

// inode is path's inode number, 0 when it cannot be read.
func inode(path string) uint64 {
	var st unix.Stat_t
	if unix.Lstat(path, &st) != nil {
		return 0
	}
	return st.Ino
}

// Path is the socket's path.
func (l *Listener) Path() string { return l.path }

// Close stops listening and removes the socket only while it is still
// ours: an agent shutting down after its successor started leaves the
// successor's socket alone.
func (l *Listener) Close() error {
	var err error
	l.closeOnce.Do(func() {
		err = l.UnixListener.Close()
		if ino := inode(l.path); ino != 0 && ino == l.ino {
			_ = os.Remove(l.path)
		}
	})
	return err
}

// Outcome is what became of one connection on one of the agent's sockets
// (pod lookups, and the CNI calls the front hands over), for its log and
// metrics.
type Outcome struct {
	Status string // StatusFound, StatusUnknown, or one of the Outcome constants
	Reason string // why unknown, or the error
	// Resource is what a starved connection lacked (ResourceFDs,
	// ResourceMemory, ResourceBuffers: see StarvedOf).
	Resource string
	Request  Request // a pod lookup's
	Command  string  // a CNI call's CNI_COMMAND
	PeerUID  uint32
	Duration time.Duration
}

// Outcomes of connections that got no answer, on either socket, and of
// the CNI calls.
const (
	OutcomeRefused    = "refused"     // the peer is not root (with CAP_NET_ADMIN, for a CNI call)
	OutcomeBadRequest = "bad_request" // unreadable or invalid request (or descriptors)
	OutcomeWriteError = "write_error" // the answer could not be sent
	// OutcomeStarved: declined, the agent lacking a resource to take or
	// run the connection (Resource says which), where a call's namespace
	// is as the call found it; the plugin asks the API server, the front
	// runs the call itself. Also told, without a connection, when accepts
	// start to fail and leave connections waiting.
	OutcomeStarved = "starved"

	OutcomeOK       = "ok"       // the CNI call ran: the plugin exited 0
	OutcomeError    = "error"    // the CNI call ran: the plugin exited 1 (a CNI error)
	OutcomeDeclined = "declined" // the CNI call is left to the standalone plugin
	OutcomeBusy     = "busy"     // declined: over the bytes-in-flight budget, or every call slot taken
)

// Decision is what one plugin run decided, as its decision line says: what
// the agent counts (installer/metrics) and records Events for
// (installer/podevents). A call the agent runs hands it over in process
// (cniplugin.Server's Decided); the standalone plugin's is read back from
// its log file (installer/pluginlog), so its strings are bounded where
// they are used.
type Decision struct {
	Command   string // ADD, DEL, CHECK, ...
	Decision  string // capture, skip, remove, error
	Namespace string
	Pod       string
	RanBy     string // agent or standalone
	Error     string // the CNI error of a failed run
	Lookup    string // where the pod came from: agent or api; "" for none
	// Took is the run's time, LookupTook its pod lookup's; negative when
	// the line says none.
	Took, LookupTook time.Duration
}

// Resolver answers a valid request. It must return within ctx's deadline
// (the server sends "unknown" for it otherwise).
type Resolver interface {
	Resolve(ctx context.Context, req Request) Answer
}

// QuickResolver is a Resolver that may have an answer at hand: ResolveNow
// returns it without waiting, or false and the server calls Resolve with
// its deadline. The usual answer then costs no timer.
type QuickResolver interface {
	Resolver
	ResolveNow(req Request) (Answer, bool)
}

// Server bounds; the whole budget fits inside the client's ClientTimeout.
const (
	// ResolveTimeout bounds the resolver: a pod the informer has not seen
	// is waited for, then fetched once.
	ResolveTimeout = 2 * time.Second
	ioTimeout      = time.Second
	maxInFlight    = 256
	acceptRetry    = 50 * time.Millisecond
)

// Server answers plugin requests on a Listener.
type Server struct {
	Resolver Resolver
	Observe  func(Outcome) // when set, told about every connection, from its goroutine
	AllowUID uint32        // the peer user answered; PeerUID unless a test changes it
}

// Serve answers the connections l.ServeConns accepts.
func (s *Server) Serve(ctx context.Context, l *Listener) error {
	return l.ServeConns(ctx, Handlers{
		Serve: func(c *net.UnixConn) { s.handle(ctx, c) },
		Starved: func(c *net.UnixConn, err error) {
			if c != nil {
				c.Close()
			}
			if s.Observe != nil {
				s.Observe(Outcome{Status: OutcomeStarved, Resource: StarvedOf(err), Reason: "accepting: " + err.Error()})
			}
		},
	})
}

// Handlers are what ServeConns does with the connections it accepts.
type Handlers struct {
	// Serve runs each connection in its own goroutine, maxInFlight at a
	// time; it closes the connection.
	Serve func(*net.UnixConn)
	// Busy, when set, takes a connection beyond that bound (in its own
	// goroutine, which closes it); unset, the connection waits for a slot.
	Busy func(*net.UnixConn)
	// Starved is told when accepting failed for lack of a resource (err:
	// descriptors, memory). With the listener's reserve descriptor spent
	// to take the connection all the same, c is it (in its own goroutine:
	// answer at once and close it, which gives the descriptor back); else
	// c is nil, once per spell of failing accepts. Unset, such a
	// connection is closed at once: the peer sees the end at once rather
	// than waiting in the backlog for its timeout.
	Starved func(c *net.UnixConn, err error)
}

// ServeConns accepts connections on l until ctx ends or l fails, and runs
// h on them (see Handlers); it closes l and waits for the handlers. The
// agent's sockets share it.
func (l *Listener) ServeConns(ctx context.Context, h Handlers) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	stop := context.AfterFunc(ctx, func() { l.Close() })
	defer stop()
	defer l.Close()
	sem := make(chan struct{}, maxInFlight)
	reserve := l.reserve()
	defer func() { closeReserve(reserve) }()
	told := false // of the accepts failing now, without a connection
	for {
		c, err := l.AcceptUnix()
		if err == nil {
			told = false
			if reserve < 0 {
				reserve = l.reserve()
			}
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, net.ErrClosed) {
				return fmt.Errorf("accepting on %s: %w", l.path, err)
			}
			if c, reserve = l.acceptStarved(err, reserve); c != nil {
				go h.starved(c, err)
				continue
			}
			if StarvedOf(err) != "" && !told {
				// Once per spell: the retries are every acceptRetry.
				told = true
				h.starved(nil, err)
			}
			// Out of descriptors or memory, a connection reset before it
			// was accepted: the socket is fine, so serve on after a pause
			// (the plugin falls back meanwhile).
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(acceptRetry):
			}
			continue
		}
		if h.Busy != nil {
			select {
			case sem <- struct{}{}:
			default:
				go h.Busy(c)
				continue
			}
		} else {
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				c.Close()
				return nil
			}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			h.Serve(c)
		}()
	}
}

func (h Handlers) starved(c *net.UnixConn, err error) {
	if h.Starved != nil {
		h.Starved(c, err)
		return
	}
	if c != nil {
		c.Close()
	}
}

// Resources a process serving the agent's sockets can lack, as StarvedOf
// names them.
const (
	ResourceFDs     = "fds"     // EMFILE, ENFILE: the process's or the system's file table is full
	ResourceMemory  = "memory"  // ENOMEM: the kernel could not allocate
	ResourceBuffers = "buffers" // ENOBUFS: no socket buffer space (netlink, unix)
)

// StarvedOf names the resource whose lack err reports, or "". Each of
// these errors says the calling process (or the kernel on its behalf) ran
// short, not that what it did was wrong: the same work in another process
// may well succeed.
func StarvedOf(err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, unix.EMFILE), errors.Is(err, unix.ENFILE):
		return ResourceFDs
	case errors.Is(err, unix.ENOMEM):
		return ResourceMemory
	case errors.Is(err, unix.ENOBUFS):
		return ResourceBuffers
	}
	return ""
}

// reserve is a spare descriptor (a duplicate of the listener's), or -1: out
// of descriptors, closing it makes room to accept one connection, which
// can then be answered at once instead of waiting in the backlog until its
// peer gives up (the front's wait is ten seconds per call).
func (l *Listener) reserve() int {
	raw, err := l.SyscallConn()
	if err != nil {
		return -1
	}
	fd := -1
	_ = raw.Control(func(s uintptr) {
		if d, err := unix.FcntlInt(s, unix.F_DUPFD_CLOEXEC, 0); err == nil {
			fd = d
		}
	})
	return fd
}

func closeReserve(fd int) {
	if fd >= 0 {
		unix.Close(fd)
	}
}

// acceptStarved takes a connection with the reserve descriptor when err
// says the process is out of descriptors, and returns it (or nil) and the
// reserve as it is now (-1 until it can be taken again).
func (l *Listener) acceptStarved(err error, reserve int) (*net.UnixConn, int) {
	if !errors.Is(err, unix.EMFILE) && !errors.Is(err, unix.ENFILE) {
		return nil, reserve
	}
	if reserve < 0 {
		// Spent on the last one, whose handler may have closed it by now.
		if reserve = l.reserve(); reserve < 0 {
			return nil, -1
		}
	}
	unix.Close(reserve)
	c, aerr := l.AcceptUnix()
	reserve = l.reserve()
	if aerr != nil {
		return nil, reserve
	}
	return c, reserve
}

// Lookup answers req from r within ResolveTimeout. An answer that is not
// about req becomes "unknown", saying why (r is trusted code, but a wrong
// answer would only send the plugin to the API server).
func Lookup(ctx context.Context, r Resolver, req Request) Answer {
	a, ok := Answer{}, false
	if q, isQ := r.(QuickResolver); isQ {
		a, ok = q.ResolveNow(req)
	}
	if !ok {
		rctx, cancel := context.WithTimeout(ctx, ResolveTimeout)
		a = r.Resolve(rctx, req)
		cancel()
	}
	if err := CheckAnswer(req, a); err != nil {
		a = Unknown("agent error: " + err.Error())
	}
	return a
}

func (s *Server) handle(ctx context.Context, c *net.UnixConn) {
	defer c.Close()
	start := time.Now()
	o := Outcome{}
	defer func() {
		o.Duration = time.Since(start)
		if s.Observe != nil {
			s.Observe(o)
		}
	}()
	uid, err := PeerUIDOf(c)
	o.PeerUID = uid
	if err != nil || uid != s.AllowUID {
		o.Status, o.Reason = OutcomeRefused, fmt.Sprintf("peer uid %d is not %d", uid, s.AllowUID)
		if err != nil {
			o.Reason = err.Error()
		}
		return
	}
	_ = c.SetReadDeadline(time.Now().Add(ioTimeout))
	req, err := readRequest(c)
	if err != nil {
		o.Status, o.Reason = OutcomeBadRequest, err.Error()
		return
	}
	o.Request = req
	if err := req.Validate(); err != nil {
		o.Status, o.Reason = OutcomeBadRequest, err.Error()
		return
	}
	a := Lookup(ctx, s.Resolver, req)
	o.Status, o.Reason = a.Status, a.Reason
	_ = c.SetWriteDeadline(time.Now().Add(ioTimeout))
	b, err := appendFrame(a, MaxAnswer)
	if err == nil {
		_, err = c.Write(b)
	}
	if err != nil {
		o.Status, o.Reason = OutcomeWriteError, err.Error()
	}
}
