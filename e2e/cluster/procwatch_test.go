package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// procRun is one process the node's containerd started, or one of its
// descendants, as the kernel's process events connector saw it. Times are
// the kernel's event timestamps (CLOCK_MONOTONIC, ns).
type procRun struct {
	pid, parent int
	name        string // base name of the executable, e.g. "bridge"
	command     string // CNI_COMMAND
	container   string // CNI_CONTAINERID
	pod, ns     string // from CNI_ARGS K8S_POD_NAME, K8S_POD_NAMESPACE
	marker      string // the value of chainMarkerEnv: a marked container's process
	exe         string // base name of its latest exec's executable
	verb        string // a runc run's command: create, start, delete, ...
	fork        int64  // the runtime's fork of it
	exec        int64  // its first exec
	exit        int64
	status      uint32 // wait status at exit
	execs       int
}

// wall is fork to exit: how long the runtime waited for the child.
func (r *procRun) wall() time.Duration { return time.Duration(r.exit - r.fork) }

// chainMarkerEnv marks the app container of a measured pod: its process's
// exec is the pod's container start.
const chainMarkerEnv = "NFTMESH_E2E_CHAIN_POD"

// procWatch follows, through the kernel's process events connector
// (netlink NETLINK_CONNECTOR, CN_IDX_PROC), every process the node's
// containerd forks and their descendants: the CNI plugins it runs for a
// sandbox (and the IPAM plugin bridge runs), and the shims, runc and the
// containers' own processes. Nothing is installed on the node and no
// plugin is wrapped: the timings are the runtime's fork to the child's exit,
// as the kernel stamps them. The connector reports every process of the
// machine; only containerd's tree is kept.
type procWatch struct {
	root int // containerd's pid

	mu       sync.Mutex
	live     map[int]*procRun
	runs     []*procRun // exited CNI plugin runs
	starts   []*procRun // marked containers' execs
	runcs    []*procRun // exited runc runs
	missed   int        // execs whose /proc entries were gone before read
	overruns int        // times the kernel dropped events (ENOBUFS)
	err      error      // the monitor's end, if it ended early
	stop     chan struct{}
	stopped  chan struct{}
}

// watchProcs starts following containerd (pid root).
func watchProcs(root int) (*procWatch, error) {
	w := &procWatch{root: root, live: map[int]*procRun{}, stop: make(chan struct{}), stopped: make(chan struct{})}
	ch, errc, done, err := subscribeProcEvents()
	if err != nil {
		return nil, err
	}
	go func() {
		defer close(w.stopped)
		defer func() { close(done) }()
		for {
			select {
			case <-w.stop:
				return
			case ev, ok := <-ch:
				if !ok {
					ch = nil // the monitor ended; its error is on errc
					continue
				}
				w.handle(ev)
			case err := <-errc:
				if errors.Is(err, unix.ENOBUFS) {
					// The kernel dropped events the socket had no room
					// for (every process of the machine is reported, and
					// the machine is shared): the runs they belonged to
					// are not whole, and chainPhase measures more pods.
					// Listen again.
					close(done)
					var serr error
					if ch, errc, done, serr = subscribeProcEvents(); serr == nil {
						w.mu.Lock()
						w.overruns++
						w.mu.Unlock()
						continue
					}
					done = make(chan struct{})
					err = fmt.Errorf("%w; listening again: %w", err, serr)
				}
				w.mu.Lock()
				w.err = fmt.Errorf("the process events monitor ended: %w", err)
				w.mu.Unlock()
				return
			}
		}
	}()
	return w, nil
}

// subscribeProcEvents listens to the kernel's process events until done is
// closed; the monitor's end is reported on errc.
func subscribeProcEvents() (chan netlink.ProcEvent, chan error, chan struct{}, error) {
	ch := make(chan netlink.ProcEvent, 1<<16)
	errc := make(chan error, 2)
	done := make(chan struct{})
	if err := netlink.ProcEventMonitor(ch, done, errc); err != nil {
		return nil, nil, nil, fmt.Errorf("subscribing to the kernel's process events: %w", err)
	}
	return ch, errc, done, nil
}

// overrunCount is how often the kernel dropped events and the watch
// listened again.
func (w *procWatch) overrunCount() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.overruns
}

func (w *procWatch) Stop() {
	close(w.stop)
	<-w.stopped
}

