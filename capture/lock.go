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

// DefaultRunDir is the agent run dir of a default install.
const DefaultRunDir = "/var/run/nftmesh"

// lockSubdir holds one lock file per network namespace.
const lockSubdir = "netns-locks"

// netnsLock is an exclusive flock on one network namespace, held by every
// verb of every process (plugin, agent repair, CLI) sharing the run dir.
// Its file is named by the namespace's nsfs device and inode, so every path
// to the namespace shares it, in a directory only its owner can write, so
// no other user can hold it. The namespace file itself is not locked: it is
// world-readable and a flock needs only a descriptor, so any local user
// could wedge every verb on it.
//
// DEL, the namespace's last verb, removes the file. One left without a DEL
// is harmless: nobody holds it, and the next namespace given that inode
// number (the kernel reuses the lowest free one) takes it over.
type netnsLock struct {
	dir  int    // the lock directory, held open: the file is unlinked through it
	name string // the lock file's name in dir
	path string // its path, for errors
	fd   int
}

// lockDir opens the lock directory: runDir's subdirectory, or without a
// run dir DefaultRunDir's, falling back to one under the temp dir if that
// cannot be used (a CLI run as a user who cannot write /var/run). The run
// dir, its lock directory and any parent created must pass openPrivateAt:
// one another user made or can write (a /tmp/nftmesh-<uid> made ahead of
// us) is refused, as its lock files could be held or replaced.
func lockDir(runDir string) (fd int, path string, err error) {
	if runDir != "" {
		return openLockDir(runDir)
	}
	fd, path, err = openLockDir(defaultRunDir)
	if errors.As(err, new(*insecureDirError)) {
		return -1, "", err
	}
	if err == nil {
		// A user other than root cannot use root's (a CLI run on a
		// namespace its own user namespace owns, on a node with the agent).
		var st unix.Stat_t
		if euid := os.Geteuid(); euid == 0 || unix.Fstat(fd, &st) == nil && st.Uid == uint32(euid) {
			return fd, path, nil
		}
		unix.Close(fd)
	}
	return openLockDir(filepath.Join(os.TempDir(), fmt.Sprintf("nftmesh-%d", os.Geteuid())))
}

// defaultRunDir is DefaultRunDir; tests point it elsewhere.
var defaultRunDir = DefaultRunDir

func openLockDir(runDir string) (int, string, error) {
	run, err := openPrivateDir(filepath.Clean(runDir))
	if err != nil {
		return -1, "", fmt.Errorf("opening the netns lock directory: %w", err)
	}
	defer unix.Close(run)
	path := filepath.Join(runDir, lockSubdir)
	fd, err := openPrivateAt(run, lockSubdir, path)
	if err != nil {
		return -1, "", fmt.Errorf("opening the netns lock directory: %w", err)
	}
	return fd, path, nil
}

