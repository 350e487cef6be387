package main

import (
	"context"
	"errors"
	"time"

	"github.com/rs/zerolog"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"

	"github.com/nftmesh/nftmesh/installer"
	"github.com/nftmesh/nftmesh/installer/nodetaint"
)

// canProgramPods reports nil once a pod starting on this node gets its
// capture: the plugin is installed in the CNI config (the installer's
// readiness), and where the agent answers the plugin, its pod watch has
// listed the node's pods and, when it runs the calls handed over, its CNI
// socket is listening.
func canProgramPods(in *installer.Installer, sock *podSocket) func() error {
	return func() error {
		if err := in.Ready(); err != nil {
			return err
		}
		if sock == nil {
			return nil // the plugin reads pods from the API itself
		}
		if !sock.pods.HasSynced() {
			return errors.New("the pod watch has not listed this node's pods yet")
		}
		if sock.cni != nil && sock.cniLn == nil {
			return errors.New("the CNI socket is not listening")
		}
		return nil
	}
}

// untaintNode removes the not-ready taint from this node once ready passes
// (nothing when turned off, or without an API client or node name).
func untaintNode(ctx context.Context, cfg *installer.Config, client corev1client.CoreV1Interface, ready func() error, log zerolog.Logger) {
	if !cfg.RemoveNodeTaint {
		return
	}
	if client == nil || cfg.NodeName == "" {
		log.Info().Str("taint", cfg.NodeTaintKey).Msg("not removing the node taint: it needs an API client and --node-name")
		return
	}
	log = log.With().Str("subsystem", "node-taint").Str("node", cfg.NodeName).Str("taint", cfg.NodeTaintKey).Logger()
	u := &nodetaint.Untainter{Client: client, Node: cfg.NodeName, Key: cfg.NodeTaintKey}
	failures := 0
	res, err := u.RemoveWhenReady(ctx, ready, 200*time.Millisecond, func(err error) {
		// The first failure, then every tenth: the retries back off to a
		// minute, so this is at most one line per ten minutes.
		if failures%10 == 0 {
			log.Warn().Err(err).Int("attempt", failures+1).Msg("cannot remove the node taint yet; retrying")
		}
		failures++
	})
	if err != nil {
		return // shutting down
	}
	if res.Removed == 0 {
		log.Debug().Msg("the node has no not-ready taint")
		return
	}
	log.Info().Int("removed", res.Removed).Dur("waited", res.Waited).Msg("removed the not-ready taint from this node: pods starting here get their capture")
}
