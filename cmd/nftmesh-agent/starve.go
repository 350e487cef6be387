package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nftmesh/nftmesh/podinfo/agentsock"
	"github.com/nftmesh/nftmesh/redirect/quote"
)

// Readiness of a starved agent. An agent out of descriptors or memory
// declines the calls the front hands it (the standalone plugin runs them)
// and says so on /readyz: not ready while a call was declined for lack of
// a resource in the last starvedFor, or while its open descriptors are at
// fdHighWater of RLIMIT_NOFILE or more.
const (
	// starvedFor: the chart probes /readyz every 5 s and takes 2 failures
	// as not ready, so one starved call is seen by three probes, enough
	// for kubelet to mark the pod not ready; calls still starved keep it so.
	starvedFor = 15 * time.Second
	// fdHighWater: a call takes up to about 15 descriptors at once
	// (the connection, the namespace's, the netlink and lock files), and
	// the socket runs 256 at once: 10% of the limit is the room left for
	// them on the smallest limits runtimes give (1,024; 20,000 on the
	// review's node left 2,000).
	fdHighWater = 0.9
)

// starvation is what readiness knows of the agent's resources.
type starvation struct {
	window time.Duration
	last   atomic.Pointer[starvedCall]
	// fds returns the descriptors open and the soft RLIMIT_NOFILE.
	fds func() (open, limit int, err error)
}

type starvedCall struct {
	at               time.Time
	socket, resource string
	reason           string
}

func newStarvation() *starvation {
	return &starvation{window: starvedFor, fds: openFDs}
}

// note records a call (or connection) of socket declined for lack of
// resource.
func (s *starvation) note(socket, resource, reason string) {
	s.last.Store(&starvedCall{at: time.Now(), socket: socket, resource: resource, reason: reason})
}

// resourceNames are agentsock's resources as /readyz says them.
var resourceNames = map[string]string{
	agentsock.ResourceFDs:     "file descriptors",
	agentsock.ResourceMemory:  "kernel memory",
	agentsock.ResourceBuffers: "socket buffers",
}

// check is nil unless the agent is starved, and then says of what.
func (s *starvation) check() error {
	if c := s.last.Load(); c != nil {
		if ago := time.Since(c.at); ago < s.window {
			return fmt.Errorf("starved: the %s socket declined a call for lack of %s %s ago (%s); ready again %s after the last",
				c.socket, resourceNames[c.resource], ago.Round(100*time.Millisecond), quote.Text(c.reason), s.window)
		}
	}
	open, limit, err := s.fds()
	switch {
	case agentsock.StarvedOf(err) != "":
		return fmt.Errorf("starved: counting open file descriptors: %w", err)
	case err != nil:
		// Not knowing the count is not a reason to stop taking calls.
		return nil
	case limit > 0 && float64(open) >= fdHighWater*float64(limit):
		return fmt.Errorf("starved: %d file descriptors open of RLIMIT_NOFILE %d (not ready from %.0f%%)", open, limit, 100*fdHighWater)
	}
	return nil
}

// openFDs counts this process's open descriptors in /proc/self/fd (the
// directory's own not counted) and reads the soft RLIMIT_NOFILE.
func openFDs() (open, limit int, err error) {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
		return 0, 0, fmt.Errorf("reading RLIMIT_NOFILE: %w", err)
	}
	d, err := os.Open("/proc/self/fd")
	if err != nil {
		return 0, 0, err
	}
	defer d.Close()
	for {
		// In batches: the names of 20,000 descriptors need not be held.
		names, err := d.Readdirnames(1024)
		open += len(names)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return 0, 0, fmt.Errorf("reading /proc/self/fd: %w", err)
		}
	}
	return open - 1, int(min(rl.Cur, uint64(1<<31-1))), nil
}
