// Package hostns stops capture rules from landing in the node's own network
// namespace: a wrong netns path (a hostNetwork pod, a PID that left its
// namespace, a typo in `redirect apply --netns`) would otherwise send every
// outbound connection of the node to a port nobody listens on.
//
// The CNI plugin and the CLI run in the host's namespace and the agent in its
// own pod's, so "the namespace of this process" is never a pod we capture.
// PID 1's namespace (the host's, seen from the host) is refused as well when
// it can be read.
package hostns

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

// ErrOwnNetns is returned for a target that is this process's namespace or
// PID 1's.
var ErrOwnNetns = errors.New("refusing to install capture rules in the caller's own network namespace (the host's, for the CNI plugin and the CLI)")

// AllowOwn lifts the own-namespace check (`redirect apply --allow-own-netns`,
// for deliberately capturing the namespace the CLI was started in). PID 1's
// namespace is still refused.
var AllowOwn = false

var initNetns = "/proc/1/ns/net"

// self is this process's own namespace, read once while package init runs
// on the main thread and before any goroutine has switched a thread into a
// pod namespace: /proc/self/ns/net follows the thread-group leader, which a
// goroutine locked to the main thread may have moved.
var self, selfErr = os.Stat("/proc/thread-self/ns/net")

// Refuse returns an error wrapping ErrOwnNetns when path is this process's
// network namespace (unless AllowOwn) or PID 1's, and nil otherwise. A path
// that cannot be read is left to the backend's own open to report.
func Refuse(path string) error {
	target, err := os.Stat(path)
	if err != nil {
		return nil
	}
	if host, err := os.Stat(initNetns); err == nil && same(target, host) {
		return fmt.Errorf("netns %s is the namespace of PID 1: %w", path, ErrOwnNetns)
	}
	if selfErr == nil && same(target, self) && !AllowOwn {
		return fmt.Errorf("netns %s: %w", path, ErrOwnNetns)
	}
	return nil
}

func same(a, b os.FileInfo) bool {
	sa, ok1 := a.Sys().(*syscall.Stat_t)
	sb, ok2 := b.Sys().(*syscall.Stat_t)
	return ok1 && ok2 && sa.Dev == sb.Dev && sa.Ino == sb.Ino
}
