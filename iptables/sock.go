package iptables

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/nftmesh/nftmesh/internal/hostns"
	"github.com/nftmesh/nftmesh/redirect"
)

// Socket option numbers (IPT_BASE_CTL = IP6T_BASE_CTL = 64).
const (
	soSetReplace        = 64
	soSetAddCounters    = 65
	soGetInfo           = 64
	soGetEntries        = 65
	soGetRevisionMatch  = 66
	soGetRevisionTarget = 67
)

// nsSockets are raw sockets bound to one network namespace, plus the
// tables that existed there when they were opened (read from procfs inside
// the namespace, so that merely looking does not instantiate a table).
type nsSockets struct {
	fd     map[redirect.Family]int
	tables map[redirect.Family]map[string]bool
}

func (s *nsSockets) Close() {
	for _, fd := range s.fd {
		unix.Close(fd)
	}
}

// openSockets creates one raw socket per family inside the network
// namespace at path. This is the only place that enters a namespace: a
// socket keeps the namespace it was created in, so everything after this
// runs on ordinary goroutines. With write, the host's own namespace is
// refused (the socket is for replacing tables).
func openSockets(path string, fams []redirect.Family, write bool) (*nsSockets, error) {
	s := &nsSockets{fd: map[redirect.Family]int{}, tables: map[redirect.Family]map[string]bool{}}
	err := doInNetns(path, write, func() error {
		for _, f := range fams {
			af, names := unix.AF_INET, "ip_tables_names"
			if f == redirect.FamilyIPv6 {
				af, names = unix.AF_INET6, "ip6_tables_names"
			}
			fd, err := unix.Socket(af, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_RAW)
			if err != nil {
				return fmt.Errorf("creating %s raw socket: %w", f, err)
			}
			s.fd[f] = fd
			s.tables[f] = map[string]bool{}
			// /proc/thread-self/net follows this thread's namespace.
			b, err := os.ReadFile("/proc/thread-self/net/" + names)
			if err != nil && !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("listing %s tables: %w", f, err)
			}
			for _, n := range strings.Fields(string(b)) {
				s.tables[f][n] = true
			}
		}
		return nil
	})
	if err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// doInNetns runs fn on a dedicated OS thread switched into the network
// namespace at path (the semantics of containernetworking's ns.Do). If the
// thread cannot be switched back it stays locked, so the Go runtime
// discards it instead of reusing a thread in the wrong namespace. The path
// must name a network namespace (see hostns.Open); with write, not the
// host's.
func doInNetns(path string, write bool, fn func() error) error {
	open := hostns.Open
	if write {
		open = hostns.OpenGuarded
	}
	n, err := open(path)
	if err != nil {
		return err
	}
	defer n.Close()
	target := n.Fd()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("opening current netns: %w", err)
			return
		}
		defer unix.Close(orig)
		if err := unix.Setns(target, unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("entering netns %s: %w", path, err)
			return
		}
		ferr := fn()
		if err := unix.Setns(orig, unix.CLONE_NEWNET); err != nil {
			// Leave the thread locked: it dies with this goroutine.
			errc <- errors.Join(ferr, fmt.Errorf("leaving netns %s: %w", path, err))
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

func getsockopt(fd, level, opt int, buf []byte) (int, error) {
	n := uint32(len(buf))
	r, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), uintptr(level), uintptr(opt),
		uintptr(unsafe.Pointer(unsafe.SliceData(buf))), uintptr(unsafe.Pointer(&n)), 0)
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}

func setsockopt(fd, level, opt int, buf []byte) error {
	_, _, e := unix.Syscall6(unix.SYS_SETSOCKOPT, uintptr(fd), uintptr(level), uintptr(opt),
		uintptr(unsafe.Pointer(unsafe.SliceData(buf))), uintptr(len(buf)), 0)
	if e != 0 {
		return e
	}
	return nil
}

// xtablesLock holds the lock iptables binaries take (flock on
// /run/xtables.lock or $XTABLES_LOCKFILE) so our table replace does not
// race theirs. The file lives in our mount namespace, as it does for the
// binaries we cooperate with.
func xtablesLock(ctx context.Context) (release func(), err error) {
	path := os.Getenv("XTABLES_LOCKFILE")
	if path == "" {
		path = "/run/xtables.lock"
	}
	fd, err := unix.Open(path, unix.O_CREAT|unix.O_RDONLY|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening xtables lock %s: %w", path, err)
	}
	wait := 50 * time.Microsecond
	for {
		err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return func() { unix.Close(fd) }, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR) {
			unix.Close(fd)
			return nil, fmt.Errorf("locking %s: %w", path, err)
		}
		select {
		case <-ctx.Done():
			unix.Close(fd)
			return nil, fmt.Errorf("waiting for xtables lock %s: %w", path, ctx.Err())
		case <-time.After(wait):
		}
		wait = min(2*wait, 10*time.Millisecond)
	}
}

// revisionSupported asks the kernel whether it has revision rev of an
// extension (the question libxtables asks before choosing a revision).
func revisionSupported(fd int, l *layout, target bool, name string, rev uint8) bool {
	b := make([]byte, getRevisionLen)
	copy(b[:xtExtMaxNameLen], name)
	b[xtExtMaxNameLen] = rev
	opt := soGetRevisionMatch
	if target {
		opt = soGetRevisionTarget
	}
	_, err := getsockopt(fd, l.sockLevel, opt, b)
	return err == nil
}

// chooseRevisions picks, for the extensions whose revision is a choice, the
// newest one both we and the kernel know (as iptables does), so entries we
// write are byte-identical to what iptables-legacy-restore writes.
func chooseRevisions(fd int, l *layout) map[string]uint8 {
	out := map[string]uint8{}
	for _, c := range []struct {
		target bool
		name   string
		revs   []uint8
	}{
		{true, "CONNMARK", []uint8{2, 1}},
		{true, "CT", []uint8{2, 1}},
	} {
		for _, r := range c.revs {
			if revisionSupported(fd, l, c.target, c.name, r) {
				key := c.name
				if c.target {
					key = "T:" + c.name
				}
				out[key] = r
				break
			}
		}
	}
	return out
}
