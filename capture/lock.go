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

// DefaultRunDir is the agent run dir of a default install; the CLI takes
// its per-netns locks there, so it queues behind the plugin and the repair.
const DefaultRunDir = "/var/run/nftmesh"

// lockSubdir holds one lock file per network namespace.
const lockSubdir = "netns-locks"

// netnsLock is an exclusive flock on the file that stands for one network
// namespace. Every verb that reads or changes a namespace's capture holds
// it, in every process (plugin runs, the agent's repair, the CLI), so two
// runs never interleave their reads and writes in one namespace.
type netnsLock struct {
	path string
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

// lockNetns takes the lock of the namespace id, waiting until ctx is done.
// The file is named by the namespace's device and inode, so every path to
// one namespace (bind mount, /proc/PID/ns/net, symlink) shares one lock.
func lockNetns(ctx context.Context, runDir string, id hostns.ID, what string) (*netnsLock, error) {
	dir, err := lockDir(runDir)
	if err != nil {
		return nil, err
	}
	path := filepath.Join(dir, fmt.Sprintf("netns-%d-%d.lock", id.Dev, id.Ino))
	wait := 200 * time.Microsecond
	for {
		fd, err := unix.Open(path, unix.O_CREAT|unix.O_RDWR|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o600)
		if err != nil {
			return nil, fmt.Errorf("opening the lock file %s of netns %s: %w", path, what, err)
		}
		for {
			err = unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB)
			if !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR) {
				break
			}
			select {
			case <-ctx.Done():
				unix.Close(fd)
				return nil, fmt.Errorf("waiting for the lock of netns %s (another nftmesh run holds %s): %w", what, path, ctx.Err())
			case <-time.After(wait):
			}
			wait = min(2*wait, 20*time.Millisecond)
		}
		if err != nil {
			unix.Close(fd)
			return nil, fmt.Errorf("locking %s for netns %s: %w", path, what, err)
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

// unlock releases the lock; with remove, the lock file goes first (the
// namespace is going away), so later runs start on a new file.
func (l *netnsLock) unlock(remove bool) {
	if remove {
		_ = os.Remove(l.path)
	}
	unix.Close(l.fd)
}
