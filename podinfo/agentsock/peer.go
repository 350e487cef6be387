package agentsock

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// ErrPeerNotAdmin is wrapped by CheckAdminPeer's errors.
var ErrPeerNotAdmin = errors.New("peer does not hold CAP_NET_ADMIN in the initial user namespace")

// CheckAdminPeer checks that the process at the other end of c holds
// CAP_NET_ADMIN in its effective set, in the node's initial user namespace:
// what it takes to change a network namespace's rules itself. Root with its
// capabilities dropped (a root container given a hostPath to the run dir)
// or root only in a user namespace of its own is refused.
//
// procDir is a proc file system of the node's PID namespace ("/proc", or
// the host's /proc mounted in the agent's container). The peer is known by
// the pidfd the kernel takes at connect time (SO_PEERPIDFD), so a reused
// PID is never mistaken for it: its PID in procDir's namespace comes from
// the pidfd's fdinfo, and the pidfd still naming a live process after its
// /proc files were read proves they were its. Before Linux 6.5 (no
// SO_PEERPIDFD) a pidfd opened for the SO_PEERCRED PID narrows the race to
// the time between connect and that open.
func CheckAdminPeer(c *net.UnixConn, procDir string) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	pidfd, credPID := -1, int32(0)
	var serr error
	if err := raw.Control(func(fd uintptr) {
		var cred *unix.Ucred
		if cred, serr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED); serr != nil {
			serr = fmt.Errorf("reading SO_PEERCRED: %w", serr)
			return
		}
		credPID = cred.Pid
		pidfd, serr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_PEERPIDFD)
		if errors.Is(serr, unix.ENOPROTOOPT) && credPID > 0 {
			pidfd, serr = unix.PidfdOpen(int(credPID), 0)
		}
		if serr != nil {
			serr = fmt.Errorf("opening a pidfd of the peer (pid %d): %w", credPID, serr)
		}
	}); err != nil {
		return err
	}
	if serr != nil {
		return fmt.Errorf("%w: %w", ErrPeerNotAdmin, serr)
	}
	defer unix.Close(pidfd)
	pid, err := pidfdPID(procDir, pidfd)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrPeerNotAdmin, err)
	}
	if err := checkAdmin(procDir, pid); err != nil {
		return fmt.Errorf("%w: peer pid %d: %w", ErrPeerNotAdmin, pid, err)
	}
	// Alive by the pidfd's fdinfo (-1 once exited), not pidfd_send_signal:
	// that is refused, EINVAL, for a process outside the caller's PID
	// namespace, as the front is for an agent in a pod.
	if again, err := pidfdPID(procDir, pidfd); err != nil || again != pid {
		return fmt.Errorf("%w: peer pid %d exited while it was checked (%v)", ErrPeerNotAdmin, pid, err)
	}
	return nil
}

// pidfdPID is the PID of pidfd's process in procDir's PID namespace, from
// the descriptor's fdinfo there (0: not in that namespace; -1: exited).
func pidfdPID(procDir string, pidfd int) (int, error) {
	path := filepath.Join(procDir, "self", "fdinfo", strconv.Itoa(pidfd))
	v, err := procField(path, "Pid")
	if err != nil {
		return 0, err
	}
	pid, err := strconv.Atoi(v)
	switch {
	case err != nil:
		return 0, fmt.Errorf("reading %s: Pid %q is not a number", path, v)
	case pid == -1:
		return 0, errors.New("the peer has exited")
	case pid <= 0:
		return 0, fmt.Errorf("the peer is not in the PID namespace of %s", procDir)
	}
	return pid, nil
}

// checkAdmin checks that pid holds CAP_NET_ADMIN in its effective set, in
// the initial user namespace.
func checkAdmin(procDir string, pid int) error {
	dir := filepath.Join(procDir, strconv.Itoa(pid))
	eff, err := EffectiveCaps(procDir, strconv.Itoa(pid))
	if err != nil {
		return err
	}
	if eff&(1<<unix.CAP_NET_ADMIN) == 0 {
		return fmt.Errorf("CAP_NET_ADMIN is not in its effective set (CapEff %016x)", eff)
	}
	var own unix.Stat_t
	if err := unix.Stat(filepath.Join(dir, "ns", "user"), &own); err != nil {
		return fmt.Errorf("reading its user namespace: %w", err)
	}
	if own.Ino != initUserNSIno {
		return fmt.Errorf("it is in user namespace %d, not the initial one (its capabilities hold only there)", own.Ino)
	}
	return nil
}

// initUserNSIno is the initial user namespace's nsfs inode, fixed by the
// kernel (PROC_USER_INIT_INO); later namespaces are numbered from
// 0xF0000000 up. (PID 1's ns/user would say the same, but reading it takes
// ptrace access to PID 1, which a container may be denied.)
const initUserNSIno = 0xEFFFFFFD

// EffectiveCaps is the effective capability set of process pid ("self":
// this one) as procDir shows it (CapEff in its status file). It is the
// agent's one reader of capabilities, its own and its peers': a peer is
// in the node's PID namespace, which capget cannot reach from a pod's.
func EffectiveCaps(procDir, pid string) (uint64, error) {
	path := filepath.Join(procDir, pid, "status")
	v, err := procField(path, "CapEff")
	if err != nil {
		return 0, err
	}
	eff, err := strconv.ParseUint(v, 16, 64)
	if err != nil {
		return 0, fmt.Errorf("reading %s: CapEff %q is not hexadecimal", path, v)
	}
	return eff, nil
}

// procField is the value of the "name:" line of a /proc file.
func procField(path, name string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && k == name {
			return strings.TrimSpace(v), nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("reading %s: %w", path, err)
	}
	return "", fmt.Errorf("reading %s: no %s line", path, name)
}
