package cnisock

import (
	"encoding/json"
	"fmt"
	"os"
	"path"
	"syscall"
)

// DefaultRunDir is agent_run_dir when a config names none (the plugin
// config's default; a test keeps the two equal).
const DefaultRunDir = "/var/run/nftmesh"

// RunDir finds the agent_run_dir of a plugin config as the plugin reads it
// (podinfo/cniconf): "agent_run_dir", else Istio's "cni_agent_run_dir",
// else DefaultRunDir. ok is false when config is not a JSON object or the
// value is not an absolute path string: the plugin then reports the
// config's problem itself. The agent declines a call whose config names
// another run dir, so a misreading costs speed, never correctness.
func RunDir(config []byte) (dir string, ok bool) {
	var c struct {
		Ours  *string `json:"agent_run_dir"`
		Istio *string `json:"cni_agent_run_dir"`
	}
	if err := json.Unmarshal(config, &c); err != nil {
		return "", false
	}
	v := c.Istio
	if c.Ours != nil {
		v = c.Ours
	}
	if v == nil || *v == "" {
		return DefaultRunDir, true
	}
	if !path.IsAbs(*v) {
		return "", false
	}
	return path.Clean(*v), true
}

// OpenFile opens the file at name, one the plugin and the agent share in
// the run dir, as os.OpenFile does with flag and perm, and refuses
// anything there but a regular file of one link: a symlink (not followed),
// a FIFO, a device or a socket (not opened: an open may block or act), a
// hard link to a file elsewhere. Both run as root: a link planted in the
// run dir must not turn the plugin's log writes, or the agent's reads,
// which it re-emits in its own log, on another file. The refusal is a
// *RefusedError.
func OpenFile(name string, flag int, perm os.FileMode) (*os.File, error) {
	if st, err := os.Lstat(name); err == nil && !st.Mode().IsRegular() {
		return nil, &RefusedError{Path: name, Kind: kindOf(st.Mode())}
	}
	// Whatever took its place since is checked on the descriptor.
	f, err := os.OpenFile(name, flag|syscall.O_NOFOLLOW|syscall.O_NONBLOCK|syscall.O_CLOEXEC, perm)
	if err != nil {
		if st, lerr := os.Lstat(name); lerr == nil && !st.Mode().IsRegular() {
			return nil, &RefusedError{Path: name, Kind: kindOf(st.Mode())}
		}
		return nil, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	kind := ""
	if sys, ok := st.Sys().(*syscall.Stat_t); !st.Mode().IsRegular() {
		kind = kindOf(st.Mode())
	} else if !ok || sys.Nlink != 1 {
		kind = "hard link (a file with more than one name)"
	}
	if kind != "" {
		f.Close()
		return nil, &RefusedError{Path: name, Kind: kind}
	}
	return f, nil
}

// RefusedError is OpenFile's refusal of what is not a regular file of its
// own.
type RefusedError struct {
	Path string
	Kind string // "symlink", "FIFO", ...
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("refusing %s in the run dir: it is a %s, not a regular file of its own (a link placed there would redirect root's reads or writes)", e.Path, e.Kind)
}

func kindOf(m os.FileMode) string {
	switch {
	case m&os.ModeSymlink != 0:
		return "symlink"
	case m&os.ModeNamedPipe != 0:
		return "FIFO"
	case m&os.ModeSocket != 0:
		return "socket"
	case m&os.ModeDevice != 0:
		return "device"
	case m.IsDir():
		return "directory"
	}
	return "file of mode " + m.String()
}
