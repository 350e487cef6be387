package installer

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/rs/zerolog"
	"golang.org/x/time/rate"

	"github.com/nftmesh/nftmesh/podinfo"
)

// debounce gathers a burst of file events (a rename makes several) into one
// reconcile.
const debounce = 20 * time.Millisecond

// errNoPrimary means the conf dir has no usable primary config yet; the
// loop then waits for the next conf dir event (watching, not polling).
var errNoPrimary = errors.New("no primary CNI config yet")

// parts of the install a file event can invalidate.
type parts uint8

const (
	partBinaries parts = 1 << iota
	partKubeconfig
	partConf
	partAll = partBinaries | partKubeconfig | partConf
)

// Installer installs the plugin on this node and keeps it installed.
type Installer struct {
	cfg  *Config
	log  zerolog.Logger
	m    *Metrics
	src  *binarySource
	ours json.RawMessage

	limiter *rate.Limiter

	mu          sync.Mutex
	st          agentState
	installed   bool        // at least one successful install: later rewrites are re-inserts
	reinserts   []time.Time // within the fight window
	lastWarn    time.Time
	lastPrimary string
	warned      map[string]string // skipped file → reason already logged

	ready   atomic.Bool
	lastErr atomic.Pointer[error]

	// Reconciled is signalled (non-blocking) after every reconcile; tests
	// wait on it instead of sleeping.
	Reconciled chan struct{}
}

// New checks what it can without writing anything (the plugin binary must
// be readable) and returns an Installer. m may be nil.
func New(cfg *Config, log zerolog.Logger, m *Metrics) (*Installer, error) {
	if m == nil {
		m = NewMetrics()
	}
	src, err := newBinarySource(cfg.PluginBinary)
	if err != nil {
		return nil, &ConfigError{Flag: "plugin-binary", Value: cfg.PluginBinary, Reason: err.Error()}
	}
	if cfg.Chained {
		// Fail on an unusable primary name before touching anything.
		if n := cfg.CNIConfFileName; n != "" && filepath.Ext(n) == "" {
			return nil, &ConfigError{Flag: "cni-conf-file-name", Value: n, Reason: "has no extension"}
		}
	}
	in := &Installer{
		cfg:        cfg,
		log:        log,
		m:          m,
		src:        src,
		ours:       cfg.PluginConf().JSON(),
		limiter:    rate.NewLimiter(rate.Limit(cfg.ReinstallRate), cfg.ReinstallBurst),
		Reconciled: make(chan struct{}, 1),
	}
	in.setNotReady(errors.New("not installed yet"))
	return in, nil
}

// Metrics returns the installer's metrics.
func (in *Installer) Metrics() *Metrics { return in.m }

func (in *Installer) statePath() string { return filepath.Join(in.cfg.AgentRunDir, StateFileName) }

func (in *Installer) setReady() {
	in.ready.Store(true)
	in.m.Ready.Set(1)
}

func (in *Installer) setNotReady(err error) {
	in.ready.Store(false)
	in.lastErr.Store(&err)
	in.m.Ready.Set(0)
}

// Ready reports nil only while the plugin is installed and valid: the last
// reconcile succeeded and a live check of the binary, the kubeconfig and
// the config still passes.
func (in *Installer) Ready() error {
	if !in.ready.Load() {
		if p := in.lastErr.Load(); p != nil {
			return *p
		}
		return errors.New("not installed")
	}
	for _, d := range in.cfg.CNIBinDirs {
		if err := in.src.looksInstalled(d); err != nil {
			return fmt.Errorf("plugin binary: %w", err)
		}
	}
	if in.cfg.ServiceAccountDir != "" {
		if _, err := os.Stat(in.cfg.KubeconfigPath()); err != nil {
			return fmt.Errorf("kubeconfig: %w", err)
		}
	}
	return in.checkConf(false)
}

// primary returns the config file to chain into, or errNoPrimary.
func (in *Installer) primary(logSkipped bool) (string, error) {
	if n := in.cfg.CNIConfFileName; n != "" {
		if p := ResolveNamed(in.cfg.CNIConfDir, n); p != "" {
			return p, nil
		}
		return "", fmt.Errorf("%w: %s not found in %s", errNoPrimary, n, in.cfg.CNIConfDir)
	}
	p, skipped, err := FindPrimary(in.cfg.CNIConfDir)
	if logSkipped {
		seen := map[string]string{}
		for _, s := range skipped {
			seen[s.Path] = s.Err.Error()
			if in.warned[s.Path] != s.Err.Error() { // once per file and reason
				in.log.Warn().Str("file", s.Path).Err(s.Err).Msg("skipping CNI config that the runtime would not load")
			}
		}
		in.warned = seen
	}
	if err != nil {
		return "", err
	}
	if p == "" {
		return "", fmt.Errorf("%w in %s", errNoPrimary, in.cfg.CNIConfDir)
	}
	return p, nil
}

