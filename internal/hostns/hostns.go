// Package hostns opens network namespace files safely and stops capture
// rules from landing in the node's own network namespace: a wrong netns path
// (a hostNetwork pod, a PID that left its namespace, a typo in `redirect
// apply --netns`, a symlink or bind mount pointing at the host's namespace)
// would otherwise send every outbound connection of the node to a port
// nobody listens on, or delete the node's own rules on removal. Identity is
// the device and inode of an opened descriptor's nsfs inode, never a path
// string, so symlinks and bind mounts are seen through.
//
// Refused are this process's namespace (the plugin and the CLI run in the
// host's, the agent in its own pod's: never a pod we capture), PID 1's, and
// every one registered with AddHost (the agent's view of the host's). A
// Guard carries the check's one setting (AllowOwn), so two callers in one
// process can differ.
//
// It is also the one door into a namespace: Do (and DoDiscard, Create) are
// the only code of nftmesh that moves a thread into another network
// namespace, and the lint rule one-door-into-a-netns keeps it so. A helper
// that moves its caller's thread and back, such as vishvananda/netlink's
// NewHandleAt (v1.3.1 drops a failed move back and unlocks the thread),
// would let the scheduler run any goroutine in a pod's namespace. Sockets
// opened inside Do stay in the namespace (a netlink.Handle from
// netlink.NewHandle, say) and serve from any thread. The package never
// writes to a namespace.
package hostns

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// ErrOwnNetns is wrapped by the errors of what a Guard refuses.
var ErrOwnNetns = errors.New("refusing to change capture rules in the host's network namespace (the caller's own, or PID 1's)")

// ErrNotNetns is wrapped by Open's error when the path exists but is not a
// network namespace file.
var ErrNotNetns = errors.New("not a network namespace")

// Guard is the host check of one caller (see Refuse).
type Guard struct {
	// AllowOwn lets this process's own namespace through (`redirect apply
	// --allow-own-netns`); the others are still refused.
	AllowOwn bool
}

var initNetns = "/proc/1/ns/net"

// ID is a namespace's identity: the nsfs device and inode.
type ID struct{ Dev, Ino uint64 }

func (id ID) String() string { return fmt.Sprintf("%d:%d", id.Dev, id.Ino) }

// self is this process's own namespace, read once while package init runs
// on the main thread and before any goroutine has switched a thread into a
// pod namespace: /proc/self/ns/net follows the thread-group leader, which a
// goroutine locked to the main thread may have moved.
var self, selfErr = statID("/proc/thread-self/ns/net")

// home is a descriptor of that namespace, opened with it and never closed:
// where Do brings its thread back. Every thread no Do holds is there (Do is
// the one door), so it is the namespace Do's thread started in; keeping it
// open saves opening /proc/thread-self/ns/net at every Do.
var home, homeErr = unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)

var (
	hostsMu sync.Mutex
	hosts   = map[ID]string{}
)

// AddHost registers the namespace at path (read now, by identity) as the
// host's: it is refused like PID 1's.
func AddHost(path string) error {
	id, err := statID(path)
	if err != nil {
		return fmt.Errorf("registering host network namespace %s: %w", path, err)
	}
	hostsMu.Lock()
	defer hostsMu.Unlock()
	hosts[id] = path
	return nil
}

// AddHostFromProc registers the host's network namespace as seen through
// procDir (the host's /proc as the agent mounts it) and returns its path:
// PID 1's or, where that cannot be read (a sandbox whose init denies ptrace
// access even to root, a node run inside another machine's namespaces), that
// of this process's nearest ancestor outside its own network namespace: the
// container runtime's shim, which runs in the host's.
func AddHostFromProc(procDir string) (string, error) {
	init := filepath.Join(procDir, "1", "ns", "net")
	initErr := AddHost(init)
	if initErr == nil {
		return init, nil
	}
	if selfErr != nil {
		return "", errors.Join(initErr, selfErr)
	}
	pidLink, err := os.Readlink(filepath.Join(procDir, "self"))
	if err != nil {
		return "", errors.Join(initErr, fmt.Errorf("finding this process in %s: %w", procDir, err))
	}
	pid, err := strconv.Atoi(pidLink)
	if err != nil {
		return "", errors.Join(initErr, fmt.Errorf("finding this process in %s: %q is not a PID", procDir, pidLink))
	}
	for range 32 {
		ppid, err := parentPID(procDir, pid)
		if err != nil {
			return "", errors.Join(initErr, fmt.Errorf("no ancestor of this process outside its network namespace in %s: %w", procDir, err))
		}
		if ppid <= 1 {
			return "", errors.Join(initErr, fmt.Errorf("no ancestor of this process outside its network namespace in %s (every one up to PID 1 shares it)", procDir))
		}
		path := filepath.Join(procDir, strconv.Itoa(ppid), "ns", "net")
		id, err := statID(path)
		if err != nil {
			return "", errors.Join(initErr, fmt.Errorf("reading the network namespace of ancestor %d: %w", ppid, err))
		}
		if id != self {
			hostsMu.Lock()
			hosts[id] = path
			hostsMu.Unlock()
			return path, nil
		}
		pid = ppid
	}
	return "", errors.Join(initErr, errors.New("no ancestor outside this network namespace within 32 generations"))
}

