package installer

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/nftmesh/nftmesh/installer/conflist"
	"github.com/nftmesh/nftmesh/internal/atomicfile"
	"github.com/nftmesh/nftmesh/redirect/quote"
)

// The undo record keeps what cleanup needs to give back every config file
// the agent rewrote: the primary's own bytes, mode, owner, name and link.
// It lives in the CNI conf dir itself, in a directory no runtime loads
// (libcni, and so containerd, CRI-O and Multus, read only .conf, .conflist
// and .json files at the top of the dir; the one subdirectory libcni reads
// is named after a network, which cannot start with a dot, and from it only
// .conf files). So the record is exactly as persistent as the files it
// undoes: a conf dir that survives a reboot keeps both, one on tmpfs loses
// both, and no new host path is needed on any platform.
const (
	UndoDirName  = ".nftmesh"
	UndoFileName = "undo.json"
)

// undoVersion is the record's format; a record of another version is
// refused rather than misread.
const undoVersion = 1

// maxUndoSize bounds what is read as a record: a few copies of CNI configs
// are kilobytes.
const maxUndoSize = 16 << 20

// undoFile is the record as stored: names are relative to the conf dir, so
// the record stays right wherever the conf dir is mounted.
type undoFile struct {
	Version int          `json:"version"`
	Confs   []confRecord `json:"confs"`
}

// undoStore reads and writes the record of one conf dir. Every open is
// relative to the record's directory, opened without following a link, so
// a link planted as the directory or the file is refused, never followed.
type undoStore struct{ confDir string }

func (u undoStore) dir() string  { return filepath.Join(u.confDir, UndoDirName) }
func (u undoStore) path() string { return filepath.Join(u.dir(), UndoFileName) }

// load reads the record; a missing one is an empty state.
func (u undoStore) load() (agentState, error) {
	dfd, err := u.openDir(false)
	if errors.Is(err, unix.ENOENT) {
		return agentState{}, nil
	}
	if err != nil {
		return agentState{}, err
	}
	defer unix.Close(dfd)
	b, err := readNoFollow(dfd, UndoFileName, u.path())
	if errors.Is(err, unix.ENOENT) {
		return agentState{}, nil
	}
	if err != nil {
		return agentState{}, err
	}
	return decodeUndo(u.confDir, b)
}

// save makes s the record, durably (file and directory synced) before it
// returns: callers change a config only after this. An empty state removes
// the record and its directory.
func (u undoStore) save(s agentState) error {
	if len(s.Confs) == 0 {
		return u.remove()
	}
	b, err := encodeUndo(u.confDir, s)
	if err != nil {
		return err
	}
	dfd, err := u.openDir(true)
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	if err := writeAt(dfd, UndoFileName, u.path(), b); err != nil {
		return fmt.Errorf("writing the undo record %s: %w", u.path(), err)
	}
	return nil
}

// remove deletes the record, then its directory if nothing else is in it.
func (u undoStore) remove() error {
	dfd, err := u.openDir(false)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return err
	}
	if beforeSwap != nil {
		beforeSwap(u.path())
	}
	err = unix.Unlinkat(dfd, UndoFileName, 0)
	if err == nil {
		_ = unix.Fsync(dfd)
	}
	unix.Close(dfd)
	if err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("removing the undo record %s: %w", u.path(), err)
	}
	// rmdir never follows a link; a directory someone else put a file in
	// stays.
	if err := unix.Rmdir(u.dir()); err == nil {
		atomicfile.SyncDir(u.dir())
	}
	return nil
}

// openDir opens the record's directory, refusing a link or a file in its
// place and a directory another user owns. With create it is made first:
// 0700, as it holds copies of configs that may be private.
func (u undoStore) openDir(create bool) (int, error) {
	d := u.dir()
	if create {
		if err := unix.Mkdir(d, 0o700); err == nil {
			atomicfile.SyncDir(d) // the new entry in the conf dir
		} else if !errors.Is(err, unix.EEXIST) {
			return -1, fmt.Errorf("creating the undo record's directory %s: %w", d, err)
		}
	}
	fd, err := unix.Open(d, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	switch {
	case errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR):
		return -1, fmt.Errorf("refusing the undo record's directory %s: not a directory (a link or a file is in its place; remove it): %w", d, err)
	case errors.Is(err, unix.ENOENT):
		return -1, err
	case err != nil:
		return -1, fmt.Errorf("opening the undo record's directory %s: %w", d, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("opening the undo record's directory %s: %w", d, err)
	}
	if int(st.Uid) != os.Geteuid() {
		unix.Close(fd)
		return -1, fmt.Errorf("refusing the undo record's directory %s: owned by uid %d, not by the agent (uid %d)", d, st.Uid, os.Geteuid())
	}
	if st.Mode&0o077 != 0 {
		if err := unix.Fchmod(fd, 0o700); err != nil {
			unix.Close(fd)
			return -1, fmt.Errorf("making the undo record's directory %s private: %w", d, err)
		}
	}
	return fd, nil
}

// writeAt replaces name in the directory dfd with data: a new temp file
// (never through a link), synced, renamed over name, and the directory
// synced. display names the file in errors and for beforeSwap.
func writeAt(dfd int, name, display string, data []byte) error {
	tmp := fmt.Sprintf("%s%s-%016x%s", atomicfile.TempPrefix, name, rand.Uint64(), atomicfile.TempSuffix)
	fd, err := unix.Openat(dfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), display)
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(0o600)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil && beforeSwap != nil {
		beforeSwap(display)
	}
	if err == nil {
		err = unix.Renameat(dfd, tmp, dfd, name)
	}
	if err != nil {
		_ = unix.Unlinkat(dfd, tmp, 0)
		return err
	}
	return unix.Fsync(dfd)
}

