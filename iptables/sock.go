package iptables

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/nftmesh/nftmesh/internal/hostns"
	"github.com/nftmesh/nftmesh/policyroute"
	"github.com/nftmesh/nftmesh/redirect"
)

// Socket option numbers (IPT_BASE_CTL = IP6T_BASE_CTL = 64).
const (
	soSetReplace        = 64
	soSetAddCounters    = 65
	soGetInfo           = 64
	soGetEntries        = 65
	soGetRevisionTarget = 67
)

// Sockets are raw sockets bound to one network namespace, plus the legacy
// tables that existed there when they were opened (read from procfs inside
// the namespace, so that merely looking does not instantiate a table).
type Sockets struct {
	fd     map[redirect.Family]int
	tables map[redirect.Family]map[string]bool
	// ns and route (openSockets only): the namespace, and rtnetlink in it
	// for the policy routes, opened in the same visit as the raw sockets.
	ns    *hostns.Netns
	route *policyroute.Handle
}

// Close closes the sockets.
func (s *Sockets) Close() {
	for _, fd := range s.fd {
		unix.Close(fd)
	}
	if s.route != nil {
		s.route.Close()
	}
	s.ns.Close()
}

// openSockets runs openHere inside the namespace at path, and opens
// rtnetlink there for the policy routes: with a write guard, refusing what
// it refuses and giving every family a socket, tables or not (for
// replacing tables); with nil, for reading. One visit, one open of path:
// the routes go where the rules went.
func openSockets(path string, fams []redirect.Family, write *hostns.Guard) (*Sockets, error) {
	open := hostns.Open
	if write != nil {
		open = write.Open
	}
	n, err := open(path)
	if err != nil {
		return nil, err
	}
	var s *Sockets
	err = n.Do(func() (err error) {
		if s, err = openHere(fams, write != nil); err != nil {
			return err
		}
		s.route, err = policyroute.OpenHere()
		return err
	})
	if err != nil {
		if s != nil {
			s.Close()
		}
		n.Close()
		return nil, err
	}
	s.ns = n
	return s, nil
}

// openHere reads which legacy tables exist in the calling thread's network
// namespace (it must run inside it, hostns.Netns.Do) and creates a raw
// socket per family, or without always only per family that has a table
// (a reader needs none elsewhere). A socket keeps its namespace, so all
// after this runs on any goroutine.
func openHere(fams []redirect.Family, always bool) (*Sockets, error) {
	s := &Sockets{fd: map[redirect.Family]int{}, tables: map[redirect.Family]map[string]bool{}}
	for _, f := range fams {
		names := "ip_tables_names"
		if f == redirect.FamilyIPv6 {
			names = "ip6_tables_names"
		}
		s.tables[f] = map[string]bool{}
		// /proc/thread-self/net follows this thread's namespace. A kernel
		// without legacy x_tables (or without the family's module loaded)
		// has no such file: no tables.
		b, err := readProc("/proc/thread-self/net/" + names)
		if err != nil && !errors.Is(err, unix.ENOENT) {
			s.Close()
			return nil, fmt.Errorf("listing %s tables: %w", f, err)
		}
		for _, n := range strings.Fields(string(b)) {
			s.tables[f][n] = true
		}
		if !always && len(s.tables[f]) == 0 {
			continue
		}
		fd, err := unix.Socket(layoutFor(f).af, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_RAW)
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("creating %s raw socket: %w", f, err)
		}
		s.fd[f] = fd
	}
	return s, nil
}

// readProc reads a small procfs file with plain system calls: os.ReadFile
// would register it with the runtime's poller and back again, the larger
// part of reading a few bytes on every verb.
func readProc(path string) ([]byte, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	b := make([]byte, 0, 128)
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		n, err := unix.Read(fd, b[len(b):cap(b)])
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if n == 0 {
			return b, nil
		}
		b = b[:len(b)+n]
	}
}

// OpenHere opens the Sockets of the calling thread's network namespace for
// reading, so a verb enters the namespace once for everything it opens
// there. It must run on a thread inside it (hostns.Netns.Do); nothing is
// instantiated.
func OpenHere() (*Sockets, error) { return openHere(allFamilies, false) }

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

// chooseRevisions picks, for the targets whose revision is a choice, the
// newest one both we and the kernel know (libxtables asks the kernel the
// same way), so entries we write are byte-identical to what
// iptables-legacy-restore writes.
func chooseRevisions(fd int, l *layout) map[string]uint8 {
	out := map[string]uint8{}
	for _, name := range []string{"CONNMARK", "CT"} {
		for _, rev := range []uint8{2, 1} {
			b := make([]byte, getRevisionLen)
			copy(b[:xtExtMaxNameLen], name)
			b[xtExtMaxNameLen] = rev
			if _, err := getsockopt(fd, l.sockLevel, soGetRevisionTarget, b); err == nil {
				out[name] = rev
				break
			}
		}
	}
	return out
}