// openPrivateDir opens dir (O_PATH), creating it and its missing parents,
// and checks it and the parents it created (see checkPrivate). Existing
// parents (/var/run, /tmp) are taken as they are: dir's own check keeps
// other users out.
func openPrivateDir(dir string) (int, error) {
	parent, name := filepath.Dir(dir), filepath.Base(dir)
	if parent == dir {
		return -1, fmt.Errorf("directory %s: not a directory of its own", dir)
	}
	pfd, err := unix.Open(parent, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	switch {
	case errors.Is(err, unix.ENOENT):
		if pfd, err = openPrivateDir(parent); err != nil {
			return -1, err
		}
	case err != nil:
		return -1, fmt.Errorf("opening directory %s: %w", parent, err)
	}
	defer unix.Close(pfd)
	return openPrivateAt(pfd, name, dir)
}

// openPrivateAt opens the directory name in dirfd (path in errors),
// creating it with mode 0700 when missing, without following a symlink,
// and checks it.
func openPrivateAt(dirfd int, name, path string) (int, error) {
	const flags = unix.O_PATH | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC
	fd, err := unix.Openat(dirfd, name, flags, 0)
	if errors.Is(err, unix.ENOENT) {
		// Every verb but a node's first finds it: only then a mkdir.
		if err := unix.Mkdirat(dirfd, name, 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
			return -1, fmt.Errorf("creating directory %s: %w", path, err)
		}
		fd, err = unix.Openat(dirfd, name, flags, 0)
	}
	if err != nil {
		if errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) {
			// A symlink, or a file: its lstat says which.
			var st unix.Stat_t
			if unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil {
				return -1, &insecureDirError{path: path, why: "is a " + fileKind(st.Mode) + ", not a directory"}
			}
		}
		return -1, fmt.Errorf("opening directory %s: %w", path, err)
	}
	if err := checkPrivate(fd, path); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// checkPrivate checks that fd is a directory owned by this user or root
// that neither its group nor others can write.
func checkPrivate(fd int, path string) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("checking directory %s: %w", path, err)
	}
	euid := uint32(os.Geteuid())
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFDIR:
		return &insecureDirError{path: path, why: "is a " + fileKind(st.Mode) + ", not a directory"}
	case st.Uid != euid && st.Uid != 0:
		return &insecureDirError{path: path, why: fmt.Sprintf("is owned by uid %d, not %d or root", st.Uid, euid)}
	case st.Mode&0o022 != 0:
		return &insecureDirError{path: path, why: fmt.Sprintf("has mode %#o: its group or others can write it", st.Mode&0o7777)}
	}
	return nil
}

// insecureDirError refuses a lock directory, or one of its parents, that
// another user could write.
type insecureDirError struct{ path, why string }

func (e *insecureDirError) Error() string {
	return fmt.Sprintf("refusing directory %s: it %s (another user could hold or replace the netns lock files; use a run dir only this user can write)", e.path, e.why)
}

func fileKind(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFLNK:
		return "symlink"
	case unix.S_IFREG:
		return "regular file"
	case unix.S_IFDIR:
		return "directory"
	}
	return fmt.Sprintf("file of mode %#o", mode&unix.S_IFMT)
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

// lockNetns takes the lock of namespace n, waiting until ctx is done.
func lockNetns(ctx context.Context, runDir string, n *hostns.Netns, what string) (*netnsLock, error) {
	dir, dirPath, err := lockDir(runDir)
	if err != nil {
		return nil, err
	}
	name := fmt.Sprintf("netns-%d-%d.lock", n.ID.Dev, n.ID.Ino)
	path := filepath.Join(dirPath, name)
	for {
		fd, err := unix.Openat(dir, name, unix.O_CREAT|unix.O_RDWR|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o600)
		if err != nil {
			unix.Close(dir)
			return nil, fmt.Errorf("opening the lock file %s of netns %s: %w", path, what, err)
		}
		if err := flockWait(ctx, fd, what, "another nftmesh run holds "+path); err != nil {
			unix.Close(fd)
			unix.Close(dir)
			return nil, err
		}
		// A holder that removed the file (DEL, the namespace's last verb)
		// leaves us locking an unlinked inode: start over on the new file.
		var held, named unix.Stat_t
		if unix.Fstat(fd, &held) == nil && unix.Fstatat(dir, name, &named, unix.AT_SYMLINK_NOFOLLOW) == nil && held.Dev == named.Dev && held.Ino == named.Ino {
			return &netnsLock{dir: dir, name: name, path: path, fd: fd}, nil
		}
		unix.Close(fd)
	}
}

// unlock releases the lock; with remove, the lock file goes first (the
// namespace is going away), so later runs start on a new file.
func (l *netnsLock) unlock(remove bool) {
	if remove {
		_ = unix.Unlinkat(l.dir, l.name, 0)
	}
	_ = unix.Flock(l.fd, unix.LOCK_UN)
	unix.Close(l.fd)
	unix.Close(l.dir)
}
