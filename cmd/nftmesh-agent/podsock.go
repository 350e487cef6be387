package main

import (
	"cmp"
	"context"
	"fmt"
	"net"
	"os"
	"slices"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/nftmesh/nftmesh/cniplugin"
	"github.com/nftmesh/nftmesh/installer"
	"github.com/nftmesh/nftmesh/installer/metrics"
	"github.com/nftmesh/nftmesh/installer/podcache"
	"github.com/nftmesh/nftmesh/installer/repair"
	"github.com/nftmesh/nftmesh/internal/cnisock"
	"github.com/nftmesh/nftmesh/podinfo/agentsock"
)

// podSocket is the agent's answer to the plugin's pod lookups: the socket
// in the run dir, answered from this node's pod informer.
type podSocket struct {
	ln  *agentsock.Listener
	srv *agentsock.Server
	// cniLn and cni run the calls the nftmesh-cni front hands over, with
	// pods from the same informer.
	cniLn  *agentsock.Listener
	cni    *cniplugin.Server
	pods   cache.SharedIndexInformer
	ownRun bool // the informer is ours to run (not the repair controller's)
	// linkerd watches namespaces and the API server's Service for Linkerd
	// pods' decisions (with --linkerd only: the chart grants those reads
	// in its Linkerd profile).
	linkerd *podcache.Watches
	// inspectLn answers `redirect inspect NAMESPACE/NAME` (inspectsock.go),
	// finding namespaces through the host's /proc at procDir.
	inspectLn *agentsock.Listener
	procDir   string
	log       zerolog.Logger

	// starved and starvedTotal learn of connections and calls declined for
	// lack of a resource.
	starved      *starvation
	starvedTotal *prometheus.CounterVec

	mu      sync.Mutex
	apiDown bool // the last list or watch call of our own informer failed
}

// noteStarved counts a connection or call of socket declined for lack of
// resource and tells readiness.
func (s *podSocket) noteStarved(socket, resource, reason string) {
	s.starvedTotal.WithLabelValues(socket, resource).Inc()
	if s.starved != nil {
		s.starved.note(socket, resource, reason)
	}
}

// starvedCounter counts what the agent's sockets declined for lack of a
// resource, by socket and resource.
func starvedCounter(m *metrics.Metrics) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "nftmesh", Subsystem: "agent_socket", Name: "starved_total",
		Help: "Connections and CNI calls the agent's sockets declined for lack of a resource, by socket (cni, pod) and resource (fds, memory, buffers); the front or the plugin then did the work itself.",
	}, []string{"socket", "resource"})
	if m != nil {
		m.Registry.MustRegister(c)
	}
	return c
}

// apiCalled logs when our own watch starts failing (once per outage) and
// when it works again; meanwhile pods it does not have are read once each.
// A call cut short by the agent's shutdown says nothing about the API.
func (s *podSocket) apiCalled(ctx context.Context, err error) {
	if err != nil && ctx.Err() != nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case err == nil && s.apiDown:
		s.apiDown = false
		s.log.Info().Msg("the pod socket's watch of the node's pods works again")
	case err != nil && !s.apiDown:
		s.apiDown = true
		s.log.Warn().Err(err).Msg("the pod socket cannot list or watch the node's pods; it reads each pod it is asked about from the API until it can")
	}
}