func (in *Installer) standalonePath() string {
	return filepath.Join(in.cfg.CNIConfDir, in.cfg.CNIConfFileName)
}

func (in *Installer) standaloneBytes() []byte {
	var out bytes.Buffer
	_ = json.Indent(&out, in.ours, "", "  ")
	out.WriteByte('\n')
	return out.Bytes()
}

// checkConf reports whether the CNI config is as we want it.
func (in *Installer) checkConf(logSkipped bool) error {
	if !in.cfg.Chained {
		p := in.standalonePath()
		b, err := os.ReadFile(p)
		if err != nil {
			return fmt.Errorf("standalone config: %w", err)
		}
		if !sameEntry(b, in.ours) {
			return fmt.Errorf("standalone config %s differs from ours", p)
		}
		if _, err := LoadConfFile(p); err != nil {
			return err
		}
		return nil
	}
	p, err := in.primary(logSkipped)
	if err != nil {
		return err
	}
	lp := ListPath(p)
	if lp != p {
		return fmt.Errorf("primary config %s is a single plugin without %s", p, PluginName)
	}
	return VerifyInstalled(p, in.ours)
}

// installConf makes the CNI config hold our entry; wrote says whether it
// changed a file, and reinsert whether the primary had lost our entry
// after an earlier install.
func (in *Installer) installConf(ctx context.Context) (wrote bool, err error) {
	if !in.cfg.Chained {
		p := in.standalonePath()
		want := in.standaloneBytes()
		if have, err := os.ReadFile(p); err == nil && bytes.Equal(have, want) {
			return false, nil
		}
		if err := in.throttle(ctx, p, nil); err != nil {
			return false, err
		}
		mode, uid, gid := fileOwner(p, 0o644)
		if err := writeFileAtomic(p, want, mode, uid, gid); err != nil {
			return false, fmt.Errorf("writing standalone config %s: %w", p, err)
		}
		return true, nil
	}

	p, err := in.primary(true)
	if err != nil {
		return false, err
	}
	if p != in.lastPrimary {
		in.log.Info().Str("file", p).Msg("primary CNI config")
		in.lastPrimary = p
	}
	if err := in.checkConf(false); err == nil {
		return false, nil
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return false, fmt.Errorf("reading primary config %s: %w", p, err)
	}
	out, err := InsertPlugin(p, b, in.ours)
	if err != nil {
		return false, err
	}
	target := ListPath(p)
	hadOurs := HasPlugin(p, b)
	if err := in.throttle(ctx, p, b); err != nil {
		return false, err
	}

	in.mu.Lock()
	defer in.mu.Unlock()
	mode, uid, gid := fileOwner(p, 0o644)
	rec := confRecord{
		Written: target, WrittenSum: sum(out),
		Original: p, OriginalBytes: b, OriginalMode: mode, OriginalUID: uid, OriginalGID: gid,
	}
	if hadOurs {
		old := in.st.record(target)
		switch {
		case old != nil && target == p && old.WrittenSum == sum(b):
			// Our own earlier write, only our entry changed: the
			// primary's bytes are still the recorded ones.
			rec.Original, rec.OriginalBytes = old.Original, old.OriginalBytes
			rec.OriginalMode, rec.OriginalUID, rec.OriginalGID = old.OriginalMode, old.OriginalUID, old.OriginalGID
		default:
			// Left by an agent that lost its state: the best we can
			// restore is the primary without our entry.
			stripped, changed, err := RemovePlugin(p, b)
			if err == nil && changed {
				rec.OriginalBytes = stripped
			}
		}
	}
	in.st.put(rec)
	if err := saveState(in.statePath(), in.st); err != nil {
		return false, err
	}
	if err := writeFileAtomic(target, out, mode, uid, gid); err != nil {
		return false, fmt.Errorf("writing %s: %w", target, err)
	}
	if target != p {
		// The .conflist sorts after its .conf twin, so the runtime keeps
		// using the old file until it is gone: remove it last.
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return true, fmt.Errorf("removing %s after converting it to %s: %w", p, target, err)
		}
	}
	in.log.Info().Str("file", target).Str("primary", p).Msg("inserted " + PluginName + " into the CNI config")
	return true, nil
}

