package installer

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// Temp files are hidden and end in .tmp, so no runtime ever loads one as a
// config (it reads only .conf/.conflist/.json) and a crash leaves
// leftovers that removeLeftovers recognises.
const (
	tmpPrefix = ".nftmesh-"
	tmpSuffix = ".tmp"
)

// writeFileAtomic replaces path with data: a temp file in the same dir,
// fsync, chmod to mode (umask does not apply), then rename. uid/gid >= 0
// are applied too, so a rewritten file keeps its owner.
func writeFileAtomic(path string, data []byte, mode fs.FileMode, uid, gid int) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, tmpPrefix+filepath.Base(path)+"-*"+tmpSuffix)
	if err != nil {
		return err
	}
	tmp := f.Name()
	ok := false
	defer func() {
		if !ok {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if _, err := f.Write(data); err != nil {
		return err
	}
	if err := f.Chmod(mode.Perm()); err != nil {
		return err
	}
	if uid >= 0 || gid >= 0 {
		if err := f.Chown(uid, gid); err != nil && !errors.Is(err, syscall.EPERM) {
			return err
		}
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	ok = true
	// The rename is durable only once the directory is synced.
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
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

// removeLeftovers deletes temp files an interrupted write of ours left in dir.
func removeLeftovers(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("listing %s for leftovers: %w", dir, err)
	}
	var errs []error
	for _, e := range entries {
		n := e.Name()
		if strings.HasPrefix(n, tmpPrefix) && strings.HasSuffix(n, tmpSuffix) && e.Type().IsRegular() {
			if err := os.Remove(filepath.Join(dir, n)); err != nil && !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, fmt.Errorf("removing leftover %s: %w", n, err))
			}
		}
	}
	return errors.Join(errs...)
}

func isOurTemp(name string) bool {
	name = filepath.Base(name)
	return strings.HasPrefix(name, tmpPrefix) && strings.HasSuffix(name, tmpSuffix)
}