// readNoFollow reads name in the directory dfd (unix.AT_FDCWD for a path),
// refusing a link, anything but a regular file, and more than maxUndoSize.
// A missing file is unix.ENOENT.
func readNoFollow(dfd int, name, display string) ([]byte, error) {
	fd, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	switch {
	case errors.Is(err, unix.ENOENT):
		return nil, err
	case errors.Is(err, unix.ELOOP):
		return nil, fmt.Errorf("refusing %s: a symbolic link (not followed)", display)
	case err != nil:
		return nil, fmt.Errorf("reading %s: %w", display, err)
	}
	f := os.NewFile(uintptr(fd), display)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("reading %s: %w", display, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, fmt.Errorf("refusing %s: not a regular file", display)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxUndoSize+1))
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", display, err)
	}
	if len(b) > maxUndoSize {
		return nil, fmt.Errorf("refusing %s: larger than %d bytes", display, maxUndoSize)
	}
	return b, nil
}

// encodeUndo is s as stored for the conf dir confDir.
func encodeUndo(confDir string, s agentState) ([]byte, error) {
	f := undoFile{Version: undoVersion}
	for _, r := range s.Confs {
		if filepath.Dir(r.Written) != confDir || filepath.Dir(r.Original) != confDir {
			return nil, fmt.Errorf("encoding the undo record: %s or %s is not in the CNI conf dir %s", r.Written, r.Original, confDir)
		}
		r.Written, r.Original = filepath.Base(r.Written), filepath.Base(r.Original)
		f.Confs = append(f.Confs, r)
	}
	b, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encoding the undo record: %w", err)
	}
	return append(b, '\n'), nil
}

// decodeUndo parses a stored record of the conf dir confDir, checking each
// field, since cleanup writes what it says into the conf dir as root.
func decodeUndo(confDir string, b []byte) (agentState, error) {
	var f undoFile
	if err := json.Unmarshal(b, &f); err != nil {
		return agentState{}, fmt.Errorf("parsing the undo record: %w", err)
	}
	if f.Version != undoVersion {
		return agentState{}, fmt.Errorf("undo record: version %d is not %d, the one this agent reads", f.Version, undoVersion)
	}
	var s agentState
	for i, r := range f.Confs {
		if err := checkRecord(r); err != nil {
			return agentState{}, fmt.Errorf("undo record: confs[%d].%w", i, err)
		}
		r.Written, r.Original = filepath.Join(confDir, r.Written), filepath.Join(confDir, r.Original)
		if s.record(r.Written) != nil {
			return agentState{}, fmt.Errorf("undo record: confs[%d].written: %s appears twice", i, quoteBounded(filepath.Base(r.Written)))
		}
		s.Confs = append(s.Confs, r)
	}
	return s, nil
}

// checkRecord checks one stored record (names relative to the conf dir);
// the error starts with the field's name.
func checkRecord(r confRecord) error {
	switch {
	case !isConfName(r.Written) || !conflist.IsList(r.Written):
		return fmt.Errorf("written: %s is not the name of a .conflist file in the CNI conf dir", quoteBounded(r.Written))
	case !isConfName(r.Original) || !slices.Contains(conflist.ConfExtensions, filepath.Ext(r.Original)):
		return fmt.Errorf("original: %s is not the name of a CNI config file in the CNI conf dir", quoteBounded(r.Original))
	case r.Original != r.Written && conflist.ListPath(r.Original) != r.Written:
		return fmt.Errorf("original: %s is not what %s was written from", quoteBounded(r.Original), quoteBounded(r.Written))
	case !isSHA256(r.WrittenSum):
		return fmt.Errorf("written_sha256: %s is not a SHA-256 in hex", quoteBounded(r.WrittenSum))
	case !json.Valid(r.OriginalBytes):
		return fmt.Errorf("original_bytes: %d bytes that are not a JSON document", len(r.OriginalBytes))
	case r.OriginalMode&^0o777 != 0:
		return fmt.Errorf("original_mode: %#o is not a file's permission bits", uint32(r.OriginalMode))
	case r.OriginalUID < 0 || int64(r.OriginalUID) >= math.MaxUint32:
		return fmt.Errorf("original_uid: %d is not a user id", r.OriginalUID)
	case r.OriginalGID < 0 || int64(r.OriginalGID) >= math.MaxUint32:
		return fmt.Errorf("original_gid: %d is not a group id", r.OriginalGID)
	case r.OriginalLink != "" && (r.Original == r.Written || len(r.OriginalLink) > unix.PathMax || strings.ContainsRune(r.OriginalLink, 0)):
		return fmt.Errorf("original_link: %s is not the link a converted config was", quoteBounded(r.OriginalLink))
	}
	return nil
}

// isConfName reports a plain file name: no directory, not . or .., not one
// of our temp files.
func isConfName(n string) bool {
	return n != "" && n != "." && n != ".." && !strings.ContainsAny(n, "/\x00") && !atomicfile.IsTemp(n)
}

func isSHA256(s string) bool {
	b, err := hex.DecodeString(s)
	return err == nil && len(b) == 32 && strings.ToLower(s) == s
}

// quoteBounded quotes a value from a record for an error, cut to 64 bytes.
func quoteBounded(s string) string { return quote.ValueN(s, 64) }
