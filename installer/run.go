package installer

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/nftmesh/nftmesh/installer/metrics"
	"github.com/nftmesh/nftmesh/internal/atomicfile"
)

// reconcile brings the dirty parts to the wanted state.
func (in *Installer) reconcile(ctx context.Context, dirty parts) (wrote bool, result string, err error) {
	// The kubeconfig before the binary: a plugin binary of this version
	// reads only the JSON kubeconfig this version writes, and an older one
	// reads JSON too.
	if dirty&partKubeconfig != 0 && in.cfg.ServiceAccountDir != "" {
		b, err := RenderKubeconfig(in.cfg.KubeAPIServer, in.cfg.ServiceAccountDir, in.cfg.KubeCAFile)
		if err != nil {
			return wrote, metrics.ResultKubeconfig, err
		}
		w, err := syncKubeconfig(in.cfg.KubeconfigPath(), b)
		if err != nil {
			return wrote, metrics.ResultKubeconfig, err
		}
		if err := removeLegacyTLSSessions(in.cfg.AgentRunDir); err != nil {
			in.log.Warn().Err(err).Msg("removing an older plugin's TLS session files")
		}
		if w {
			wrote = true
			in.log.Info().Str("file", in.cfg.KubeconfigPath()).Str("server", in.cfg.KubeAPIServer).Msg("wrote the plugin's kubeconfig")
		}
	}
	if dirty&partBinaries != 0 {
		for _, d := range in.cfg.CNIBinDirs {
			for _, b := range in.bins {
				w, err := b.install(d)
				if err != nil {
					return wrote, metrics.ResultCopyBinaries, err
				}
				if w {
					wrote = true
					in.log.Info().Str("dir", d).Str("binary", b.name).Msg("installed the " + b.name + " binary")
				}
			}
		}
	}
	if dirty&partConf != 0 {
		w, err := in.installConf(ctx)
		if err != nil {
			if errors.Is(err, errNoPrimary) {
				return wrote, metrics.ResultWaitingForPrimary, err
			}
			return wrote, metrics.ResultCNIConfig, err
		}
		wrote = wrote || w
	}
	return wrote, metrics.ResultSuccess, nil
}

// Run installs the plugin and keeps it installed until ctx ends. It does
// not clean up: call Cleanup after it returns.
func (in *Installer) Run(ctx context.Context) error {
	if err := in.prepare(); err != nil {
		return err
	}
	cw, err := in.newConfWatch()
	if err != nil {
		return err
	}
	defer cw.w.Close()

	turn := loopState{dirty: partAll, backoff: installBackoff}
	for {
		// Watch before checking, so a change made between the check and
		// the wait still wakes us.
		werr := cw.addAll()
		var result string
		var wrote bool
		if werr == nil {
			wrote, result, err = in.reconcile(ctx, turn.dirty)
		} else {
			result, err = metrics.ResultCopyBinaries, werr
			if strings.Contains(werr.Error(), in.cfg.CNIConfDir) {
				result = metrics.ResultCNIConfig
			}
		}
		if ctx.Err() != nil {
			return nil
		}
		retry := in.report(err, result, wrote, &turn)
		select {
		case in.Reconciled <- struct{}{}:
		default:
		}

		got, done, err := in.wait(ctx, cw, retry)
		if done || err != nil {
			return err
		}
		turn.dirty |= got
		if err := in.checkConf(false); err != nil && in.notReady.Load() == nil {
			in.setNotReady(err)
		}
	}
}

