package installer

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nftmesh/nftmesh/internal/atomicfile"
)

// The primary CNI's installer writes its config whenever it likes, in place
// or by renaming a new file over the old one, and nothing makes it take a
// lock. So every change the agent makes to a config file is a
// compare-and-swap against the content it computed from: the file is
// replaced only while it still is the file that was read, and a version
// the primary slipped in at the last moment is put back rather than lost.

// errChanged means the file changed after it was read; start over from
// its new content.
var errChanged = errors.New("changed while being rewritten")

// casAttempts bounds the read-compute-swap rounds of one change; a file that
// keeps changing longer than that is retried on the next file event.
const casAttempts = 8

// tornWait is the first pause before reading again a file that is not
// complete JSON (doubling each round, 1.3 s in all): a primary writing in
// place leaves it truncated only until its write call runs, which a loaded
// node may delay.
const tornWait = 10 * time.Millisecond

// errTorn is content that is not complete JSON: read again after a pause.
var errTorn = fmt.Errorf("not complete JSON, perhaps half written: %w", errChanged)

// retryChanged runs f until it does not report errChanged, at most
// casAttempts times; then the last errChanged is returned, after what.
func retryChanged(what string, f func() error) error {
	var err error
	for i := range casAttempts {
		if err = f(); !errors.Is(err, errChanged) {
			return err
		}
		if errors.Is(err, errTorn) && i < casAttempts-1 {
			time.Sleep(tornWait << i)
		}
	}
	return fmt.Errorf("%s: still changing after %d attempts: %w", what, casAttempts, err)
}

// unlessChanged wraps err with what it was doing, except errChanged, which
// goes back as it is for the caller to read the file again.
func unlessChanged(err error, format string, args ...any) error {
	if err == nil || errors.Is(err, errChanged) {
		return err
	}
	return fmt.Errorf(format+": %w", append(args, err)...)
}

// complete reports errTorn for content that is not complete JSON, so the
// caller reads again rather than fail on a file caught in the middle of an
// in-place write.
func complete(s snapshot) error {
	if s.exists && !json.Valid(s.data) {
		return fmt.Errorf("%s: %w", s.name, errTorn)
	}
	return nil
}

// beforeSwap, when set (tests only), runs between the final check and the
// rename, where another writer can slip in, and before each change of the
// undo record: at every point between two changes that reach the disk.
var beforeSwap func(path string)

// snapshot is a config file's content and identity as read.
type snapshot struct {
	name   string // the path as given (a symlink stays a symlink)
	path   string // where it was read: symlinks resolved
	exists bool
	data   []byte
	sum    string
	dev    uint64
	ino    uint64
	size   int64
	mtime  syscall.Timespec
	mode   fs.FileMode
	uid    int
	gid    int
}

// resolve follows path's symlinks, so a linked config is rewritten at its
// target and the link stays. A dangling link resolves to its target too
// (only the last element may be missing).
func resolve(path string) (string, error) {
	if p, err := filepath.EvalSymlinks(path); err == nil {
		return p, nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("resolving %s: %w", path, err)
	}
	dir, err := filepath.EvalSymlinks(filepath.Dir(path))
	if err != nil {
		return "", fmt.Errorf("resolving %s: %w", path, err)
	}
	p := filepath.Join(dir, filepath.Base(path))
	if t, err := os.Readlink(p); err == nil {
		if !filepath.IsAbs(t) {
			t = filepath.Join(dir, t)
		}
		return filepath.Clean(t), nil
	}
	return p, nil
}

// readSnapshot reads path (through its symlinks) with its identity. A file
// that changes while it is read is read again.
func readSnapshot(path string) (snapshot, error) {
	rp, err := resolve(path)
	if err != nil {
		return snapshot{}, err
	}
	for range casAttempts {
		s, err := readAt(rp)
		if !errors.Is(err, errChanged) {
			s.name = path
			return s, err
		}
	}
	return snapshot{}, fmt.Errorf("reading %s: %w %d times in a row", path, errChanged, casAttempts)
}