// newPodSocket sets up the socket when the agent can watch its node's pods
// (an API client and a node name), else returns nil, nil: the plugin then
// reads pods from the API itself. The CNI calls the front hands over are run
// only while hostNetns is nil: the host's network namespace is then
// registered to be refused.
func newPodSocket(cfg *installer.Config, client corev1client.CoreV1Interface, repairCtl *repair.Controller, linkerd *podcache.Watches, hostNetns func() error, log zerolog.Logger, m *metrics.Metrics, starved *starvation) (*podSocket, error) {
	node := cmp.Or(cfg.NodeName, cfg.Repair.NodeName)
	if client == nil || node == "" {
		return nil, nil
	}
	s := &podSocket{log: log.With().Str("subsystem", "pod-socket").Logger()}
	if err := s.watchPods(cfg, client, repairCtl, node); err != nil {
		return nil, err
	}
	// Until the watch has listed the node's pods, and for a pod it has not
	// brought within the bounded wait, the agent reads the pod once.
	src := podcache.New(s.pods.GetIndexer(), s.pods.HasSynced, podcache.APIGetter(client))
	if linkerd != nil {
		s.linkerd = linkerd
		src.Linkerd = linkerd
	}
	if _, err := s.pods.AddEventHandler(src.Handler()); err != nil {
		return nil, fmt.Errorf("registering the pod socket's handler: %w", err)
	}
	ln, err := agentsock.Listen(cfg.AgentRunDir)
	if err != nil {
		return nil, err
	}
	s.ln = ln
	// redirect inspect's socket is a convenience: without it (say, a run
	// dir whose path is too long for one more socket name) the plugin's
	// sockets still serve.
	if s.inspectLn, err = agentsock.ListenAt(cfg.AgentRunDir, agentsock.InspectSocketName); err != nil {
		s.log.Warn().Err(err).Msg("not answering redirect inspect NAMESPACE/NAME")
		s.inspectLn = nil
	}
	s.procDir = cfg.Repair.HostProc
	answers := socketCounter(m, "requests_total",
		"Plugin pod lookups on the agent's socket, by outcome (found, unknown, refused, bad_request, write_error, starved).")
	s.starvedTotal = starvedCounter(m)
	s.starved = starved
	s.srv = &agentsock.Server{Resolver: src, AllowUID: agentsock.PeerUID, Observe: s.observer("pod", answers, agentsock.StatusFound, agentsock.StatusUnknown)}
	if s.cniRefused(cfg.AgentRunDir, hostNetns) {
		return s, nil
	}
	if err := s.serveCNI(cfg, src, hostNetns, m); err != nil {
		ln.Close()
		return nil, err
	}
	return s, nil
}

// watchPods takes the repair controller's pod watch when it sees every pod
// of the node, else sets up the socket's own (the chart grants the agent
// list and watch of pods whatever the repair set-up): one watch per node.
func (s *podSocket) watchPods(cfg *installer.Config, client corev1client.CoreV1Interface, repairCtl *repair.Controller, node string) error {
	if repairCtl != nil && cfg.Repair.NodeName == node {
		if pods, nodeOnly := repairCtl.PodInformer(); nodeOnly {
			s.pods = pods
			return nil
		}
	}
	// Paged and slimmed as the repair controller's is.
	pods, err := repair.NodePods{Node: node, Called: s.apiCalled}.Informer(client)
	if err != nil {
		return fmt.Errorf("setting up the pod socket's watch: %w", err)
	}
	s.pods, s.ownRun = pods, true
	return nil
}

// cniRefused says (and logs why) when this agent cannot run the plugin's
// CNI calls, removing a socket an earlier agent that could left behind,
// which would send the front here for nothing.
func (s *podSocket) cniRefused(runDir string, hostNetns func() error) bool {
	const refusing = "not running the plugin's CNI calls (the front runs the standalone plugin): "
	// Running a call means entering the pod's namespace and writing its
	// rules; the chart grants that only with repair in place.
	if missing := missingCaps(); len(missing) > 0 {
		_ = os.Remove(cnisock.Path(runDir))
		s.log.Info().Strs("missing_capabilities", missing).Msg(refusing + "this container lacks capabilities they need")
		return true
	}
	// A call names its namespace; the host's must be refused, and is told
	// from a pod's only once registered.
	if err := hostNetns(); err != nil {
		_ = os.Remove(cnisock.Path(runDir))
		s.log.Info().Err(err).Msg(refusing + "the host's network namespace is not known")
		return true
	}
	return false
}

// serveCNI listens on the socket the nftmesh-cni front hands its calls to.
func (s *podSocket) serveCNI(cfg *installer.Config, src *podcache.Source, hostNetns func() error, m *metrics.Metrics) error {
	cniLn, err := agentsock.ListenAt(cfg.AgentRunDir, cnisock.SocketName)
	if err != nil {
		return err
	}
	s.cniLn = cniLn
	calls := socketCounter(m, "cni_calls_total",
		"CNI calls the nftmesh-cni front handed to the agent, by outcome (ok, error, declined, busy, starved, refused, bad_request, write_error).")
	// A caller's capabilities are read in the node's PID namespace: the
	// host's /proc as repair in place mounts it (the chart grants the
	// capabilities calls need only with it), else this process's own.
	procDir := cmp.Or(cfg.Repair.HostProc, "/proc")
	s.cni = &cniplugin.Server{RunDir: cfg.AgentRunDir, Resolver: src, AllowUID: agentsock.PeerUID, ProcDir: procDir, HostNetns: hostNetns,
		Observe: s.observer("cni", calls, agentsock.OutcomeOK, agentsock.OutcomeError, agentsock.OutcomeDeclined)}
	return nil
}