// throttle counts a re-insert, reports fights and waits for the limiter.
// primaryBytes (nil for standalone) names the likely culprit.
func (in *Installer) throttle(ctx context.Context, path string, primaryBytes []byte) error {
	if in.installed {
		in.m.Reinserts.Inc()
		now := time.Now()
		cut := now.Add(-in.cfg.FightWindow)
		kept := in.reinserts[:0]
		for _, t := range in.reinserts {
			if t.After(cut) {
				kept = append(kept, t)
			}
		}
		in.reinserts = append(kept, now)
		if len(in.reinserts) > in.cfg.FightThreshold {
			in.m.Fights.Inc()
			if now.Sub(in.lastWarn) >= in.cfg.FightWindow {
				in.lastWarn = now
				in.log.Warn().Str("file", path).Int("reinserts", len(in.reinserts)).Dur("window", in.cfg.FightWindow).
					Str("likely_cause", likelyCause(primaryBytes)).
					Msg("another component keeps rewriting the CNI config and removing " + PluginName + "; pods may start without capture until it stops")
			}
		}
	}
	if err := in.limiter.Wait(ctx); err != nil {
		return fmt.Errorf("waiting to rewrite %s: %w", path, err)
	}
	return nil
}

// likelyCause names the fix for the primary CNIs known to revert other
// plugins' entries.
func likelyCause(primary []byte) string {
	s := strings.ToLower(string(primary))
	switch {
	case strings.Contains(s, "cilium"):
		return "Cilium owns the CNI config exclusively: set the Cilium Helm value cni.exclusive=false"
	case strings.Contains(s, "calico"):
		return "Calico's install-cni rewrites the config on every restart: check that calico-node is not crash-looping, and chain nftmesh-cni with cniConfFileName pointing at Calico's file"
	case strings.Contains(s, "aws-cni") || strings.Contains(s, "vpc-cni"):
		return "the AWS VPC CNI rewrites its config: check the aws-node DaemonSet"
	case strings.Contains(s, "flannel"):
		return "flannel's install container rewrites its config: check for a restarting kube-flannel pod"
	}
	return "another CNI installer or a configuration-management tool rewrites the file; make it stop, or use chained: false with Multus"
}

// reconcile brings the dirty parts to the wanted state.
func (in *Installer) reconcile(ctx context.Context, dirty parts) (wrote bool, result string, err error) {
	if dirty&partBinaries != 0 {
		for _, d := range in.cfg.CNIBinDirs {
			w, err := in.src.install(d)
			if err != nil {
				return wrote, ResultCopyBinaries, err
			}
			if w {
				wrote = true
				in.log.Info().Str("dir", d).Msg("installed " + PluginName + " binary")
			}
		}
	}
	if dirty&partKubeconfig != 0 && in.cfg.ServiceAccountDir != "" {
		b, err := RenderKubeconfig(in.cfg.KubeAPIServer, in.cfg.ServiceAccountDir, in.cfg.KubeCAFile)
		if err != nil {
			return wrote, ResultKubeconfig, err
		}
		w, err := syncKubeconfig(in.cfg.KubeconfigPath(), b)
		if err != nil {
			return wrote, ResultKubeconfig, err
		}
		if w {
			wrote = true
			// A session resumed under the old kubeconfig's CA must not
			// outlive it (the file names hash the CA; this drops leftovers).
			if err := podinfo.RemoveTLSSessions(in.cfg.AgentRunDir); err != nil {
				in.log.Warn().Err(err).Msg("removing the plugin's old TLS sessions")
			}
			in.log.Info().Str("file", in.cfg.KubeconfigPath()).Str("server", in.cfg.KubeAPIServer).Msg("wrote the plugin's kubeconfig")
		}
	}
	if dirty&partConf != 0 {
		w, err := in.installConf(ctx)
		if err != nil {
			if errors.Is(err, errNoPrimary) {
				return wrote, ResultWaitingForPrimary, err
			}
			return wrote, ResultCNIConfig, err
		}
		wrote = wrote || w
	}
	return wrote, ResultSuccess, nil
}

// watchSet classifies file events by what they invalidate.
type watchSet struct {
	confDir, runDir, saDir string
	binDirs                map[string]bool
}

func (w *watchSet) classify(ev fsnotify.Event) parts {
	dir, base := filepath.Dir(ev.Name), filepath.Base(ev.Name)
	if isOurTemp(base) {
		return 0
	}
	var p parts
	if w.binDirs[dir] && base == PluginName {
		p |= partBinaries
	}
	if dir == w.confDir {
		p |= partConf
	}
	if dir == w.runDir && base == "kubeconfig" {
		p |= partKubeconfig
	}
	if w.saDir != "" && dir == w.saDir {
		p |= partKubeconfig
	}
	return p
}

