package capture

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/nftmesh/nftmesh/internal/hostns"
)

// ErrUserNamespaced is wrapped by the error that refuses iptables-legacy for
// a netns owned by another user namespace (a pod with hostUsers: false). The
// kernel accepts an x_tables owner match only from a writer in the owning
// user namespace, every plan bypasses the proxy by its UID, and a
// multi-threaded process (every Go program) cannot join a user namespace;
// nftables' `meta skuid` has no such restriction.
var ErrUserNamespaced = errors.New("the network namespace is owned by a user namespace other than this process's (a pod with hostUsers: false), where the kernel refuses the iptables owner match (EINVAL); use backend nftables or auto")

// selfUserns is this process's user namespace, which never changes for a
// multi-threaded process.
var selfUserns, selfUsernsErr = usernsID("/proc/self/ns/user")

func usernsID(path string) (hostns.ID, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return hostns.ID{}, fmt.Errorf("reading this process's user namespace: %w", err)
	}
	return hostns.ID{Dev: st.Dev, Ino: st.Ino}, nil
}

// ownerIsForeign reports whether the network namespace netnsFd is owned by
// a user namespace other than this process's, asking the namespace itself
// (NS_GET_USERNS), never paths or PIDs.
func ownerIsForeign(netnsFd int, netnsPath string) (bool, error) {
	if selfUsernsErr != nil {
		return false, selfUsernsErr
	}
	ufd, err := unix.IoctlRetInt(netnsFd, unix.NS_GET_USERNS)
	if errors.Is(err, unix.EPERM) {
		// The owner is outside our user namespace and its descendants.
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