// observer counts the outcomes of socket's connections, tells readiness of
// the starved ones, and logs each: those of quiet at debug, any other as a
// warning naming the peer.
func (s *podSocket) observer(socket string, count *prometheus.CounterVec, quiet ...string) func(agentsock.Outcome) {
	return func(o agentsock.Outcome) {
		count.WithLabelValues(o.Status).Inc()
		if o.Status == agentsock.OutcomeStarved {
			s.noteStarved(socket, o.Resource, o.Reason)
		}
		e := s.log.Debug()
		if !slices.Contains(quiet, o.Status) {
			e = s.log.Warn().Uint32("peer_uid", o.PeerUID)
		}
		e = e.Str("outcome", o.Status).Str("reason", o.Reason)
		if socket == "pod" {
			e.Str("namespace", o.Request.Namespace).Str("pod", o.Request.Name).Str("uid", o.Request.UID).Dur("duration", o.Duration).Msg("pod lookup on the agent socket")
			return
		}
		e.Str("command", o.Command).Dur("duration", o.Duration).Msg("CNI call on the agent socket")
	}
}

// socketCounter is a counter of the agent socket's outcomes, registered
// when the agent has metrics.
func socketCounter(m *metrics.Metrics, name, help string) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "nftmesh", Subsystem: "agent_socket", Name: name, Help: help,
	}, []string{"outcome"})
	if m != nil {
		m.Registry.MustRegister(c)
	}
	return c
}

// run serves until ctx ends (and runs the informer if it is ours).
func (s *podSocket) run(ctx context.Context) error {
	if s.ownRun {
		go s.pods.RunWithContext(ctx)
	}
	if s.linkerd != nil {
		go s.linkerd.Run(ctx)
	}
	if s.inspectLn != nil {
		// Only a peer that could open the namespace itself may ask, as on
		// the CNI socket, read through the host's /proc.
		allow := func(c *net.UnixConn) error { return agentsock.CheckAdminPeer(c, s.procDir) }
		go func() {
			if err := agentsock.ServeInspect(ctx, s.inspectLn, allow, s.inspectPod(s.procDir)); err != nil {
				s.log.Warn().Err(err).Msg("the inspect socket stopped")
			}
		}()
	}
	from := "the repair controller's pod watch"
	if s.ownRun {
		from = "its own watch of the node's pods"
	}
	if s.cni == nil {
		s.log.Info().Str("socket", s.ln.Path()).Str("answers_from", from).Msg("answering the plugin's pod lookups")
		return s.srv.Serve(ctx, s.ln)
	}
	s.log.Info().Str("socket", s.ln.Path()).Str("cni_socket", s.cniLn.Path()).Str("answers_from", from).
		Msg("answering the plugin's pod lookups and running the CNI calls handed over")
	cniDone := make(chan error, 1)
	go func() { cniDone <- s.cni.Serve(ctx, s.cniLn) }()
	err := s.srv.Serve(ctx, s.ln)
	if cerr := <-cniDone; err == nil {
		err = cerr
	}
	return err
}

// callCaps are the capabilities a CNI call needs in the agent: entering the
// pod's network namespace and programming its rules. (NET_RAW, for the
// iptables-legacy backend's sockets, only some calls need: without it
// those are declined at the refusal, and the standalone plugin runs them.)
var callCaps = []struct {
	name string
	bit  int
}{{"SYS_ADMIN", unix.CAP_SYS_ADMIN}, {"NET_ADMIN", unix.CAP_NET_ADMIN}}

// missingCaps names the callCaps this process does not hold.
func missingCaps() []string {
	eff, err := agentsock.EffectiveCaps("/proc", "self")
	if err != nil {
		return []string{"unknown: " + err.Error()}
	}
	var missing []string
	for _, c := range callCaps {
		if eff&(1<<c.bit) == 0 {
			missing = append(missing, c.name)
		}
	}
	return missing
}
