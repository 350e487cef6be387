package installer

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"github.com/nftmesh/nftmesh/internal/atomicfile"
)

// ReadOnlyError is a bin dir the agent cannot write: the node keeps its CNI
// plugins elsewhere, so the chart value must point there.
type ReadOnlyError struct {
	Dir    string
	Binary string // the file being written when the error came
	Err    error
}

func (e *ReadOnlyError) Error() string {
	return fmt.Sprintf("installing %s into %s: the directory is read-only (%v); set the chart value cniBinDir "+
		"(agent flag --cni-bin-dir) to the node's writable CNI bin dir, or install with the chart value platform "+
		"(gke: /home/kubernetes/bin, openshift: /var/lib/cni/bin, k3s, k3d, microk8s, minikube, eks, aks)",
		e.Binary, e.Dir, e.Err)
}

func (e *ReadOnlyError) Unwrap() error { return e.Err }

// binarySource is one binary to install under name, fingerprinted once.
type binarySource struct {
	name string // the file name in every bin dir
	path string
	size int64
	sum  [sha256.Size]byte
}

// binarySources are the binaries the agent installs, in install order: the
// companion first, as the front execs it from its own directory whenever
// the agent is not there, so a front must never land in a bin dir before
// the companion it runs. Removal goes the other way.
func binarySources(pluginBinary string) ([]*binarySource, error) {
	front, err := newBinarySource(pluginBinary, PluginName)
	if err != nil {
		return nil, &ConfigError{Flag: "plugin-binary", Value: pluginBinary, Reason: err.Error()}
	}
	companion := filepath.Join(filepath.Dir(pluginBinary), StandaloneName)
	standalone, err := newBinarySource(companion, StandaloneName)
	if err != nil {
		return nil, &ConfigError{Flag: "plugin-binary", Value: pluginBinary,
			Reason: fmt.Sprintf("its companion %s must be in the same directory: %v", companion, err)}
	}
	return []*binarySource{standalone, front}, nil
}

func newBinarySource(path, name string) (*binarySource, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("opening the %s binary: %w", name, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("reading the %s binary %s: %w", name, path, err)
	}
	if !fi.Mode().IsRegular() || fi.Size() == 0 {
		return nil, fmt.Errorf("the %s binary %s is not a non-empty regular file", name, path)
	}
	s := &binarySource{name: name, path: path}
	if s.sum, s.size, err = hashFile(f); err != nil {
		return nil, fmt.Errorf("reading the %s binary %s: %w", name, path, err)
	}
	return s, nil
}

func hashFile(f *os.File) (sum [sha256.Size]byte, n int64, err error) {
	h := sha256.New()
	n, err = io.Copy(h, f)
	copy(sum[:], h.Sum(nil))
	return sum, n, err
}

// installed reports whether dir holds an identical, executable copy.
func (s *binarySource) installed(dir string) bool {
	if s.looksInstalled(dir) != nil {
		return false
	}
	f, err := os.Open(filepath.Join(dir, s.name))
	if err != nil {
		return false
	}
	defer f.Close()
	sum, _, err := hashFile(f)
	return err == nil && sum == s.sum
}

// looksInstalled is the cheap check readiness uses: right size and mode.
func (s *binarySource) looksInstalled(dir string) error {
	dst := filepath.Join(dir, s.name)
	fi, err := os.Stat(dst)
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() || fi.Size() != s.size || fi.Mode().Perm() != 0o755 {
		return fmt.Errorf("%s is not the %d-byte executable we install (mode %v, %d bytes)", dst, s.size, fi.Mode(), fi.Size())
	}
	return nil
}

// install copies the binary into dir atomically unless an identical copy is
// there; it reports whether it wrote.
func (s *binarySource) install(dir string) (bool, error) {
	if s.installed(dir) {
		return false, nil
	}
	if err := atomicfile.RemoveLeftovers(dir); err != nil {
		return false, s.wrapReadOnly(dir, err)
	}
	src, err := os.Open(s.path)
	if err != nil {
		return false, fmt.Errorf("opening the %s binary: %w", s.name, err)
	}
	defer src.Close()
	tmp, err := os.CreateTemp(dir, atomicfile.TempPrefix+s.name+"-*"+atomicfile.TempSuffix)
	if err != nil {
		return false, s.wrapReadOnly(dir, fmt.Errorf("creating temp file in %s: %w", dir, err))
	}
	done := false
	defer func() {
		if !done {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(tmp, h), src)
	if err != nil {
		return false, fmt.Errorf("copying %s into %s: %w", s.path, dir, err)
	}
	if n != s.size || [sha256.Size]byte(h.Sum(nil)) != s.sum {
		return false, fmt.Errorf("copying %s into %s: the source changed while the agent runs", s.path, dir)
	}
	if err := tmp.Chmod(0o755); err != nil {
		return false, fmt.Errorf("making %s executable: %w", tmp.Name(), err)
	}
	if err := tmp.Sync(); err != nil {
		return false, fmt.Errorf("syncing %s: %w", tmp.Name(), err)
	}
	if err := tmp.Close(); err != nil {
		return false, fmt.Errorf("closing %s: %w", tmp.Name(), err)
	}
	// rename over a running binary is safe: processes keep the old inode.
	if err := os.Rename(tmp.Name(), filepath.Join(dir, s.name)); err != nil {
		return false, s.wrapReadOnly(dir, fmt.Errorf("renaming %s into %s: %w", s.name, dir, err))
	}
	done = true
	return true, nil
}

func (s *binarySource) wrapReadOnly(dir string, err error) error {
	if errors.Is(err, syscall.EROFS) {
		return &ReadOnlyError{Dir: dir, Binary: s.name, Err: err}
	}
	return err
}

// remove deletes the binary from dir; missing is fine.
func (s *binarySource) remove(dir string) error {
	err := os.Remove(filepath.Join(dir, s.name))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing %s from %s: %w", s.name, dir, err)
	}
	return nil
}
