package netlab

import (
	"errors"
	"fmt"
	"runtime"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// creds is a thread identity: the owner UID/GID netfilter's skuid/skgid
// (iptables' owner match) see for sockets the thread creates.
type creds struct{ uid, gid uint32 }

// inNetns runs fn on a fresh OS thread that has joined the network namespace
// at nsPath (see onThread), so sockets fn creates stay there. With c set, the
// thread first drops to that identity with the raw setgroups/setresgid/
// setresuid calls, which act on this thread only (Go's syscall.Setuid acts
// on every thread). Such a thread may lack the privilege to switch back and
// must not lend its identity to other goroutines, so it dies when fn returns.
func inNetns(nsPath string, c *creds, fn func() error) error {
	return onThread(c != nil, func() error {
		target, err := netns.GetFromPath(nsPath)
		if err != nil {
			return fmt.Errorf("opening network namespace %s: %w", nsPath, err)
		}
		defer target.Close()
		if err := netns.Set(target); err != nil {
			return fmt.Errorf("entering network namespace %s: %w", nsPath, err)
		}
		if c != nil {
			if err := setThreadCreds(c.uid, c.gid); err != nil {
				return err
			}
		}
		return fn()
	})
}

// onThread runs fn on a fresh OS thread locked to its goroutine, fn being
// free to switch the thread's network namespace. Afterwards the thread goes
// back to the namespace it started in and returns to the pool; if it cannot,
// or when discard is set (fn changed what cannot be undone, such as its
// identity), it stays locked and the runtime destroys it with the goroutine.
func onThread(discard bool, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if discard && unix.Gettid() == unix.Getpid() {
			// The process's main thread is never destroyed: the runtime
			// parks it for good instead, still in fn's namespace and with
			// fn's identity, and /proc/self (which names the main thread)
			// would then show that namespace as the process's. Keep it
			// locked here, so the thread the work moves to is another.
			err := onThread(discard, fn)
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("getting the current network namespace: %w", err)
			return
		}
		defer orig.Close()
		ferr := fn()
		if discard {
			errc <- ferr
			return
		}
		if err := netns.Set(orig); err != nil {
			errc <- errors.Join(ferr, fmt.Errorf("returning to the original network namespace: %w", err))
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
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