func readAt(path string) (snapshot, error) {
	s := snapshot{name: path, path: path}
	// Non-blocking, so a FIFO planted under a config's name cannot hang
	// the agent (regular files ignore the flag).
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return s, nil
	}
	if err != nil {
		return s, fmt.Errorf("reading %s: %w", path, err)
	}
	defer f.Close()
	var before, after unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &before); err != nil {
		return s, fmt.Errorf("reading %s: %w", path, err)
	}
	if before.Mode&unix.S_IFMT != unix.S_IFREG {
		return s, fmt.Errorf("reading %s: not a regular file", path)
	}
	data, err := io.ReadAll(f)
	if err != nil {
		return s, fmt.Errorf("reading %s: %w", path, err)
	}
	if err := unix.Fstat(int(f.Fd()), &after); err != nil {
		return s, fmt.Errorf("reading %s: %w", path, err)
	}
	if before.Size != after.Size || before.Mtim != after.Mtim || int64(len(data)) != after.Size {
		return s, errChanged
	}
	s.exists, s.data, s.sum = true, data, sum(data)
	s.dev, s.ino, s.size, s.mtime = after.Dev, after.Ino, after.Size, syscall.Timespec(after.Mtim)
	s.mode, s.uid, s.gid = fs.FileMode(after.Mode).Perm(), int(after.Uid), int(after.Gid)
	return s, nil
}

// same reports whether two snapshots are one version of one file: same
// inode, size, modification time and content.
func (s snapshot) same(o snapshot) bool {
	if s.exists != o.exists {
		return false
	}
	return !s.exists || s.dev == o.dev && s.ino == o.ino && s.size == o.size && s.mtime == o.mtime && s.sum == o.sum
}

// unchanged reads base's file again: errChanged unless it still is base.
// It is the final check before a swap.
func unchanged(base snapshot) error {
	cur, err := readAt(base.path)
	if err == nil && !cur.same(base) {
		err = errChanged
	}
	if err == nil && beforeSwap != nil {
		beforeSwap(base.path)
	}
	return err
}

// replaceIfUnchanged replaces the file base was read from with data (mode
// and owner as given), only while it still is base; otherwise it returns
// errChanged and the file holds whatever the other writer put there.
//
// The check and the rename cannot be one step, so the rename is an
// exchange: the replaced file comes out under the temp name, and when it is
// not base after all (the primary wrote in the instant between), it goes
// back. Filesystems without RENAME_EXCHANGE get a plain rename after the
// check, which leaves that instant open.
func replaceIfUnchanged(base snapshot, data []byte, mode fs.FileMode, uid, gid int) error {
	tmp, err := atomicfile.WriteTemp(base.path, data, mode, atomicfile.Options{Sync: true, Chown: true, UID: uid, GID: gid})
	if err != nil {
		return fmt.Errorf("writing %s: %w", base.path, err)
	}
	ok := false
	defer func() {
		if !ok {
			os.Remove(tmp)
		}
	}()
	var ours unix.Stat_t
	if err := unix.Lstat(tmp, &ours); err != nil {
		return fmt.Errorf("writing %s: %w", base.path, err)
	}
	if err := unchanged(base); err != nil {
		return err
	}
	flags, raced := uint(unix.RENAME_EXCHANGE), unix.ENOENT // removed since the check
	if !base.exists {
		// Nothing to displace: only create, never replace.
		flags, raced = unix.RENAME_NOREPLACE, unix.EEXIST
	}
	err = unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, base.path, flags)
	if errors.Is(err, raced) {
		return errChanged
	}
	exchanged := err == nil && base.exists
	if noRenameFlags(err) {
		err = os.Rename(tmp, base.path)
	}
	if err != nil {
		return fmt.Errorf("writing %s: %w", base.path, err)
	}
	if !exchanged {
		ok = true
		atomicfile.SyncDir(base.path)
		return nil
	}
	// tmp now names what was at base.path a moment ago.
	out, err := readAt(tmp)
	if err == nil && out.same(base) {
		atomicfile.SyncDir(base.path) // ok stays false: the old file goes
		return nil
	}
	putBack(tmp, base.path, ours)
	return errChanged
}

