package capture

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/nftmesh/nftmesh/internal/hostns"
)

// ErrUserNamespaced is wrapped by the error that refuses the iptables-legacy
// backend for a network namespace owned by another user namespace than the
// caller's (a Kubernetes pod with hostUsers: false). The kernel accepts an
// x_tables owner match (uid-owner/gid-owner) only from a writer in the user
// namespace that owns the network namespace, and refuses it with EINVAL
// otherwise; every capture plan bypasses the proxy by its UID, so no plan can
// be written there. A writer would have to join that user namespace, which a
// multi-threaded process (every Go program) cannot do. nftables has no such
// restriction: `meta skuid` is compared with the socket owner's UID as seen
// from the namespace's own user namespace, so it matches the in-pod UIDs.
var ErrUserNamespaced = errors.New("the network namespace is owned by a user namespace other than this process's (a pod with hostUsers: false), where the kernel refuses the iptables owner match (EINVAL); use backend nftables or auto")

// selfUserns is this process's user namespace, read once at init: the user
// namespace of a multi-threaded process never changes, but reading it once
// keeps the per-ADD cost at one ioctl and one fstat.
var selfUserns, selfUsernsErr = usernsID("/proc/self/ns/user")

func usernsID(path string) (hostns.ID, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return hostns.ID{}, fmt.Errorf("reading this process's user namespace: %w", err)
	}
	return hostns.ID{Dev: st.Dev, Ino: st.Ino}, nil
}

// ownerIsForeign reports whether the network namespace netnsFd is owned
// by a user namespace other than this process's. The owner is asked of the
// namespace itself (NS_GET_USERNS), never derived from paths or PIDs.
func ownerIsForeign(netnsFd int, netnsPath string) (bool, error) {
	if selfUsernsErr != nil {
		return false, selfUsernsErr
	}
	ufd, err := unix.IoctlRetInt(netnsFd, unix.NS_GET_USERNS)
	if errors.Is(err, unix.EPERM) {
		// The owner lies outside this process's user namespace and its
		// descendants: certainly not ours.
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("reading the owning user namespace of netns %s: %w", netnsPath, err)
	}
	defer unix.Close(ufd)
	var st unix.Stat_t
	if err := unix.Fstat(ufd, &st); err != nil {
		return false, fmt.Errorf("reading the owning user namespace of netns %s: %w", netnsPath, err)
	}
	return (hostns.ID{Dev: st.Dev, Ino: st.Ino}) != selfUserns, nil
}
