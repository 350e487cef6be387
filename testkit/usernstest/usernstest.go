// Package usernstest makes network namespaces owned by a fresh user
// namespace, as a container runtime does for a Kubernetes pod with
// hostUsers: false: a holder process is started with CLONE_NEWUSER and
// CLONE_NEWNET and in-namespace IDs 0..Size-1 mapped to a host range, and its
// network namespace is bind-mounted under /run/netns so backends reach it by
// path. It is a test helper (it starts a process) imported only by tests.
package usernstest

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/nftmesh/nftmesh/internal/hostns"
)

// Size is how many IDs the user namespace maps (0..65535 inside, as the
// kubelet gives a pod).
const Size = 65536

// Netns is a network namespace owned by its own user namespace, with a
// holder process living in both.
type Netns struct {
	// Path is the bind mount under /run/netns.
	Path string
	// UIDBase / GIDBase are the host IDs in-namespace 0 maps to.
	UIDBase, GIDBase uint32
	holder           *exec.Cmd
}

// New is NewAt with a fresh path /run/netns/<prefix><random>.
func New(prefix string, base uint32) (*Netns, error) {
	var rnd [4]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return nil, fmt.Errorf("choosing a netns name: %w", err)
	}
	return NewAt(filepath.Join("/run/netns", prefix+hex.EncodeToString(rnd[:])), base)
}

// NewAt starts the holder (`sleep`, in a new user and network namespace
// with in-namespace IDs 0..Size-1 mapped to base..base+Size-1 on the host,
// UIDs and GIDs alike), bind-mounts its network namespace at path (which must
// not exist) and sets lo up there from the host (as the CNI loopback plugin
// does). The caller closes it. Needs root.
func NewAt(path string, base uint32) (_ *Netns, err error) {
	if err := prepareMount(path); err != nil {
		return nil, err
	}
	n := &Netns{Path: path, UIDBase: base, GIDBase: base}
	defer func() {
		if err != nil {
			err = errors.Join(err, n.Close())
		}
	}()
	cmd := exec.Command("sleep", "infinity")
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  syscall.CLONE_NEWUSER | syscall.CLONE_NEWNET,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(base), Size: Size}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(base), Size: Size}},
		// As container runtimes allow it: processes of the pod may set
		// their groups (nsenter -G does).
		GidMappingsEnableSetgroups: true,
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting the user-namespaced holder: %w", err)
	}
	n.holder = cmd
	src := "/proc/" + strconv.Itoa(cmd.Process.Pid) + "/ns/net"
	if err := unix.Mount(src, path, "", unix.MS_BIND, ""); err != nil {
		return nil, fmt.Errorf("bind-mounting %s at %s: %w", src, path, err)
	}
	ns, err := hostns.Open(path)
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", path, err)
	}
	defer ns.Close()
	// netlink's package-level calls open their socket on the calling
	// thread: inside Do, the namespace's.
	if err := ns.Do(func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return fmt.Errorf("finding lo in %s: %w", path, err)
		}
		if err := netlink.LinkSetUp(lo); err != nil {
			return fmt.Errorf("setting lo up in %s: %w", path, err)
		}
		return nil
	}); err != nil {
		return nil, err
	}
	return n, nil
}

// prepareMount creates the empty file a namespace is bind-mounted on.
func prepareMount(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", filepath.Dir(path), err)
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o444)
	if err != nil {
		return fmt.Errorf("creating mount point %s: %w", path, err)
	}
	return f.Close()
}

// PID is the holder's PID: a process whose /proc/PID/ns/net is the
// namespace, as a pod's processes are.
func (n *Netns) PID() int { return n.holder.Process.Pid }

// HostUID is the host (kernel) UID of in-namespace uid.
func (n *Netns) HostUID(uid uint32) uint32 { return n.UIDBase + uid }

// HostGID is the host (kernel) GID of in-namespace gid.
func (n *Netns) HostGID(gid uint32) uint32 { return n.GIDBase + gid }

// Close stops the holder and removes the bind mount (the namespaces go when
// nothing else holds them). Safe more than once.
func (n *Netns) Close() error {
	var errs []error
	if n.holder != nil {
		_ = n.holder.Process.Kill()
		_ = n.holder.Wait()
		n.holder = nil
	}
	if n.Path != "" {
		if err := unix.Unmount(n.Path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("unmounting %s: %w", n.Path, err))
		}
		if err := os.Remove(n.Path); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("removing %s: %w", n.Path, err))
		}
		n.Path = ""
	}
	return errors.Join(errs...)
}