// Run installs the plugin and keeps it installed until ctx ends. It does
// not clean up: call Cleanup after it returns.
func (in *Installer) Run(ctx context.Context) error {
	cfg := in.cfg
	if err := os.MkdirAll(cfg.AgentRunDir, 0o755); err != nil {
		return fmt.Errorf("creating run dir: %w", err)
	}
	if err := os.MkdirAll(cfg.CNIConfDir, 0o755); err != nil {
		return fmt.Errorf("creating CNI conf dir: %w", err)
	}
	st, err := loadState(in.statePath())
	if err != nil {
		in.log.Warn().Err(err).Msg("ignoring unreadable agent state; cleanup will strip our entry instead of restoring bytes")
	}
	in.mu.Lock()
	in.st = st
	in.mu.Unlock()
	for _, d := range []string{cfg.CNIConfDir, cfg.AgentRunDir} {
		if err := removeLeftovers(d); err != nil {
			in.log.Warn().Err(err).Msg("removing leftovers")
		}
	}

	watcher, err := fsnotify.NewBufferedWatcher(256)
	if err != nil {
		return fmt.Errorf("creating file watcher: %w", err)
	}
	defer watcher.Close()
	ws := &watchSet{confDir: cfg.CNIConfDir, runDir: cfg.AgentRunDir, saDir: cfg.ServiceAccountDir, binDirs: map[string]bool{}}
	for _, d := range cfg.CNIBinDirs {
		ws.binDirs[d] = true
	}
	addWatches := func() error {
		dirs := append([]string{cfg.CNIConfDir, cfg.AgentRunDir}, cfg.CNIBinDirs...)
		if cfg.ServiceAccountDir != "" {
			dirs = append(dirs, cfg.ServiceAccountDir)
		}
		for _, d := range dirs {
			if err := watcher.Add(d); err != nil {
				return fmt.Errorf("watching %s: %w", d, err)
			}
		}
		return nil
	}

	dirty := partAll
	backoff := time.Second
	for {
		// Watch before checking, so a change made between the check and
		// the wait still wakes us.
		werr := addWatches()
		var result string
		var wrote bool
		if werr == nil {
			wrote, result, err = in.reconcile(ctx, dirty)
		} else {
			result, err = ResultCopyBinaries, werr
			if strings.Contains(werr.Error(), cfg.CNIConfDir) {
				result = ResultCNIConfig
			}
		}
		if ctx.Err() != nil {
			return nil
		}
		var retry <-chan time.Time
		switch {
		case err == nil:
			if wrote || !in.ready.Load() {
				in.m.Installs.WithLabelValues(ResultSuccess).Inc()
				in.log.Info().Msg(PluginName + " installed and valid")
			}
			in.installed = true
			in.setReady()
			dirty = 0
			backoff = time.Second
		case errors.Is(err, errNoPrimary):
			if in.ready.Load() || in.lastErr.Load() == nil || !errors.Is(*in.lastErr.Load(), errNoPrimary) {
				in.log.Info().Err(err).Msg("waiting for the primary CNI to write its config")
			}
			in.setNotReady(err)
			dirty = partConf
		default:
			in.m.Installs.WithLabelValues(result).Inc()
			in.setNotReady(err)
			var ro *ReadOnlyError
			ev := in.log.Error().Err(err).Str("result", result)
			if errors.As(err, &ro) {
				ev = ev.Str("hint", "set cniBinDir or use a platform profile")
			}
			ev.Dur("retry_in", backoff).Msg("installing " + PluginName)
			retry = time.After(backoff)
			backoff = min(backoff*2, 30*time.Second)
			dirty = partAll
		}
		select {
		case in.Reconciled <- struct{}{}:
		default:
		}

		// Wait for the next relevant event.
		for got := parts(0); got == 0; {
			select {
			case <-ctx.Done():
				return nil
			case <-retry:
				got = partAll
			case ev, ok := <-watcher.Events:
				if !ok {
					return errors.New("file watcher closed")
				}
				got = ws.classify(ev)
			case werr, ok := <-watcher.Errors:
				if !ok {
					return errors.New("file watcher closed")
				}
				// An overflow means lost events: recheck everything.
				in.log.Warn().Err(werr).Msg("file watch error; rechecking everything")
				got = partAll
			}
			if got != 0 {
				dirty |= got
				// Gather the rest of the burst.
				t := time.NewTimer(debounce)
			burst:
				for {
					select {
					case ev, ok := <-watcher.Events:
						if !ok {
							break burst
						}
						dirty |= ws.classify(ev)
					case <-t.C:
						break burst
					case <-ctx.Done():
						t.Stop()
						return nil
					}
				}
				t.Stop()
			}
		}
		if err := in.checkConf(false); err != nil && in.ready.Load() {
			in.setNotReady(err)
		}
	}
}