func parentPID(procDir string, pid int) (int, error) {
	b, err := os.ReadFile(filepath.Join(procDir, strconv.Itoa(pid), "status"))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "PPid:"); ok {
			return strconv.Atoi(strings.TrimSpace(v))
		}
	}
	return 0, fmt.Errorf("%s/%d/status has no PPid", procDir, pid)
}

func statID(path string) (ID, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return ID{}, err
	}
	return ID{Dev: st.Dev, Ino: st.Ino}, nil
}

// Netns is an open network namespace file whose type has been checked.
type Netns struct {
	// Path is the path it was opened from, for messages.
	Path     string
	ID       ID
	fd       int
	borrowed bool // fd is the caller's (Borrow)
}

// Stub is a Netns without a descriptor (Fd is -1, Close does nothing): a
// namespace of an in-memory kernel (testkit/capturetest). Guard.Refuse
// works on it as on any other.
func Stub(path string, id ID) *Netns { return &Netns{Path: path, ID: id, fd: -1} }

// Fd is the namespace file descriptor (usable with setns and netlink's
// NETNSA_FD); it stays owned by n.
func (n *Netns) Fd() int { return n.fd }

// Take hands the descriptor over to the caller, who closes it. A borrowed
// Netns (Borrow) has none to hand over: Take returns -1.
func (n *Netns) Take() int {
	fd := n.fd
	n.fd = -1
	if n.borrowed {
		return -1
	}
	return fd
}

// Close closes the descriptor, unless it is borrowed (Borrow).
func (n *Netns) Close() error {
	if n == nil || n.fd < 0 {
		return nil
	}
	fd := n.fd
	n.fd = -1
	if n.borrowed {
		return nil
	}
	return unix.Close(fd)
}

// Borrow is a Netns of the namespace descriptor fd, which stays the
// caller's (Close leaves it open): a way into the namespace (Do) for code
// handed a bare descriptor, at the cost of one fstat. path names it in
// messages. The descriptor's type is not checked: setns refuses one that
// is not a network namespace's.
func Borrow(fd int, path string) (*Netns, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("checking netns %s: %w", path, err)
	}
	return &Netns{Path: path, ID: ID{Dev: st.Dev, Ino: st.Ino}, fd: fd, borrowed: true}, nil
}

// NotNetnsError is Open's error for a path that exists but is not a network
// namespace file.
type NotNetnsError struct {
	Path string
	Kind string // what it is instead ("FIFO", "regular file", ...)
}

func (e *NotNetnsError) Error() string {
	return fmt.Sprintf("netns path %s is a %s, %v", e.Path, e.Kind, ErrNotNetns)
}

func (e *NotNetnsError) Unwrap() error { return ErrNotNetns }

// Open opens the network namespace file at path without blocking and
// without side effects, whatever the path names: it is opened with O_PATH
// (opening a FIFO would block until a writer comes, a device could act),
// checked to be a network namespace's nsfs inode, and only then reopened
// through the O_PATH descriptor, so what is checked is what is used.
func Open(path string) (*Netns, error) {
	pfd, err := unix.Open(path, unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("opening netns %s: %w", path, err)
	}
	defer unix.Close(pfd)
	return OpenFD(pfd, path)
}

