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
//
// A removal must not need room in the run dir: DEL is how a sandbox goes,
// and on a full or read-only /run (ENOSPC, EDQUOT, EROFS) a DEL that fails
// keeps it for good. Where the lock file is missing and cannot be made,
// lockForRemoval locks instead the deepest directory on the file's path
// that exists (the lock directory, else the run dir, else a parent),
// exclusively. Whoever creates a directory or file on that path holds a
// shared flock on its parent while it does, and no verb holds a missing
// file's lock, so the two exclude each other:
//   - a verb that made the file before the exclusive flock was taken is
//     seen by the removal's look after taking it, which then goes back to
//     the file's own lock (opened, not created) and waits its turn;
//   - a verb that makes it later waits for the removal to end.
//
// Other users cannot open the lock directory (0700), so only our own verbs
// flock it. The run dir and its parents may be readable by others (the
// run dir is 0755 for the plugin's log), and a flock held there for ever
// would stall every first verb of a node and every fallback removal: on
// such a directory the wait is bounded by wedgeWait, after which the verb
// goes on without that lock. What is left unexcluded then is a removal on
// a full disk whose run dir has no lock directory yet, racing a verb that
// makes it (room came back meanwhile), while another user holds a flock
// on the run dir. The namespace file would be no better a fallback: any
// user who can open it could hold every such removal off for good.
type netnsLock struct {
	dir  int    // the lock directory, held open: the file is unlinked through it; -1 for a fallback
	name string // the lock file's name in dir
	path string // its path (a fallback's: the directory locked), for errors
	fd   int    // holds the flock; -1 for a fallback that went on without (see wedgeWait)
}

// wedgeWait bounds the wait for a flock on a directory that other users
// can open: they could hold it for ever (see netnsLock).
const wedgeWait = time.Second

