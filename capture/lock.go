package capture

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nftmesh/nftmesh/internal/hostns"
)

// DefaultRunDir is the agent run dir of a default install, where the lock
// files of stub namespaces go when no run dir is given (a real namespace is
// locked on its own inode, so every process queues on it whatever its run
// dir).
const DefaultRunDir = "/var/run/nftmesh"

// lockSubdir holds one lock file per network namespace.
const lockSubdir = "netns-locks"

// netnsLock is an exclusive flock on one network namespace. Every verb that
// reads or changes a namespace's capture holds it, in every process (plugin
// runs, the agent's repair, the CLI), so two runs never interleave their
// reads and writes in one namespace.
//
// A namespace opened from the kernel is locked on its own nsfs inode: every
// open of one namespace, by any path and in any process, reaches the same
// inode, so nothing has to be created, named or cleaned up, and no disk is
// written (a full or slow run dir cannot fail or delay a pod's start). A
// stub namespace of the in-memory kernel has no descriptor: it is locked on
// a file named by its identity in the run dir.
type netnsLock struct {
	path string // the lock file; "" for a namespace's own inode
	fd   int
}

// lockDir is where the lock files live: runDir's subdirectory, or when no
// run dir was configured, DefaultRunDir's, falling back to the temp dir if
// that cannot be created (a CLI run on a machine without the agent).
func lockDir(runDir string) (string, error) {
	if runDir != "" {
		dir := filepath.Join(runDir, lockSubdir)
		if err := ensureDir(dir); err != nil {
			return "", fmt.Errorf("creating the netns lock directory: %w", err)
		}
		return dir, nil
	}
	dir := filepath.Join(DefaultRunDir, lockSubdir)
	if err := ensureDir(dir); err == nil {
		return dir, nil
	}
	dir = filepath.Join(os.TempDir(), fmt.Sprintf("nftmesh-%d", os.Geteuid()), lockSubdir)
	if err := ensureDir(dir); err != nil {
		return "", fmt.Errorf("creating the netns lock directory: %w", err)
	}
	return dir, nil
}

// ensureDir makes dir exist as a directory. It exists on every verb but a
// node's first, so one stat answers; only a missing one pays MkdirAll's
// walk up the path. Anything else there (a file, a dangling symlink) is
// left to MkdirAll to report.
func ensureDir(dir string) error {
	var st unix.Stat_t
	if unix.Stat(dir, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return nil
	}
	return os.MkdirAll(dir, 0o700)
}

// lockNetns takes the lock of namespace n, waiting until ctx is done.
func lockNetns(ctx context.Context, runDir string, n *hostns.Netns, what string) (*netnsLock, error) {
	if n.Fd() >= 0 {
		return lockInode(ctx, n.Fd(), what)
	}
	return lockFile(ctx, runDir, n.ID, what)
}

// lockInode flocks the namespace's own inode through a duplicate of fd
// (its own reference: the caller may close or hand over fd meanwhile).
func lockInode(ctx context.Context, fd int, what string) (*netnsLock, error) {
	dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("locking netns %s: %w", what, err)
	}
	if err := flockWait(ctx, dup, what, "another nftmesh run holds it"); err != nil {
		unix.Close(dup)
		return nil, err
	}
	return &netnsLock{fd: dup}, nil
}

// flockWait takes an exclusive flock on fd, polling with backoff until ctx
// is done.
func flockWait(ctx context.Context, fd int, what, holder string) error {
	wait := 200 * time.Microsecond
	for {
		err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR) {
			return fmt.Errorf("locking netns %s: %w", what, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for the lock of netns %s (%s): %w", what, holder, ctx.Err())
		case <-time.After(wait):
		}
		wait = min(2*wait, 20*time.Millisecond)
	}
}

// lockFile locks the file standing for the namespace id in the run dir.
// The file is named by the namespace's device and inode, so every path to
// one namespace (bind mount, /proc/PID/ns/net, symlink) shares one lock.
func lockFile(ctx context.Context, runDir string, id hostns.ID, what string) (*netnsLock, error) {
	dir, err := lockDir(runDir)
	if err != nil {
		return nil, err
	}
	path := filepath.Join(dir, fmt.Sprintf("netns-%d-%d.lock", id.Dev, id.Ino))
	for {
		fd, err := unix.Open(path, unix.O_CREAT|unix.O_RDWR|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o600)
		if err != nil {
			return nil, fmt.Errorf("opening the lock file %s of netns %s: %w", path, what, err)
		}
		if err := flockWait(ctx, fd, what, "another nftmesh run holds "+path); err != nil {
			unix.Close(fd)
			return nil, err
		}
		// A holder that removed the file (DEL, the namespace's last verb)
		// leaves us locking an unlinked inode: start over on the new file.
		var held, named unix.Stat_t
		if unix.Fstat(fd, &held) == nil && unix.Stat(path, &named) == nil && held.Dev == named.Dev && held.Ino == named.Ino {
			return &netnsLock{path: path, fd: fd}, nil
		}
		unix.Close(fd)
	}
}

// unlock releases the lock; with remove, a lock file goes first (the
// namespace is going away), so later runs start on a new file.
func (l *netnsLock) unlock(remove bool) {
	if remove && l.path != "" {
		_ = os.Remove(l.path)
	}
	_ = unix.Flock(l.fd, unix.LOCK_UN)
	unix.Close(l.fd)
}