// OpenFD is Open of the file pfd refers to (O_PATH is enough), such as a
// descriptor another process opened and passed over a unix socket; path
// is what named it there, for errors. pfd stays open.
func OpenFD(pfd int, path string) (*Netns, error) {
	var st unix.Stat_t
	if err := unix.Fstat(pfd, &st); err != nil {
		return nil, fmt.Errorf("opening netns %s: %w", path, err)
	}
	var fs unix.Statfs_t
	if err := unix.Fstatfs(pfd, &fs); err != nil {
		return nil, fmt.Errorf("opening netns %s: %w", path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || int64(fs.Type) != unix.NSFS_MAGIC {
		return nil, &NotNetnsError{Path: path, Kind: kind(st.Mode, fs.Type)}
	}
	// Reopening the magic link of our own O_PATH descriptor yields the same
	// inode, not whatever path names by now.
	fd, err := unix.Open("/proc/self/fd/"+strconv.Itoa(pfd), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("opening netns %s: %w", path, err)
	}
	t, err := unix.IoctlRetInt(fd, unix.NS_GET_NSTYPE)
	if err != nil || t != unix.CLONE_NEWNET {
		unix.Close(fd)
		if err != nil {
			return nil, fmt.Errorf("opening netns %s: reading the namespace type: %w", path, err)
		}
		return nil, &NotNetnsError{Path: path, Kind: "namespace file of another kind than network"}
	}
	return &Netns{Path: path, ID: ID{Dev: st.Dev, Ino: st.Ino}, fd: fd}, nil
}

var kinds = map[uint32]string{
	unix.S_IFIFO:  "FIFO",
	unix.S_IFSOCK: "socket",
	unix.S_IFCHR:  "character device",
	unix.S_IFBLK:  "block device",
	unix.S_IFDIR:  "directory",
	unix.S_IFREG:  "regular file",
}

func kind(mode uint32, fsType int64) string {
	t := mode & unix.S_IFMT
	if t == unix.S_IFREG && fsType == unix.NSFS_MAGIC {
		return "namespace file of another kind than network"
	}
	if k, ok := kinds[t]; ok {
		return k
	}
	return fmt.Sprintf("file of mode %#o", t)
}

// Do runs fn on an OS thread switched into n's network namespace (n's
// descriptor, whatever n.Path names by now), so that the sockets and procfs
// files fn opens belong to it; they serve any goroutine afterwards. As
// containernetworking's ns.Do, fn runs on a fresh goroutine locked to its
// thread (never the main one), which then switches back to the process's
// namespace (home) and returns to the pool, or if it cannot stays locked
// and dies with the goroutine (see onThread). fn must not start
// goroutines that expect to run in n. A panic in fn is returned as Do's
// error.
func (n *Netns) Do(fn func() error) error {
	if selfErr == nil && n.ID == self {
		// n is where this process started (Guard.AllowOwn), as is every
		// thread an unlocked goroutine runs on (a thread inside another Do
		// runs only that Do's goroutine): no goroutine, lock or setns needed.
		return fn()
	}
	return onThread(func() (bool, error) {
		orig := home
		if homeErr != nil {
			var err error
			if orig, err = unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0); err != nil {
				return true, fmt.Errorf("opening this thread's network namespace: %w", err)
			}
			defer unix.Close(orig)
		}
		if err := setns(n.fd); err != nil {
			return true, fmt.Errorf("entering netns %s: %w", n.Path, err)
		}
		ferr := callGuarded(fn)
		if err := setns(orig); err != nil {
			return false, errors.Join(ferr, fmt.Errorf("leaving netns %s: %w", n.Path, err))
		}
		return true, ferr
	})
}

// DoDiscard is Do on a thread that never serves another goroutine: it dies
// when fn returns, so fn may change what cannot be undone on its thread
// (its credentials: netlab's probes drop to a pod's UID with the raw,
// per-thread setresuid). It never runs fn in place, even in this process's
// own namespace.
func (n *Netns) DoDiscard(fn func() error) error {
	return onThread(func() (bool, error) {
		if err := setns(n.fd); err != nil {
			return true, fmt.Errorf("entering netns %s: %w", n.Path, err)
		}
		return false, callGuarded(fn)
	})
}

// Create makes a network namespace and bind-mounts it at path, as `ip netns
// add` does (path's directory is made if missing; path must not exist, an
// error wrapping fs.ErrExist says it does). The thread that unshares into
// the new namespace dies afterwards. What Create made is removed again when
// it fails.
func Create(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("creating network namespace %s: %w", path, err)
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o444)
	if err != nil {
		return fmt.Errorf("creating network namespace %s: %w", path, err)
	}
	f.Close()
	err = onThread(func() (bool, error) {
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			return true, err
		}
		return false, unix.Mount("/proc/thread-self/ns/net", path, "", unix.MS_BIND, "")
	})
	if err != nil {
		_ = os.Remove(path)
		return fmt.Errorf("creating network namespace %s: %w", path, err)
	}
	return nil
}

