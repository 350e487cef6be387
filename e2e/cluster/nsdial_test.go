package cluster

import (
	"context"
	"fmt"
	"net"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// netnsDialer opens TCP connections from inside the holder's network
// namespace, so the test process itself (in the machine's namespace) can
// talk to the apiserver, kubelet and pods without any route or forwarder in
// the machine's namespace. A socket keeps the namespace it was created in,
// so only socket creation needs the switched thread.
type netnsDialer struct {
	ns *os.File // /proc/<holder>/ns/net, held open while the cluster runs
}

func (d *netnsDialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	type result struct {
		conn net.Conn
		err  error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{err: fmt.Errorf("opening this thread's network namespace: %w", err)}
			return
		}
		defer orig.Close()
		if err := unix.Setns(int(d.ns.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			ch <- result{err: fmt.Errorf("entering the node's network namespace: %w", err)}
			return
		}
		var dialer net.Dialer
		conn, err := dialer.DialContext(ctx, network, addr)
		// A thread that cannot switch back stays locked and dies with this
		// goroutine, so no other goroutine runs in the node's namespace.
		if unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		ch <- result{conn, err}
	}()
	r := <-ch
	return r.conn, r.err
}
