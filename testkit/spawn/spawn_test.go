package spawn

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"syscall"
	"testing"
	"time"
)

var errMainThread = errors.New("on the main thread")

// startOnEndingThread starts a child with Pdeathsig by start, from a
// goroutine locked to its thread that then returns locked, so the runtime
// ends that thread (as internal/hostns' Create and DoDiscard do), and
// reports whether the child still runs half a second later.
func startOnEndingThread(t *testing.T, start func(*exec.Cmd) error) (alive bool) {
	t.Helper()
	cmd := exec.Command("sleep", "60")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	for started := false; !started; {
		errc := make(chan error, 1)
		go func() {
			runtime.LockOSThread()
			if syscall.Gettid() == os.Getpid() {
				// The runtime parks the main thread instead of ending
				// it: try again on another.
				runtime.UnlockOSThread()
				errc <- errMainThread
				return
			}
			errc <- start(cmd)
			// Returning locked ends this thread.
		}()
		switch err := <-errc; err {
		case nil:
			started = true
		case errMainThread:
			runtime.Gosched()
		default:
			t.Fatal(err)
		}
	}
	defer func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait()
	}()
	stat := fmt.Sprintf("/proc/%d/stat", cmd.Process.Pid)
	for deadline := time.Now().Add(500 * time.Millisecond); time.Now().Before(deadline); {
		// A killed child is a zombie until Wait reaps it: state Z.
		if b, err := os.ReadFile(stat); err != nil || bytes.Contains(b, []byte(") Z ")) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

// TestStartSurvivesTheCallersThread: a child Start forked keeps running
// when the thread of the goroutine that called Start ends. The control
// shows the hazard Start is for: the same child forked by cmd.Start on
// that thread is killed by the kernel when the thread ends.
func TestStartSurvivesTheCallersThread(t *testing.T) {
	if _, err := exec.LookPath("sleep"); err != nil {
		t.Skip("no sleep binary")
	}
	if startOnEndingThread(t, (*exec.Cmd).Start) {
		t.Fatal("control: a child forked by cmd.Start from a thread that then ended still runs; this test cannot tell Start from cmd.Start here")
	}
	if !startOnEndingThread(t, Start) {
		t.Fatal("a child started by spawn.Start was killed when the caller's thread ended")
	}
}