func setns(fd int) error { return unix.Setns(fd, unix.CLONE_NEWNET) }

// mainTID is the main thread's ID: the process's ID.
var mainTID = unix.Getpid()

// onThread runs body on a fresh goroutine locked to an OS thread other than
// the process's main thread; body says whether the thread is fit to serve
// other goroutines afterwards (in the namespace it started in, with its
// identity). An unfit thread stays locked, so the runtime ends it with the
// goroutine and never hands it another. The main thread it would not end
// but park for good, still in the state body left, and /proc/self (which
// names the main thread) would then show that namespace as the process's:
// so body never runs there.
func onThread(body func() (fit bool, err error)) error {
	errc := make(chan error, 1)
	go runLocked(body, errc, nil)
	return <-errc
}

// runLocked is onThread's goroutine. A fresh goroutine runs on its
// caller's thread, so one called from the main thread lands there: it then
// holds the main thread while starting another goroutine (which therefore
// runs elsewhere) and lets go once that one holds a thread of its own
// (held). The answer comes from the goroutine that ran body, so the caller
// resumes on that one's thread and its next calls start off the main
// thread: the hop costs two thread wake-ups once, not at every call.
func runLocked(body func() (fit bool, err error), errc chan<- error, held chan<- struct{}) {
	runtime.LockOSThread()
	if held != nil {
		close(held)
	} else if unix.Gettid() == mainTID {
		h := make(chan struct{})
		go runLocked(body, errc, h)
		<-h
		runtime.UnlockOSThread()
		return
	}
	fit, err := body()
	if fit {
		runtime.UnlockOSThread()
	}
	errc <- err
}

// callGuarded runs fn, a panic in it turned into its error: Do's goroutine
// is outside its caller's recover, and a panic there would end the process
// (the agent, with every call in flight) instead of failing one call.
func callGuarded(fn func() error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("panic: %v", p)
		}
	}()
	return fn()
}

// Refuse returns an error wrapping ErrOwnNetns when n is PID 1's network
// namespace, registered with AddHost, or this process's own (unless
// g.AllowOwn).
func (g Guard) Refuse(n *Netns) error { return g.refuseID(n.Path, n.ID) }

// RefuseFd is Refuse for a namespace descriptor opened elsewhere.
func (g Guard) RefuseFd(fd int, path string) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("checking netns %s: %w", path, err)
	}
	return g.refuseID(path, ID{Dev: st.Dev, Ino: st.Ino})
}

func (g Guard) refuseID(path string, id ID) error {
	// PID 1's namespace is read at every call: it is what PID 1 has now.
	if host, err := statID(initNetns); err == nil && host == id {
		return fmt.Errorf("netns %s is the namespace of PID 1: %w", path, ErrOwnNetns)
	}
	hostsMu.Lock()
	hp, isHost := hosts[id]
	hostsMu.Unlock()
	if isHost {
		return fmt.Errorf("netns %s is the host's (%s): %w", path, hp, ErrOwnNetns)
	}
	if selfErr == nil && id == self && !g.AllowOwn {
		return fmt.Errorf("netns %s is this process's own: %w", path, ErrOwnNetns)
	}
	return nil
}

// Open opens path (see the package's Open) and refuses what g refuses:
// what every path that writes into a namespace starts with.
func (g Guard) Open(path string) (*Netns, error) { return g.Check(Open(path)) }

// Check is Guard.Open for a namespace opened another way: it passes on
// what the open returned, or closes n and returns Refuse's error.
func (g Guard) Check(n *Netns, err error) (*Netns, error) {
	if err != nil {
		return nil, err
	}
	if err := g.Refuse(n); err != nil {
		n.Close()
		return nil, err
	}
	return n, nil
}
