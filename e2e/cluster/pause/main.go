// Command pause is the pod sandbox process of the cluster end-to-end test:
// it holds the pod's namespaces until the runtime stops it. Kubernetes' own
// pause image is not reachable offline, so the test builds this one.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sig := make(chan os.Signal, 4)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for s := range sig {
		if s != syscall.SIGCHLD {
			return
		}
		// As PID 1 of a shared PID namespace the sandbox inherits orphans;
		// reap them so they do not linger as zombies.
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
