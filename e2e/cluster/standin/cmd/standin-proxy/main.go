// Command standin-proxy stands in for Envoy and the istio-agent in the
// istio-proxy container of an Istio-injected pod, for tests on machines that
// cannot pull Istio's proxy image.
//
// It listens where Envoy listens when traffic is captured: 15001 (outbound)
// and 15006 (inbound), IPv4 and IPv6, both IP_TRANSPARENT in TPROXY mode;
// TCP and UDP 15053 (the DNS proxy). Each connection is answered with one
// JSON line naming the pod, the listener and the original destination, and
// logged as one JSON event on stdout (package standin has the format);
// with -forward, a connection to 15001 is relayed to its original
// destination instead, as Envoy relays it, so the client is answered by
// whoever is there, and the event names the relay's own local address;
// with -forward-inbound, a connection to 15006 is relayed to the app from
// 127.0.0.6 (::6), as Envoy's inbound passthrough does. It
// serves readiness on 15021 (GET /healthz/ready, which the injected
// readinessProbe and, for native sidecars, startupProbe hit) and answers
// everything on the status port 15020 (the injected preStop drain request
// goes there). With -connect it also connects out periodically, as Envoy
// does to upstreams: those connections come from the proxy's own identity
// and must leave the pod uncaptured.
//
// Flags come first; the first argument that is not a flag ends them, so the
// injected `proxy sidecar --domain ...` arguments can stay in place behind
// the stand-in's command (they are reported in the "ready" event and
// otherwise ignored).
//
// It runs as whatever the injected securityContext says (UID 1337 in
// REDIRECT mode; UID 0, GID 1337 with NET_ADMIN in TPROXY mode) and logs
// that identity. The mode comes from ISTIO_META_INTERCEPTION_MODE, which the
// injector sets in the container's environment.
package main

import (
	"flag"
	"fmt"
	"net/http"
	"os"
	"sync/atomic"
	"time"

	"github.com/nftmesh/nftmesh/e2e/cluster/standin"
)

func main() {
	var (
		targets standin.Targets
		mode    = flag.String("mode", envOr("ISTIO_META_INTERCEPTION_MODE", "REDIRECT"), "interception mode: REDIRECT or TPROXY (TPROXY makes the capture listeners IP_TRANSPARENT)")
		forward = flag.Bool("forward", false, "relay each connection to 15001 to its original destination, as Envoy does, instead of answering it (the relay connects from the proxy's identity, which capture lets out)")
		inbound = flag.Bool("forward-inbound", false, "relay each connection to 15006 to its original destination (the app) from 127.0.0.6 or ::6, as Envoy's inbound passthrough does, instead of answering it")
		relayT  = flag.Duration("relay-timeout", 0, "how long a relayed connection may last (0: the stand-ins' 3 s)")
		every   = flag.Duration("every", 2*time.Second, "period of the -connect dials")
		pod     = flag.String("pod", standin.PodName(), "pod name to report (default: the hostname, which Kubernetes sets to the pod's name)")
	)
	flag.Var(&targets, "connect", "host:port, tcp://host:port or udp://host:port to connect to periodically as the proxy (repeatable, comma-separated)")
	flag.Parse()
	if *mode != "REDIRECT" && *mode != "TPROXY" {
		standin.Fatal("standin-proxy", fmt.Errorf("-mode %q is not REDIRECT or TPROXY", *mode))
	}
	if *every <= 0 {
		standin.Fatal("standin-proxy", fmt.Errorf("-every %v is not positive", *every))
	}

	log := standin.NewLog(os.Stdout, "proxy", *pod)
	ctx, stop := standin.SignalContext()
	defer stop()

	var ready atomic.Bool
	if *relayT < 0 {
		standin.Fatal("standin-proxy", fmt.Errorf("-relay-timeout %v is negative", *relayT))
	}
	srv := &standin.Server{RelayTimeout: *relayT}
	tproxy := *mode == "TPROXY"
	var err error
	if *forward {
		err = srv.ForwardTCP(log, standin.ListenerOutbound, 15001, tproxy, nil)
	} else {
		err = srv.ServeTCP(log, standin.ListenerOutbound, 15001, tproxy)
	}
	if err == nil && *inbound {
		err = srv.ForwardTCP(log, standin.ListenerInbound, 15006, tproxy, standin.PassthroughDial)
	} else if err == nil {
		err = srv.ServeTCP(log, standin.ListenerInbound, 15006, tproxy)
	}
	if err == nil {
		err = srv.ServeTCP(log, standin.ListenerDNS, 15053, false)
	}
	if err == nil {
		err = srv.ServeUDP(log, standin.ListenerDNS, 15053)
	}
	if err == nil {
		err = srv.ServeHTTP(log, "health-15021", 15021, health(&ready))
	}
	if err == nil {
		err = srv.ServeHTTP(log, "status-15020", 15020, status(log, &ready))
	}
	if err != nil {
		_ = srv.Close()
		standin.Fatal("standin-proxy", err)
	}
	ready.Store(true)
	uid, gid := standin.Identity()
	log.Emit(standin.Event{Event: standin.EventReady, UID: uid, GID: gid, Target: targets.String(), Args: flag.Args()})

	standin.DialLoop(ctx, log, targets, *every)
	<-ctx.Done()
	log.Emit(standin.Event{Event: standin.EventStopping})
	_ = srv.Close()
}

// health answers the injected probes: 200 on /healthz/ready once every
// listener is up, 503 before.
func health(ready *atomic.Bool) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz/ready", func(w http.ResponseWriter, _ *http.Request) {
		if !ready.Load() {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	return mux
}

// status answers every request on the status port with 200 and logs it,
// except the readiness path, which probes would flood the log with.
func status(log *standin.Log, ready *atomic.Bool) http.Handler {
	h := health(ready)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz/ready" {
			h.ServeHTTP(w, r)
			return
		}
		log.Emit(standin.Event{Event: standin.EventHTTP, Listener: "status-15020", Target: r.Method + " " + r.URL.Path, Peer: r.RemoteAddr})
		_, _ = w.Write([]byte("ok\n"))
	})
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}
