// Package spawn starts the test kit's long-lived child processes (the
// kube-apiserver and etcd of a test binary, the cluster e2e's kubelet and
// containerd) so that Pdeathsig means what they set it for: die with the
// test process. The kernel sends a child its parent-death signal when the
// thread that forked it exits, not the process (prctl(2), PR_SET_PDEATHSIG),
// and the Go runtime ends a thread whenever a goroutine locked to it returns
// without unlocking. internal/hostns does that on purpose (Create, DoDiscard,
// a Do whose way back failed: a thread left in a pod's namespace must not
// serve other goroutines), so a child forked from whatever thread a test
// goroutine ran on is killed at random later on: a kube-apiserver shared by
// a package's tests died mid-run that way, and every test after it failed
// with "connection refused". Start forks from one thread kept for that and
// never given up. It is imported by tests only.
package spawn

import (
	"os/exec"
	"runtime"
	"sync"
)

type request struct {
	cmd  *exec.Cmd
	done chan error
}

var (
	once     sync.Once
	requests chan request
)

// Start is cmd.Start run on a thread that lives as long as the process, so
// a Pdeathsig in cmd.SysProcAttr fires only when the process ends.
func Start(cmd *exec.Cmd) error {
	once.Do(func() {
		requests = make(chan request)
		go func() {
			// Locked for good: the runtime never hands this thread to
			// another goroutine, and it never exits.
			runtime.LockOSThread()
			for r := range requests {
				r.done <- r.cmd.Start()
			}
		}()
	})
	done := make(chan error, 1)
	requests <- request{cmd: cmd, done: done}
	return <-done
}

// Run is cmd.Run with the fork done by Start.
func Run(cmd *exec.Cmd) error {
	if err := Start(cmd); err != nil {
		return err
	}
	return cmd.Wait()
}