// Cleanup undoes the install: our entry leaves the CNI config (restoring the
// primary's own bytes when the file is still what we wrote), then the
// kubeconfig and the binaries go. It keeps going after an error and
// returns them all.
func (in *Installer) Cleanup() error {
	in.setNotReady(errors.New("shutting down"))
	var errs []error
	cfg := in.cfg
	if cfg.Chained {
		in.mu.Lock()
		st := in.st
		if len(st.Confs) == 0 {
			if s, err := loadState(in.statePath()); err == nil {
				st = s
			}
		}
		in.mu.Unlock()
		var left []confRecord
		for _, r := range st.Confs {
			if err := restoreRecord(r); err != nil {
				errs = append(errs, err)
				left = append(left, r)
			} else {
				in.log.Info().Str("file", r.Original).Msg("removed " + PluginName + " from the CNI config")
			}
		}
		// A primary we never recorded (state lost) may still hold our entry.
		if p, _, err := FindPrimary(cfg.CNIConfDir); err == nil && p != "" {
			if err := stripFile(p); err != nil {
				errs = append(errs, err)
			}
		}
		in.mu.Lock()
		in.st = agentState{Confs: left}
		if err := saveState(in.statePath(), in.st); err != nil {
			errs = append(errs, err)
		}
		in.mu.Unlock()
	} else {
		p := in.standalonePath()
		if b, err := os.ReadFile(p); err == nil {
			if t, err := pluginType(b); err == nil && t == PluginName {
				if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
					errs = append(errs, fmt.Errorf("removing standalone config %s: %w", p, err))
				}
			}
		}
	}
	if cfg.ServiceAccountDir != "" {
		if err := os.Remove(cfg.KubeconfigPath()); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("removing kubeconfig: %w", err))
		}
		if err := podinfo.RemoveTLSSessions(cfg.AgentRunDir); err != nil {
			errs = append(errs, fmt.Errorf("removing the plugin's TLS sessions: %w", err))
		}
	}
	for _, d := range cfg.CNIBinDirs {
		if err := removeBinary(d); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// restoreRecord undoes one rewrite.
func restoreRecord(r confRecord) error {
	cur, err := os.ReadFile(r.Written)
	if errors.Is(err, fs.ErrNotExist) {
		return nil // the primary removed it; nothing of ours is left there
	}
	if err != nil {
		return fmt.Errorf("reading %s for cleanup: %w", r.Written, err)
	}
	if sum(cur) != r.WrittenSum {
		// Changed after our write: keep the change, drop only our entry.
		return stripFile(r.Written)
	}
	if r.Original == r.Written {
		if err := writeFileAtomic(r.Written, r.OriginalBytes, r.OriginalMode, r.OriginalUID, r.OriginalGID); err != nil {
			return fmt.Errorf("restoring %s: %w", r.Written, err)
		}
		return nil
	}
	// We had turned Original (.conf) into Written (.conflist). Put the .conf
	// back first (it sorts first, so the runtime switches to it at once),
	// unless the primary already wrote a new one.
	if _, err := os.Stat(r.Original); errors.Is(err, fs.ErrNotExist) {
		if err := writeFileAtomic(r.Original, r.OriginalBytes, r.OriginalMode, r.OriginalUID, r.OriginalGID); err != nil {
			return fmt.Errorf("restoring %s: %w", r.Original, err)
		}
	}
	if err := os.Remove(r.Written); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing %s: %w", r.Written, err)
	}
	return nil
}

// stripFile removes our entry from a list file, keeping its mode and owner.
func stripFile(path string) error {
	if !isListFile(path) {
		return nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("reading %s for cleanup: %w", path, err)
	}
	out, changed, err := RemovePlugin(path, b)
	if err != nil || !changed {
		return err
	}
	mode, uid, gid := fileOwner(path, 0o644)
	if err := writeFileAtomic(path, out, mode, uid, gid); err != nil {
		return fmt.Errorf("removing %s from %s: %w", PluginName, path, err)
	}
	return nil
}
