// Package atomicfile replaces files so that a concurrent reader (kubelet,
// a container runtime, another plugin run) sees the old content or the new,
// never a part, and an interrupted write leaves only a temp file that
// RemoveLeftovers recognises.
package atomicfile

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
// CNI config (it reads only .conf/.conflist/.json).
const (
	TempPrefix = ".nftmesh-"
	TempSuffix = ".tmp"
)

// Options of Write.
type Options struct {
	// Sync makes the new content durable (fsync of file and directory)
	// before Write returns. Files on tmpfs or caches need not.
	Sync bool
	// Chown sets UID and GID (each when >= 0) on the new file, so a
	// rewritten file keeps its owner. Without the permission it is skipped.
	Chown    bool
	UID, GID int
}

// Write replaces path with data: a temp file in the same dir, chmod to mode
// (umask does not apply), optional chown and fsync, then rename.
func Write(path string, data []byte, mode fs.FileMode, o Options) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, TempPrefix+filepath.Base(path)+"-*"+TempSuffix)
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
	if o.Chown && (o.UID >= 0 || o.GID >= 0) {
		if err := f.Chown(o.UID, o.GID); err != nil && !errors.Is(err, syscall.EPERM) {
			return err
		}
	}
	if o.Sync {
		if err := f.Sync(); err != nil {
			return err
		}
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	ok = true
	if o.Sync {
		// The rename is durable only once the directory is synced.
		if d, err := os.Open(dir); err == nil {
			_ = d.Sync()
			d.Close()
		}
	}
	return nil
}

// IsTemp reports whether name (a path or base name) is one of our temp files.
func IsTemp(name string) bool {
	name = filepath.Base(name)
	return strings.HasPrefix(name, TempPrefix) && strings.HasSuffix(name, TempSuffix)
}

// RemoveLeftovers deletes temp files an interrupted Write left in dir.
func RemoveLeftovers(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("listing %s for leftovers: %w", dir, err)
	}
	var errs []error
	for _, e := range entries {
		if IsTemp(e.Name()) && e.Type().IsRegular() {
			if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, fmt.Errorf("removing leftover %s: %w", e.Name(), err))
			}
		}
	}
	return errors.Join(errs...)
}
