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

// Write replaces path with data: a temp file in the same dir (WriteTemp),
// then rename.
func Write(path string, data []byte, mode fs.FileMode, o Options) error {
	tmp, err := WriteTemp(path, data, mode, o)
	if err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return err
	}
	if o.Sync {
		SyncDir(path)
	}
	return nil
}

// WriteTemp writes data into a new temp file next to path, chmod to mode
// (umask does not apply), with the optional chown and fsync, and returns
// its name; on error nothing is left behind. The caller renames it.
func WriteTemp(path string, data []byte, mode fs.FileMode, o Options) (string, error) {
	f, err := os.CreateTemp(filepath.Dir(path), TempPrefix+filepath.Base(path)+"-*"+TempSuffix)
	if err != nil {
		return "", err
	}
	err = func() error {
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
			return f.Sync()
		}
		return nil
	}()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(f.Name())
		return "", err
	}
	return f.Name(), nil
}

// SyncDir makes a rename in path's directory durable.
func SyncDir(path string) {
	if d, err := os.Open(filepath.Dir(path)); err == nil {
		_ = d.Sync()
		d.Close()
	}
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
