package netlab

import (
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/nftmesh/nftmesh/internal/hostns"
)

// creds is a thread identity: the owner UID/GID netfilter's skuid/skgid
// (iptables' owner match) see for sockets the thread creates.
type creds struct{ uid, gid uint32 }

// inNetns runs fn on an OS thread switched into the network namespace at
// nsPath by internal/hostns (the one door into a namespace), so sockets fn
// creates stay there. With c set, the thread first drops to that identity
// with the raw setgroups/setresgid/setresuid calls, which act on this
// thread only (Go's syscall.Setuid acts on every thread). Such a thread may
// lack the privilege to switch back and must not lend its identity to
// other goroutines, so it dies when fn returns (hostns.Netns.DoDiscard).
func inNetns(nsPath string, c *creds, fn func() error) error {
	n, err := hostns.Open(nsPath)
	if err != nil {
		return fmt.Errorf("opening network namespace %s: %w", nsPath, err)
	}
	defer n.Close()
	if c == nil {
		return n.Do(fn)
	}
	return n.DoDiscard(func() error {
		if err := setThreadCreds(c.uid, c.gid); err != nil {
			return err
		}
		return fn()
	})
}

// setThreadCreds sets the calling thread's (not the process's) groups, GID
// and UID. The GID goes first, while the thread still has CAP_SETGID.
func setThreadCreds(uid, gid uint32) error {
	if _, _, e := unix.RawSyscall(unix.SYS_SETGROUPS, 0, 0, 0); e != 0 {
		return fmt.Errorf("clearing supplementary groups of the probe thread: %w", e)
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, uintptr(gid), uintptr(gid), uintptr(gid)); e != 0 {
		return fmt.Errorf("setting GID %d on the probe thread: %w", gid, e)
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, uintptr(uid), uintptr(uid), uintptr(uid)); e != 0 {
		return fmt.Errorf("setting UID %d on the probe thread: %w", uid, e)
	}
	return nil
}

// Do runs fn on an OS thread switched into the network namespace at nsPath
// (ns.Do semantics): sockets and processes fn creates live there.
func Do(nsPath string, fn func() error) error { return inNetns(nsPath, nil, fn) }
