package main

import (
	"context"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/nftmesh/nftmesh/installer"
	"github.com/nftmesh/nftmesh/installer/metrics"
	"github.com/nftmesh/nftmesh/installer/repair"
	"github.com/nftmesh/nftmesh/podinfo/agentsock"
	"github.com/nftmesh/nftmesh/podinfo/agentsock/cachesource"
)

// podSocket is the agent's answer to the plugin's pod lookups: the socket
// in the run dir, answered from this node's pod informer.
type podSocket struct {
	ln     *agentsock.Listener
	srv    *agentsock.Server
	pods   cache.SharedIndexInformer
	ownRun bool // the informer is ours to run (not the repair controller's)
	log    zerolog.Logger
}

// newPodSocket sets up the socket when the agent can watch its node's pods
// (an API client and a node name); it returns nil, nil when it cannot, and
// the plugin then reads pods from the API itself. It shares the repair
// controller's informer when that one sees every pod of the node, so the
// node has one pod watch, not two.
func newPodSocket(cfg *installer.Config, client kubernetes.Interface, repairCtl *repair.Controller, log zerolog.Logger, m *metrics.Metrics) (*podSocket, error) {
	node := cfg.NodeName
	if node == "" {
		node = cfg.Repair.NodeName
	}
	if client == nil || node == "" {
		return nil, nil
	}
	s := &podSocket{log: log.With().Str("subsystem", "pod-socket").Logger()}
	switch {
	case repairCtl == nil:
		// No repair, no pod watch: the chart then grants the agent's
		// service account only "get pods", so the agent reads each pod
		// once for the plugin (one API read per pod start, over the
		// agent's kept connection, instead of the plugin's own).
	case cfg.Repair.NodeName != node:
		s.pods, s.ownRun = cachesource.NodeInformer(client, node), true
	default:
		pods, nodeOnly := repairCtl.PodInformer()
		if nodeOnly {
			s.pods = pods
		} else {
			// The repair controller's watch is narrowed by its extra
			// selectors; its role allows a watch of the whole node.
			s.pods, s.ownRun = cachesource.NodeInformer(client, node), true
		}
	}
	if s.ownRun {
		// Cache what the decision reads, as the repair controller does.
		if err := s.pods.SetTransform(repair.SlimPod); err != nil {
			return nil, fmt.Errorf("setting the pod socket informer's transform: %w", err)
		}
	}
	var src *cachesource.Source
	if s.pods == nil {
		src = cachesource.New(nil, nil, cachesource.APIGetter(client))
	} else {
		src = cachesource.New(s.pods.GetIndexer(), s.pods.HasSynced, cachesource.APIGetter(client))
		if _, err := s.pods.AddEventHandler(src.Handler()); err != nil {
			return nil, fmt.Errorf("registering the pod socket's handler: %w", err)
		}
	}
	ln, err := agentsock.Listen(cfg.AgentRunDir)
	if err != nil {
		return nil, err
	}
	s.ln = ln
	answers := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "nftmesh", Subsystem: "agent_socket", Name: "requests_total",
		Help: "Plugin pod lookups on the agent's socket, by outcome (found, unknown, refused, bad_request, write_error).",
	}, []string{"outcome"})
	if m != nil {
		m.Registry.MustRegister(answers)
	}
	s.srv = &agentsock.Server{Resolver: src, AllowUID: agentsock.PeerUID, Observe: func(o agentsock.Outcome) {
		answers.WithLabelValues(o.Status).Inc()
		var e *zerolog.Event
		switch o.Status {
		case agentsock.StatusFound, agentsock.StatusUnknown:
			e = s.log.Debug()
		default:
			e = s.log.Warn().Uint32("peer_uid", o.PeerUID)
		}
		e.Str("outcome", o.Status).Str("reason", o.Reason).Str("namespace", o.Request.Namespace).
			Str("pod", o.Request.Name).Str("uid", o.Request.UID).Dur("duration", o.Duration).Msg("pod lookup on the agent socket")
	}}
	return s, nil
}

// run serves until ctx ends (and runs the informer if it is ours).
func (s *podSocket) run(ctx context.Context) error {
	if s.ownRun {
		go s.pods.RunWithContext(ctx)
	}
	from := "the repair controller's pod watch"
	switch {
	case s.pods == nil:
		from = "one API read per pod (no pod watch without repair)"
	case s.ownRun:
		from = "its own watch of the node's pods"
	}
	s.log.Info().Str("socket", s.ln.Path()).Str("answers_from", from).Msg("answering the plugin's pod lookups")
	return s.srv.Serve(ctx, s.ln)
}