func (w *procWatch) handle(ev netlink.ProcEvent) {
	ts := int64(ev.Timestamp)
	w.mu.Lock()
	defer w.mu.Unlock()
	switch m := ev.Msg.(type) {
	case *netlink.ForkProcEvent:
		if m.ChildPid != m.ChildTgid {
			return // a new thread
		}
		parent := int(m.ParentTgid)
		if parent != w.root && w.live[parent] == nil {
			return
		}
		w.live[int(m.ChildTgid)] = &procRun{pid: int(m.ChildTgid), parent: parent, fork: ts}
	case *netlink.ExecProcEvent:
		r := w.live[int(m.ProcessTgid)]
		if r == nil {
			return
		}
		r.execs++
		exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", r.pid))
		if err == nil {
			r.exe = filepath.Base(exe)
		}
		if r.exe == "runc" && r.execs == 1 {
			if cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", r.pid)); err == nil {
				r.verb = runcVerb(strings.Split(string(cmdline), "\x00"))
			}
			return
		}
		env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", r.pid))
		if err != nil {
			w.missed++
			return
		}
		vars := map[string]string{}
		for _, kv := range bytes.Split(env, []byte{0}) {
			k, v, _ := strings.Cut(string(kv), "=")
			vars[k] = v
		}
		if v := vars[chainMarkerEnv]; v != "" {
			s := *r
			s.exec, s.marker = ts, v
			w.starts = append(w.starts, &s)
			return
		}
		if r.execs > 1 || vars["CNI_COMMAND"] == "" {
			return // the front's exec of the standalone plugin keeps the front's name
		}
		if exe == "" {
			w.missed++
			return
		}
		r.exec, r.name = ts, filepath.Base(exe)
		r.command, r.container = vars["CNI_COMMAND"], vars["CNI_CONTAINERID"]
		for _, kv := range strings.Split(vars["CNI_ARGS"], ";") {
			k, v, _ := strings.Cut(kv, "=")
			switch k {
			case "K8S_POD_NAME":
				r.pod = v
			case "K8S_POD_NAMESPACE":
				r.ns = v
			}
		}
	case *netlink.ExitProcEvent:
		if m.ProcessPid != m.ProcessTgid {
			return
		}
		r := w.live[int(m.ProcessTgid)]
		if r == nil {
			return
		}
		delete(w.live, r.pid)
		r.exit, r.status = ts, m.ExitCode
		if r.command != "" {
			w.runs = append(w.runs, r)
		}
		if r.verb != "" {
			w.runcs = append(w.runcs, r)
		}
	}
}

// snapshot returns copies of what has been seen so far.
func (w *procWatch) snapshot() (runs, starts []procRun, missed int, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, r := range w.runs {
		runs = append(runs, *r)
	}
	for _, s := range w.starts {
		starts = append(starts, *s)
	}
	return runs, starts, w.missed, w.err
}

// runcRuns returns copies of the runc runs seen so far.
func (w *procWatch) runcRuns() []procRun {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]procRun, 0, len(w.runcs))
	for _, r := range w.runcs {
		out = append(out, *r)
	}
	return out
}

// pidByExe is a running process of containerd's tree whose latest exec
// was of an executable named name, or 0. One whose exit event the kernel
// dropped is skipped: its /proc entry is gone, or another process's.
func (w *procWatch) pidByExe(name string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	for pid, r := range w.live {
		if r.exe != name {
			continue
		}
		if exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); err == nil && filepath.Base(exe) == name {
			return pid
		}
	}
	return 0
}

// runcCommands are runc's commands, as its command line names them after
// the global flags.
var runcCommands = map[string]bool{"create": true, "start": true, "delete": true, "kill": true, "state": true,
	"exec": true, "update": true, "pause": true, "resume": true, "ps": true, "events": true, "features": true}

// runcVerb is the command of a runc command line.
func runcVerb(args []string) string {
	for _, a := range args[min(1, len(args)):] {
		if runcCommands[a] {
			return a
		}
	}
	return "other"
}

// waitFor polls what was seen until cond holds.
func (w *procWatch) waitFor(ctx context.Context, timeout time.Duration, what string, cond func(runs, starts []procRun) bool) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		runs, starts, _, err := w.snapshot()
		if err != nil {
			return err
		}
		if cond(runs, starts) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// monotonicNow is CLOCK_MONOTONIC in ns, the clock of the kernel's
// process event timestamps.
func monotonicNow() int64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}