// prepare creates the run and conf dirs, loads the undo record an earlier
// agent left (moving an older agent's run dir state into it), and removes
// temp files an interrupted write left.
func (in *Installer) prepare() error {
	cfg := in.cfg
	if err := os.MkdirAll(cfg.AgentRunDir, 0o755); err != nil {
		return fmt.Errorf("creating run dir: %w", err)
	}
	if err := os.MkdirAll(cfg.CNIConfDir, 0o755); err != nil {
		return fmt.Errorf("creating CNI conf dir: %w", err)
	}
	st, legacy, err := in.loadUndo()
	if err != nil {
		in.log.Warn().Err(err).Msg("ignoring unreadable agent state; cleanup will strip our entry instead of restoring bytes")
	}
	if legacy {
		if err := in.moveLegacy(st); err != nil {
			in.log.Warn().Err(err).Msg("keeping the agent state in the run dir, where a reboot loses it")
		} else {
			in.log.Info().Str("from", in.legacyStatePath()).Str("to", in.undo.path()).Msg("moved the agent state into the undo record")
		}
	}
	in.mu.Lock()
	in.st = st
	in.mu.Unlock()
	dirs := []string{cfg.CNIConfDir, cfg.AgentRunDir}
	if fi, err := os.Lstat(in.undo.dir()); err == nil && fi.IsDir() {
		dirs = append(dirs, in.undo.dir())
	}
	for _, d := range dirs {
		if err := atomicfile.RemoveLeftovers(d); err != nil {
			in.log.Warn().Err(err).Msg("removing leftovers")
		}
	}
	return nil
}

// loopState is what one turn of Run hands the next: the parts to check
// again and the backoff of a failing install.
type loopState struct {
	dirty   parts
	backoff wait.Backoff
}

// installBackoff spaces the retries of a failing install: 1 s, doubling up
// to 30 s, for as long as the agent runs. Each success starts a new copy.
var installBackoff = wait.Backoff{Duration: time.Second, Factor: 2, Cap: 30 * time.Second, Steps: math.MaxInt32}

// report records the outcome of a reconcile (metrics, readiness, a log line
// when the state changes) and sets what the next turn checks; the channel
// it returns fires when the next turn is due without an event.
func (in *Installer) report(err error, result string, wrote bool, turn *loopState) (retry <-chan time.Time) {
	var fe *ForeignCaptureError
	if !errors.As(err, &fe) {
		in.m.ForeignCapture.Reset()
		in.refused = ""
	}
	switch {
	case errors.As(err, &fe):
		// Not a failure to retry on a timer: the next change of the
		// config (the other plugin's removal) is what helps.
		in.m.ForeignCapture.WithLabelValues(fe.Plugin).Set(1)
		if msg := err.Error(); msg != in.refused || fe.Removed {
			in.refused = msg
			in.log.Error().Err(err).Str("file", fe.File).Str("plugin", fe.Plugin).Bool("removed_ours", fe.Removed).
				Msg("refusing to chain " + PluginName + " next to another capture plugin")
		}
		in.setNotReady(err)
		turn.dirty = partConf
	case err == nil:
		if wrote || in.notReady.Load() != nil {
			in.m.Install(metrics.ResultSuccess)
			in.log.Info().Msg(PluginName + " installed and valid")
		}
		in.installed = true
		in.notReady.Store(nil)
		in.m.SetReady(true)
		turn.dirty = 0
		turn.backoff = installBackoff
	case errors.Is(err, errNoPrimary):
		if p := in.notReady.Load(); p == nil || !errors.Is(*p, errNoPrimary) {
			in.log.Info().Err(err).Msg("waiting for the primary CNI to write its config")
		}
		in.setNotReady(err)
		turn.dirty = partConf
	case errors.Is(err, errChanged):
		// The primary is still writing its config (a burst on its
		// start): not a failure, the next write's event (or the
		// timer, if that event came too early) tries again.
		in.log.Warn().Err(err).Msg("the CNI config keeps changing; inserting " + PluginName + " after its next change")
		in.setNotReady(err)
		retry = time.After(time.Second)
		turn.dirty = partConf
	default:
		in.m.Install(result)
		in.setNotReady(err)
		var ro *ReadOnlyError
		ev := in.log.Error().Err(err).Str("result", result)
		if errors.As(err, &ro) {
			ev = ev.Str("hint", "set cniBinDir or use a platform profile")
		}
		d := turn.backoff.Step()
		ev.Dur("retry_in", d).Msg("installing " + PluginName)
		retry = time.After(d)
		turn.dirty = partAll
	}
	return retry
}