// putBack returns a newer version of the primary's file, which an exchange
// took out as tmp, to path, and removes our file, which is at path unless
// the primary replaced it too. When the primary did, the version now at
// path is newer still and stays.
func putBack(tmp, path string, ours unix.Stat_t) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil || st.Dev != ours.Dev || st.Ino != ours.Ino {
		os.Remove(tmp)
		return
	}
	if err := unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, path, unix.RENAME_EXCHANGE); err != nil {
		os.Remove(tmp)
		return
	}
	// tmp is our file again, unless the primary replaced it in between;
	// then the newer file came out and goes back in once more.
	if err := unix.Lstat(tmp, &st); err == nil && (st.Dev != ours.Dev || st.Ino != ours.Ino) {
		_ = unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, path, unix.RENAME_EXCHANGE)
	}
	os.Remove(tmp)
}

// removeIfUnchanged removes the directory entry base was read through (a
// symlink itself, not its target), only while the file still is base: the
// entry is first moved aside, and a newer version goes back unless the
// primary has already written another one.
func removeIfUnchanged(base snapshot) error {
	if !base.exists {
		return nil
	}
	name := base.name
	tmp, err := tempName(name)
	if err != nil {
		return err
	}
	if err := unchanged(base); err != nil {
		return err
	}
	if err := unix.Renameat2(unix.AT_FDCWD, name, unix.AT_FDCWD, tmp, unix.RENAME_NOREPLACE); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		if !noRenameFlags(err) {
			return fmt.Errorf("removing %s: %w", name, err)
		}
		if err := os.Remove(name); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("removing %s: %w", name, err)
		}
		atomicfile.SyncDir(name)
		return nil
	}
	out, err := readAt(tmp)
	if err == nil && out.same(base) {
		if err := os.Remove(tmp); err != nil {
			return fmt.Errorf("removing %s: %w", name, err)
		}
		atomicfile.SyncDir(name)
		return nil
	}
	// A newer version: back it goes, unless an even newer one is there.
	if err := unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, name, unix.RENAME_NOREPLACE); err != nil {
		os.Remove(tmp)
	}
	return errChanged
}

// tempName returns an unused temp file name next to path (reserved by
// creating it, then freed, so a rename can take it).
func tempName(path string) (string, error) {
	f, err := os.CreateTemp(filepath.Dir(path), atomicfile.TempPrefix+filepath.Base(path)+"-*"+atomicfile.TempSuffix)
	if err != nil {
		return "", fmt.Errorf("creating a temp file next to %s: %w", path, err)
	}
	name := f.Name()
	f.Close()
	if err := os.Remove(name); err != nil {
		return "", fmt.Errorf("creating a temp file next to %s: %w", path, err)
	}
	return name, nil
}

// noRenameFlags reports a filesystem that does not support renameat2's
// flags (some overlay and network filesystems).
func noRenameFlags(err error) bool {
	return errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EOPNOTSUPP)
}

// writeFileAtomic replaces path with data durably; uid/gid >= 0 are applied
// too, so a rewritten file keeps its owner.
func writeFileAtomic(path string, data []byte, mode fs.FileMode, uid, gid int) error {
	return atomicfile.Write(path, data, mode, atomicfile.Options{Sync: true, Chown: true, UID: uid, GID: gid})
}

// fileOwner returns a file's mode and owner, or defaults when it does not exist.
func fileOwner(path string, def fs.FileMode) (fs.FileMode, int, int) {
	fi, err := os.Stat(path)
	if err != nil {
		return def, -1, -1
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return fi.Mode().Perm(), int(st.Uid), int(st.Gid)
	}
	return fi.Mode().Perm(), -1, -1
}