// lockDir opens the lock directory: runDir's subdirectory, or without a
// run dir DefaultRunDir's, falling back to one under the temp dir if that
// cannot be used (a CLI run as a user who cannot write /var/run). The run
// dir, its lock directory and any parent created must pass openPrivateAt:
// one another user made or can write (a /tmp/nftmesh-<uid> made ahead of
// us) is refused, as its lock files could be held or replaced. path is
// returned with an error too: the directory tried last.
func lockDir(ctx context.Context, runDir string) (fd int, path string, err error) {
	if runDir != "" {
		return openLockDir(ctx, runDir)
	}
	fd, path, err = openLockDir(ctx, defaultRunDir)
	if errors.As(err, new(*insecureDirError)) {
		return -1, path, err
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
	return openLockDir(ctx, tempRunDir())
}

// tempRunDir is lockDir's fallback run dir.
func tempRunDir() string { return filepath.Join(os.TempDir(), fmt.Sprintf("nftmesh-%d", os.Geteuid())) }

// defaultRunDir is DefaultRunDir; tests point it elsewhere.
var defaultRunDir = DefaultRunDir

func openLockDir(ctx context.Context, runDir string) (int, string, error) {
	path := filepath.Join(runDir, lockSubdir)
	run, err := openPrivateDir(ctx, filepath.Clean(runDir))
	if err != nil {
		return -1, path, fmt.Errorf("opening the netns lock directory: %w", err)
	}
	defer unix.Close(run)
	fd, err := openPrivateAt(ctx, run, lockSubdir, path)
	if err != nil {
		return -1, path, fmt.Errorf("opening the netns lock directory: %w", err)
	}
	return fd, path, nil
}

// openPrivateDir opens dir (O_PATH), creating it and its missing parents,
// and checks it and the parents it created (see checkPrivate). Existing
// parents (/var/run, /tmp) are taken as they are: dir's own check keeps
// other users out.
func openPrivateDir(ctx context.Context, dir string) (int, error) {
	parent, name := filepath.Dir(dir), filepath.Base(dir)
	if parent == dir {
		return -1, fmt.Errorf("directory %s: not a directory of its own", dir)
	}
	pfd, err := unix.Open(parent, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	switch {
	case errors.Is(err, unix.ENOENT):
		if pfd, err = openPrivateDir(ctx, parent); err != nil {
			return -1, err
		}
	case err != nil:
		return -1, fmt.Errorf("opening directory %s: %w", parent, err)
	}
	defer unix.Close(pfd)
	return openPrivateAt(ctx, pfd, name, dir)
}

// openPrivateAt opens the directory name in dirfd (path in errors),
// creating it with mode 0700 when missing, without following a symlink,
// and checks it.
func openPrivateAt(ctx context.Context, dirfd int, name, path string) (int, error) {
	const flags = unix.O_PATH | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC
	fd, err := unix.Openat(dirfd, name, flags, 0)
	if errors.Is(err, unix.ENOENT) {
		// Every verb but a node's first finds it: only then a mkdir.
		mkdir := func() error {
			if err := unix.Mkdirat(dirfd, name, 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
				return creating("directory "+path, err)
			}
			return nil
		}
		if err := createIn(ctx, dirfd, filepath.Dir(path), mkdir); err != nil {
			return -1, err
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

// noRoomError is the failure to make a directory or lock file because the
// run dir's file system is full or read-only: a verb that needs the lock
// file fails closed on it, a removal locks another way (lockForRemoval).
type noRoomError struct {
	what     string // what could not be made, with its path
	lockFile string // the lock file it was on the way to; set by lockNetns
	errno    unix.Errno
}

func (e *noRoomError) Error() string {
	return fmt.Sprintf("creating %s: %v (%s)", e.what, e.errno, unix.ErrnoName(e.errno))
}

func (e *noRoomError) Unwrap() error { return e.errno }

// creating wraps the error of making what: a *noRoomError for a full or
// read-only file system (not EMFILE and the like: those are this process's
// own limits, and no other lock would do better).
func creating(what string, err error) error {
	var errno unix.Errno
	if errors.As(err, &errno) && (errno == unix.ENOSPC || errno == unix.EDQUOT || errno == unix.EROFS) {
		return &noRoomError{what: what, errno: errno}
	}
	return fmt.Errorf("creating %s: %w", what, err)
}

// flockWait takes a flock (how: LOCK_EX or LOCK_SH) on fd, polling with
// backoff until ctx is done. what names the lock, holder who may hold it.
func flockWait(ctx context.Context, fd, how int, what, holder string) error {
	wait := 200 * time.Microsecond
	for {
		err := unix.Flock(fd, how|unix.LOCK_NB)
		if err == nil {
			return nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR) {
			return fmt.Errorf("locking %s: %w", what, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for the lock of %s (%s): %w", what, holder, ctx.Err())
		case <-time.After(wait):
		}
		wait = min(2*wait, 20*time.Millisecond)
	}
}

// flockDir takes a flock (how) on the directory dirfd refers to (O_PATH is
// enough; path in errors) and returns the descriptor that holds it, or -1
// where it went on without: the directory cannot be opened for reading, or
// other users can open it and held it past wedgeWait (see netnsLock).
func flockDir(ctx context.Context, dirfd int, path string, how int) (int, error) {
	fd, err := unix.Openat(dirfd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.EACCES) {
		// This user may search and write it, not read it: neither could
		// a removal of this user flock it.
		return -1, nil
	}
	if err != nil {
		return -1, fmt.Errorf("opening directory %s to lock it: %w", path, err)
	}
	wait := ctx
	if othersCanOpen(fd) {
		var cancel context.CancelFunc
		wait, cancel = context.WithTimeout(ctx, wedgeWait)
		defer cancel()
	}
	if err := flockWait(wait, fd, how, "directory "+path, "an nftmesh run making or removing what is in it"); err != nil {
		unix.Close(fd)
		if ctx.Err() == nil && wait.Err() != nil {
			return -1, nil // another user's flock, likely: go on without
		}
		return -1, err
	}
	return fd, nil
}

// othersCanOpen reports whether a user other than this one and root may
// open the directory fd for reading, and so flock it.
func othersCanOpen(fd int) bool {
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil {
		return true
	}
	return st.Mode&0o044 != 0 || (st.Uid != 0 && st.Uid != uint32(os.Geteuid()))
}

// unflock releases what flockDir took.
func unflock(fd int) {
	if fd >= 0 {
		_ = unix.Flock(fd, unix.LOCK_UN)
		unix.Close(fd)
	}
}

// createIn runs create, which makes an entry in the directory dirfd (path
// in errors), under a shared flock on that directory: a removal's fallback
// lock, exclusive, waits for it or holds it off (see netnsLock).
func createIn(ctx context.Context, dirfd int, path string, create func() error) error {
	lk, err := flockDir(ctx, dirfd, path, unix.LOCK_SH)
	if err != nil {
		return err
	}
	defer unflock(lk)
	return create()
}

// lockName is the name of n's lock file.
func lockName(n *hostns.Netns) string { return fmt.Sprintf("netns-%d-%d.lock", n.ID.Dev, n.ID.Ino) }

// openLockFile opens the lock file name in the lock directory dir
// (dirPath), creating it (see createIn) only when missing. Read-only is
// enough for a flock, and opens on a read-only file system.
func openLockFile(ctx context.Context, dir int, dirPath, name string) (int, error) {
	const flags = unix.O_RDONLY | unix.O_NONBLOCK | unix.O_NOFOLLOW | unix.O_CLOEXEC
	fd, err := unix.Openat(dir, name, flags, 0)
	if !errors.Is(err, unix.ENOENT) {
		return fd, err
	}
	fd = -1
	err = createIn(ctx, dir, dirPath, func() (err error) {
		if fd, err = unix.Openat(dir, name, flags|unix.O_CREAT, 0o600); err != nil {
			return creating("it", err)
		}
		return nil
	})
	return fd, err
}

// lockNetns takes the lock of namespace n, waiting until ctx is done.
func lockNetns(ctx context.Context, runDir string, n *hostns.Netns, what string) (*netnsLock, error) {
	dir, dirPath, err := lockDir(ctx, runDir)
	name := lockName(n)
	path := filepath.Join(dirPath, name)
	if err != nil {
		return nil, onTheWayTo(err, path)
	}
	for {
		fd, err := openLockFile(ctx, dir, dirPath, name)
		if err != nil {
			unix.Close(dir)
			return nil, onTheWayTo(fmt.Errorf("opening the lock file %s of netns %s: %w", path, what, err), path)
		}
		if err := flockWait(ctx, fd, unix.LOCK_EX, "netns "+what, "another nftmesh run holds "+path); err != nil {
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

// onTheWayTo records in err's *noRoomError, if any, the lock file lockFile
// it was on the way to, and says whose file system is full.
func onTheWayTo(err error, lockFile string) error {
	nr := (*noRoomError)(nil)
	if !errors.As(err, &nr) {
		return err
	}
	nr.lockFile = lockFile
	return fmt.Errorf("%w: the file system of run dir %s is full or read-only", err, filepath.Dir(filepath.Dir(lockFile)))
}

// lockForRemoval is lockNetns for a removal, which must work on a full or
// read-only run dir: where the lock file is missing and cannot be made, it
// takes the fallback lock (see netnsLock).
func lockForRemoval(ctx context.Context, runDir string, n *hostns.Netns, what string) (*netnsLock, error) {
	for {
		lk, err := lockNetns(ctx, runDir, n, what)
		var nr *noRoomError
		if !errors.As(err, &nr) {
			return lk, err
		}
		if lk, err = lockInstead(ctx, nr.lockFile); lk != nil || err != nil {
			return lk, err
		}
		// Made meanwhile: there is room again for the lock file's own.
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("locking netns %s: %w", what, err)
		}
	}
}

// lockInstead takes the fallback lock for the missing lock file: an
// exclusive flock on the deepest directory on its path that exists, under
// which the next entry on the path must still be missing. Nil without an
// error: that entry exists by now (try the file's own lock again).
func lockInstead(ctx context.Context, lockFile string) (*netnsLock, error) {
	dir, next := lockFile, ""
	for {
		var st unix.Stat_t
		err := unix.Lstat(dir, &st)
		if err == nil {
			break
		}
		if !errors.Is(err, unix.ENOENT) {
			return nil, fmt.Errorf("looking for %s: %w", dir, err)
		}
		if filepath.Dir(dir) == dir {
			return nil, fmt.Errorf("looking for %s: %w", lockFile, err)
		}
		dir, next = filepath.Dir(dir), filepath.Base(dir)
	}
	if next == "" {
		return nil, nil
	}
	dfd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("opening directory %s: %w", dir, err)
	}
	defer unix.Close(dfd)
	fd, err := flockDir(ctx, dfd, dir, unix.LOCK_EX)
	if err != nil {
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Fstatat(dfd, next, &st, unix.AT_SYMLINK_NOFOLLOW); !errors.Is(err, unix.ENOENT) {
		unflock(fd)
		return nil, nil
	}
	return &netnsLock{dir: -1, path: dir, fd: fd}, nil
}

// unlock releases the lock; with remove, the lock file goes first (the
// namespace is going away), so later runs start on a new file.
func (l *netnsLock) unlock(remove bool) {
	if l.dir < 0 {
		unflock(l.fd)
		return
	}
	if remove {
		_ = unix.Unlinkat(l.dir, l.name, 0)
	}
	_ = unix.Flock(l.fd, unix.LOCK_UN)
	unix.Close(l.fd)
	unix.Close(l.dir)
}

// lockFileExists reports whether n's lock file may exist in runDir (both
// of lockDir's choices without one), without creating anything.
func lockFileExists(runDir string, n *hostns.Netns) bool {
	dirs := []string{runDir}
	if runDir == "" {
		dirs = []string{defaultRunDir, tempRunDir()}
	}
	for _, d := range dirs {
		var st unix.Stat_t
		err := unix.Lstat(filepath.Join(d, lockSubdir, lockName(n)), &st)
		if !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.ENOTDIR) {
			return true
		}
	}
	return false
}
