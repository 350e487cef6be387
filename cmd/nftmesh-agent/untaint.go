package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/rs/zerolog"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/wait"
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

// untaintBackoff paces the retries; zero is nodetaint's (a second,
// doubling to a minute). Tests shorten it.
var untaintBackoff wait.Backoff

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
	u := &nodetaint.Untainter{Client: client, Node: cfg.NodeName, Key: cfg.NodeTaintKey, Backoff: untaintBackoff}
	res, err := u.RemoveWhenReady(ctx, ready, 200*time.Millisecond, untaintFailures(log, cfg.PodNamespace))
	if err != nil {
		return // shutting down
	}
	if res.Removed == 0 {
		log.Debug().Msg("the node has no not-ready taint")
		return
	}
	log.Info().Int("removed", res.Removed).Dur("waited", res.Waited).Msg("removed the not-ready taint from this node: pods starting here get their capture")
}

// noNodeRights is what an agent refused its node is told: the chart grants
// node rights only where an admission policy holds them to the agent's own
// node, which needs Kubernetes 1.30.
const noNodeRights = "the chart grants node rights only on Kubernetes 1.30 or later (a ValidatingAdmissionPolicy holds them to the agent's own node), " +
	"and `helm template` grants none without --kube-version 1.30 or later. " +
	"Before 1.30, istiod's untaint controller can remove the taint (pilot.taint.enabled=true, pilot.taint.namespace=%s); " +
	"nodes that never carry it need nothing (nodeTaint.enabled=false stops this). Retrying quietly: rights granted later still take the taint off"

// untaintFailures hears the untainter's failures. A refusal (no rights on
// the node, which retrying does not change) is said once, with the way
// out; other failures (the API server down) the first time, then every
// tenth: the retries back off to a minute, so at most a line per ten
// minutes.
func untaintFailures(log zerolog.Logger, namespace string) func(error) {
	forbidden, others := false, 0
	return func(err error) {
		if apierrors.IsForbidden(err) {
			if !forbidden {
				forbidden = true
				log.Warn().Err(err).Str("hint", fmt.Sprintf(noNodeRights, cmp.Or(namespace, "<the agent's namespace>"))).
					Msg("cannot remove the node taint: this agent has no rights on its node, so the taint stays until something else removes it")
			}
			return
		}
		if others%10 == 0 {
			log.Warn().Err(err).Int("attempt", others+1).Msg("cannot remove the node taint yet; retrying")
		}
		others++
	}
}
