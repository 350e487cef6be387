// Command standin-app stands in for the application container of an
// Istio-injected pod in tests: it accepts connections on its ports, answers
// each with one JSON line naming the pod, the listener (app-<port>) and the
// connection's destination, and with -connect connects out periodically,
// logging where each connection landed (package standin has the format).
//
// Run in a captured pod, its outbound connections land on the pod's proxy
// (outbound-15001) with their original destination; inbound connections
// from other pods land on the proxy's inbound-15006 instead of here, unless
// the port is not captured.
package main

import (
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/nftmesh/nftmesh/e2e/cluster/standin"
)

func main() {
	var (
		ports   standin.Ports
		targets standin.Targets
		every   = flag.Duration("every", 2*time.Second, "period of the -connect dials")
		pod     = flag.String("pod", standin.PodName(), "pod name to report (default: the hostname, which Kubernetes sets to the pod's name)")
	)
	flag.Var(&ports, "listen", "TCP port to serve (repeatable, comma-separated)")
	flag.Var(&targets, "connect", "host:port, tcp://host:port or udp://host:port to connect to periodically (repeatable, comma-separated)")
	flag.Parse()
	if *every <= 0 {
		standin.Fatal("standin-app", fmt.Errorf("-every %v is not positive", *every))
	}

	log := standin.NewLog(os.Stdout, "app", *pod)
	ctx, stop := standin.SignalContext()
	defer stop()

	srv := &standin.Server{}
	for _, p := range ports {
		if err := srv.ServeTCP(log, standin.AppListener(p), p, false); err != nil {
			_ = srv.Close()
			standin.Fatal("standin-app", err)
		}
	}
	uid, gid := standin.Identity()
	log.Emit(standin.Event{Event: standin.EventReady, UID: uid, GID: gid, Target: targets.String()})

	standin.DialLoop(ctx, log, targets, *every)
	<-ctx.Done()
	log.Emit(standin.Event{Event: standin.EventStopping})
	_ = srv.Close()
}
