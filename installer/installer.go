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
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/fsnotify/fsnotify"
	"github.com/rs/zerolog"
	"golang.org/x/time/rate"

	"github.com/nftmesh/nftmesh/installer/conflist"
	"github.com/nftmesh/nftmesh/installer/metrics"
	"github.com/nftmesh/nftmesh/internal/atomicfile"
)

// debounce gathers a burst of events (a rename makes several) into one reconcile.
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

// ForeignCaptureError means the primary config also chains another capture
// plugin (Istio's istio-cni): the agent does not insert ours next to it.
type ForeignCaptureError struct {
	File, Plugin string
	Removed      bool // our entry (standalone: our file) was there too and was taken out
	Standalone   bool // refusing standalone (Multus) mode: the other plugin has a file of its own
}

func (e *ForeignCaptureError) Error() string {
	if e.Standalone {
		return fmt.Sprintf("%s is the config of %s: %s writes no standalone config beside it (or over it), as two capture plugins would both program every pod's redirect rules and fight over its traffic; "+
			"uninstall Istio's CNI node agent (a leftover %s must be removed by hand) and %s writes its own",
			e.File, e.Plugin, PluginName, e.File, PluginName)
	}
	return fmt.Sprintf("%s chains %s: %s is not inserted next to it, as two capture plugins would both program every pod's redirect rules and fight over its traffic; "+
		"uninstall Istio's CNI node agent (a leftover %s entry must be removed from the file by hand) and %s inserts itself",
		e.File, e.Plugin, PluginName, e.Plugin, PluginName)
}

// foreignCapture refuses a primary config that chains another capture
// plugin. Our entry, if it is there too, is taken out (the other plugin
// was added after ours: a rollback to it is under way).
func (in *Installer) foreignCapture(p string) error {
	s, err := readSnapshot(p)
	if err != nil || !s.exists {
		return nil // the insert reads it again and reports
	}
	other := conflist.ForeignCapture(p, s.data)
	if other == "" {
		return nil
	}
	fe := &ForeignCaptureError{File: p, Plugin: other}
	if conflist.HasPlugin(p, s.data) {
		if err := stripFile(p); err != nil {
			return fmt.Errorf("%w; and removing our entry failed: %w", fe, err)
		}
		fe.Removed = true
	}
	return fe
}

// standaloneForeign is foreignCapture for standalone mode, over every config
// file in the conf dir (ours included): Istio's agent writes a file of its
// own there, which a runtime or Multus would load beside ours. With remove,
// our file, if it is there, is taken out.
func (in *Installer) standaloneForeign(remove bool) error {
	ents, err := os.ReadDir(in.cfg.CNIConfDir)
	if err != nil {
		return nil // the write reports it
	}
	own := in.standalonePath()
	for _, e := range ents {
		p := filepath.Join(in.cfg.CNIConfDir, e.Name())
		if !slices.Contains(conflist.ConfExtensions, filepath.Ext(p)) {
			continue
		}
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		other := conflist.ForeignCapture(p, b)
		if other == "" {
			continue
		}
		fe := &ForeignCaptureError{File: p, Plugin: other, Standalone: true}
		if have, err := os.ReadFile(own); remove && p != own && err == nil && conflist.SameEntry(have, in.ours) {
			if err := os.Remove(own); err != nil && !os.IsNotExist(err) {
				return fmt.Errorf("%w; and removing our standalone config %s failed: %w", fe, own, err)
			}
			fe.Removed = true
		}
		return fe
	}
	return nil
}

// Installer installs the plugin on this node and keeps it installed.
type Installer struct {
	cfg  *Config
	log  zerolog.Logger
	m    *metrics.Metrics
	bins []*binarySource // in install order: see binarySources
	ours json.RawMessage

	limiter *rate.Limiter

	mu          sync.Mutex
	st          agentState // the undo record as last saved to undo
	undo        undoStore
	installed   bool        // at least one successful install: later rewrites are re-inserts
	reinserts   []time.Time // within the fight window
	lastWarn    time.Time
	lastPrimary string
	warned      map[string]string // skipped file → reason already logged
	refused     string            // the foreign-capture refusal last logged

	notReady atomic.Pointer[error] // why the plugin is not ready; nil while it is

	// Reconciled is signalled (non-blocking) after every reconcile, for tests.
	Reconciled chan struct{}
}

// New checks what it can without writing anything (the plugin binary and
// its companion must be readable) and returns an Installer. m may be nil.
func New(cfg *Config, log zerolog.Logger, m *metrics.Metrics) (*Installer, error) {
	if m == nil {
		m = metrics.New()
	}
	bins, err := binarySources(cfg.PluginBinary)
	if err != nil {
		return nil, err
	}
	// Fail on an unusable primary name before touching anything.
	if n := cfg.CNIConfFileName; cfg.Chained && n != "" && filepath.Ext(n) == "" {
		return nil, &ConfigError{Flag: "cni-conf-file-name", Value: n, Reason: "has no extension"}
	}
	in := &Installer{
		cfg:        cfg,
		log:        log,
		m:          m,
		bins:       bins,
		ours:       cfg.PluginConf().JSON(),
		limiter:    rate.NewLimiter(rate.Limit(cfg.ReinstallRate), cfg.ReinstallBurst),
		undo:       undoStore{confDir: cfg.CNIConfDir},
		Reconciled: make(chan struct{}, 1),
	}
	in.setNotReady(errors.New("not installed yet"))
	return in, nil
}

func (in *Installer) legacyStatePath() string {
	return filepath.Join(in.cfg.AgentRunDir, legacyStateName)
}

func (in *Installer) setNotReady(err error) {
	in.notReady.Store(&err)
	in.m.SetReady(false)
}

// Ready reports nil only while the plugin is installed and valid: the last
// reconcile succeeded and a live check of the binary, the kubeconfig and
// the config still passes.
func (in *Installer) Ready() error {
	if p := in.notReady.Load(); p != nil {
		return *p
	}
	for _, d := range in.cfg.CNIBinDirs {
		for _, b := range in.bins {
			if err := b.looksInstalled(d); err != nil {
				return fmt.Errorf("%s binary: %w", b.name, err)
			}
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
		if p := conflist.ResolveNamed(in.cfg.CNIConfDir, n); p != "" {
			return p, nil
		}
		return "", fmt.Errorf("%w: %s not found in %s", errNoPrimary, n, in.cfg.CNIConfDir)
	}
	p, skipped, err := conflist.FindPrimary(in.cfg.CNIConfDir)
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
		if err := in.standaloneForeign(false); err != nil {
			return err
		}
		p := in.standalonePath()
		b, err := os.ReadFile(p)
		if err != nil {
			return fmt.Errorf("standalone config: %w", err)
		}
		if !conflist.SameEntry(b, in.ours) {
			return fmt.Errorf("standalone config %s differs from ours", p)
		}
		_, err = conflist.LoadConfFile(p)
		return err
	}
	p, err := in.primary(logSkipped)
	if err != nil {
		return err
	}
	if conflist.ListPath(p) != p {
		return fmt.Errorf("primary config %s is a single plugin without %s", p, PluginName)
	}
	if b, err := os.ReadFile(p); err == nil {
		if other := conflist.ForeignCapture(p, b); other != "" {
			return &ForeignCaptureError{File: p, Plugin: other}
		}
	}
	return conflist.VerifyInstalled(p, in.ours)
}

// installConf makes the CNI config hold our entry; wrote says whether it
// changed a file. A rewrite after the first install counts as a re-insert.
func (in *Installer) installConf(ctx context.Context) (wrote bool, err error) {
	if !in.cfg.Chained {
		if err := in.standaloneForeign(true); err != nil {
			return false, err
		}
		p := in.standalonePath()
		want := in.standaloneBytes()
		if have, err := os.ReadFile(p); err == nil && bytes.Equal(have, want) {
			return false, nil
		}
		if err := in.throttle(ctx, p); err != nil {
			return false, err
		}
		mode, uid, gid := fileOwner(p, 0o644)
		if err := writeFileAtomic(p, want, mode, uid, gid); err != nil {
			return false, fmt.Errorf("writing standalone config %s: %w", p, err)
		}
		in.countReinsert(p)
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
	if err := in.foreignCapture(p); err != nil {
		return false, err
	}
	if err := in.checkConf(false); err == nil {
		return false, nil
	}
	// Wait first and read after: bytes read before a wait may be stale by
	// the time they are written.
	if err := in.throttle(ctx, p); err != nil {
		return false, err
	}
	err = retryChanged(fmt.Sprintf("inserting %s into %s (retrying on its next change)", PluginName, p), func() error {
		w, err := in.insertOnce()
		wrote = wrote || w
		return err
	})
	if wrote {
		in.countReinsert(p)
	}
	return wrote, err
}

// insertOnce reads the primary config and writes it back with our entry,
// unless it changes in between (errChanged: read again). The state file
// records the primary's bytes just read, so cleanup restores its latest
// version, never an older one.
func (in *Installer) insertOnce() (bool, error) {
	p, err := in.primary(false)
	if err != nil {
		return false, err
	}
	if err := in.checkConf(false); err == nil {
		return false, nil
	}
	base, err := readSnapshot(p)
	if err != nil {
		return false, fmt.Errorf("reading primary config: %w", err)
	}
	if !base.exists {
		return false, errChanged // gone since discovery: discover again
	}
	if err := complete(base); err != nil {
		return false, err
	}
	out, err := conflist.InsertPlugin(p, base.data, in.ours)
	if err != nil {
		return false, err
	}
	target, cur := conflist.ListPath(p), base
	if target != p {
		if cur, err = readSnapshot(target); err != nil {
			return false, fmt.Errorf("reading %s before converting %s: %w", target, p, err)
		}
	}

	in.mu.Lock()
	defer in.mu.Unlock()
	rec, prev := in.recordInsert(p, target, base, out)
	if err := in.writeRecorded(rec, prev, cur, out, base); err != nil {
		return false, err
	}
	if target != p {
		// The .conflist sorts after its .conf twin, so the runtime keeps
		// using the old file until it is gone: remove it last, and only
		// while it is still the version we converted.
		if err := removeIfUnchanged(base); err != nil {
			return true, unlessChanged(err, "removing %s after converting it to %s", p, target)
		}
	}
	in.log.Info().Str("file", target).Str("primary", p).Msg("inserted " + PluginName + " into the CNI config")
	return true, nil
}

// recordInsert is the state record of writing out to target in place of
// the primary p (base), and the record it replaces, if any. in.mu is held.
func (in *Installer) recordInsert(p, target string, base snapshot, out []byte) (confRecord, *confRecord) {
	b := base.data
	rec := confRecord{
		Written: target, WrittenSum: sum(out),
		Original: p, OriginalBytes: b, OriginalMode: base.mode, OriginalUID: base.uid, OriginalGID: base.gid,
	}
	if target != p {
		// A linked .conf goes away as a link and comes back as one.
		rec.OriginalLink, _ = os.Readlink(p)
	}
	var prev *confRecord
	if old := in.st.record(target); old != nil {
		c := *old
		prev = &c
	}
	if !conflist.HasPlugin(p, b) {
		return rec, prev
	}
	stripped, changed, err := conflist.RemovePlugin(p, b)
	switch {
	case prev != nil && target == p && (prev.WrittenSum == sum(b) ||
		err == nil && changed && prev.Original == p && conflist.SameEntry(stripped, prev.OriginalBytes)):
		// Our own earlier write, or one where only our entry
		// changed (edited, or moved from last): the primary's bytes
		// are still the recorded ones.
		rec = *prev
		rec.WrittenSum = sum(out)
	case err == nil && changed:
		// Written by someone else with our entry in it (or left by
		// an agent that lost its state): the best original is that
		// content without our entry.
		rec.OriginalBytes = stripped
	}
	return rec, prev
}

// writeRecorded saves rec, then writes out over cur with base's mode and
// owner unless cur changed (errChanged); on failure the state goes back to
// prev. The record is on disk (synced) before the write starts, so a crash
// or power loss at any point after still knows the original. in.mu is held.
func (in *Installer) writeRecorded(rec confRecord, prev *confRecord, cur snapshot, out []byte, base snapshot) error {
	in.st.put(rec)
	if err := in.undo.save(in.st); err != nil {
		in.st.drop(rec.Written, prev)
		return err
	}
	if err := replaceIfUnchanged(cur, out, base.mode, base.uid, base.gid); err != nil {
		in.st.drop(rec.Written, prev)
		if serr := in.undo.save(in.st); serr != nil {
			in.log.Warn().Err(serr).Msg("restoring the agent state after a failed write")
		}
		return unlessChanged(err, "writing %s", rec.Written)
	}
	return nil
}

func (in *Installer) throttle(ctx context.Context, path string) error {
	if err := in.limiter.Wait(ctx); err != nil {
		return fmt.Errorf("waiting to rewrite %s: %w", path, err)
	}
	return nil
}

// countReinsert counts a rewrite after the first install and reports a
// fight, naming the likely culprit from path's content.
func (in *Installer) countReinsert(path string) {
	if !in.installed {
		return
	}
	in.m.Reinserts.Inc()
	now := time.Now()
	cut := now.Add(-in.cfg.FightWindow)
	in.reinserts = append(slices.DeleteFunc(in.reinserts, func(t time.Time) bool { return !t.After(cut) }), now)
	if len(in.reinserts) > in.cfg.FightThreshold {
		in.m.Fights.Inc()
		if now.Sub(in.lastWarn) >= in.cfg.FightWindow {
			in.lastWarn = now
			in.log.Warn().Str("file", path).Int("reinserts", len(in.reinserts)).Dur("window", in.cfg.FightWindow).
				Str("likely_cause", likelyCause(path)).
				Msg("another component keeps rewriting the CNI config and removing " + PluginName + "; pods may start without capture until it stops")
		}
	}
}

// likelyCause names the fix for the primary CNIs known to revert other
// plugins' entries, from the config file they write.
func likelyCause(path string) string {
	primary, _ := os.ReadFile(path)
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

	turn := loopState{dirty: partAll, backoff: time.Second}
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

// confWatch is the fsnotify watch of every directory whose changes can
// undo the install: conf dir (and the dirs of linked configs), run dir,
// bin dirs and the service account dir.
type confWatch struct {
	in       *Installer
	w        *fsnotify.Watcher
	confDirs map[string]bool // the conf dir and linked configs' dirs
	binDirs  map[string]bool
}

func (in *Installer) newConfWatch() (*confWatch, error) {
	watcher, err := fsnotify.NewBufferedWatcher(256)
	if err != nil {
		return nil, fmt.Errorf("creating file watcher: %w", err)
	}
	cw := &confWatch{in: in, w: watcher, confDirs: map[string]bool{in.cfg.CNIConfDir: true}, binDirs: map[string]bool{}}
	for _, d := range in.cfg.CNIBinDirs {
		cw.binDirs[d] = true
	}
	return cw, nil
}

// classify says which parts of the install an event invalidates.
func (cw *confWatch) classify(ev fsnotify.Event) parts {
	cfg := cw.in.cfg
	dir, base := filepath.Dir(ev.Name), filepath.Base(ev.Name)
	if atomicfile.IsTemp(base) {
		return 0
	}
	var p parts
	if cw.binDirs[dir] && (base == PluginName || base == StandaloneName) {
		p |= partBinaries
	}
	if cw.confDirs[dir] {
		p |= partConf
	}
	if dir == cfg.AgentRunDir && base == "kubeconfig" || cfg.ServiceAccountDir != "" && dir == cfg.ServiceAccountDir {
		p |= partKubeconfig
	}
	return p
}

// addAll watches every directory (again: a directory that was removed
// and recreated needs a new watch).
func (cw *confWatch) addAll() error {
	cfg := cw.in.cfg
	dirs := append([]string{cfg.CNIConfDir, cfg.AgentRunDir}, cfg.CNIBinDirs...)
	if cfg.ServiceAccountDir != "" {
		dirs = append(dirs, cfg.ServiceAccountDir)
	}
	for _, d := range dirs {
		if err := cw.w.Add(d); err != nil {
			return fmt.Errorf("watching %s: %w", d, err)
		}
	}
	cw.watchLinked()
	return nil
}

// watchLinked watches the directories of the primary's symlinked configs:
// a config that is a symlink changes in its target's directory, which the
// conf dir's watch does not see. added reports a new watch.
func (cw *confWatch) watchLinked() (added bool) {
	in := cw.in
	if in.lastPrimary == "" {
		return false
	}
	for _, p := range []string{in.lastPrimary, conflist.ListPath(in.lastPrimary)} {
		if fi, err := os.Lstat(p); err != nil || fi.Mode()&fs.ModeSymlink == 0 {
			continue
		}
		rp, err := resolve(p)
		d := filepath.Dir(rp)
		if err != nil || cw.confDirs[d] {
			continue
		}
		if err := cw.w.Add(d); err != nil {
			in.log.Warn().Err(err).Str("dir", d).Msg("watching the directory of a linked CNI config; its changes are seen on the next conf dir event only")
			continue
		}
		cw.confDirs[d] = true
		added = true
	}
	return added
}

// loopState is what one turn of Run hands the next: the parts to check
// again and the backoff of a failing install.
type loopState struct {
	dirty   parts
	backoff time.Duration
}

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
		turn.backoff = time.Second
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
		ev.Dur("retry_in", turn.backoff).Msg("installing " + PluginName)
		retry = time.After(turn.backoff)
		turn.backoff = min(turn.backoff*2, 30*time.Second)
		turn.dirty = partAll
	}
	return retry
}

// wait blocks until something relevant changed (a file event, gathered
// with the rest of its burst), retry fired, or ctx ended (done). It
// returns the parts to check again.
func (in *Installer) wait(ctx context.Context, cw *confWatch, retry <-chan time.Time) (dirty parts, done bool, err error) {
	if cw.watchLinked() {
		// The reconcile just found a linked config: check it again
		// now that its directory is watched.
		return partConf, false, nil
	}
	for dirty == 0 {
		select {
		case <-ctx.Done():
			return 0, true, nil
		case <-retry:
			dirty = partAll
		case ev, ok := <-cw.w.Events:
			if !ok {
				return 0, true, errors.New("file watcher closed")
			}
			dirty = cw.classify(ev)
		case werr, ok := <-cw.w.Errors:
			if !ok {
				return 0, true, errors.New("file watcher closed")
			}
			// An overflow means lost events: recheck everything.
			in.log.Warn().Err(werr).Msg("file watch error; rechecking everything")
			dirty = partAll
		}
	}
	// Gather the rest of the burst.
	t := time.NewTimer(debounce)
	defer t.Stop()
	for {
		select {
		case ev, ok := <-cw.w.Events:
			if !ok {
				return dirty, false, nil
			}
			dirty |= cw.classify(ev)
		case <-t.C:
			return dirty, false, nil
		case <-ctx.Done():
			return dirty, true, nil
		}
	}
}

// Cleanup undoes the install: our entry leaves the CNI config (restoring the
// primary's own bytes when the file is still what we wrote), then the
// kubeconfig and the binaries go, but only once no config names our plugin
// any more: a runtime would otherwise fail every new pod on the node. It
// keeps going after an error and returns them all.
func (in *Installer) Cleanup() error {
	in.setNotReady(errors.New("shutting down"))
	var errs []error
	cfg := in.cfg
	var written []string
	if cfg.Chained {
		written, errs = in.restoreConfs()
	} else {
		p := in.standalonePath()
		if b, err := os.ReadFile(p); err == nil {
			if t, err := conflist.TypeOf(b); err == nil && t == PluginName {
				if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
					errs = append(errs, fmt.Errorf("removing standalone config %s: %w", p, err))
				}
			}
		}
	}
	if refs := referencing(cfg.CNIConfDir, written); len(refs) > 0 {
		what := "the CNI config " + refs[0] + " still names"
		if len(refs) > 1 {
			what = "the CNI configs " + strings.Join(refs, ", ") + " still name"
		}
		return errors.Join(append(errs, fmt.Errorf("keeping the %s and %s binaries and the kubeconfig: %s the plugin, and without them the runtime would fail every new pod on the node",
			PluginName, StandaloneName, what))...)
	}
	if cfg.ServiceAccountDir != "" {
		if err := os.Remove(cfg.KubeconfigPath()); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("removing kubeconfig: %w", err))
		}
		if err := removeLegacyTLSSessions(cfg.AgentRunDir); err != nil {
			errs = append(errs, fmt.Errorf("removing an older plugin's TLS session files: %w", err))
		}
	}
	for _, d := range cfg.CNIBinDirs {
		// The front first, and the companion only once the front is gone:
		// a front left without its companion would fail every pod the
		// agent is not there for.
		for _, b := range slices.Backward(in.bins) {
			if err := b.remove(d); err != nil {
				errs = append(errs, err)
				break
			}
		}
	}
	return errors.Join(errs...)
}

// restoreConfs undoes every recorded rewrite (from the undo record when Run
// did not load it), strips our entry from a primary never recorded, and
// keeps the records of what it could not undo. It returns the files that
// held our entry.
func (in *Installer) restoreConfs() (written []string, errs []error) {
	in.mu.Lock()
	st := in.st
	if len(st.Confs) == 0 {
		// What is readable is still undone.
		st, _, _ = in.loadUndo()
	}
	in.mu.Unlock()
	var left []confRecord
	for _, r := range st.Confs {
		written = append(written, r.Written)
		if err := retryChanged("restoring "+r.Written, func() error { return restoreOnce(r) }); err != nil {
			errs = append(errs, err)
			left = append(left, r)
		} else {
			in.log.Info().Str("file", r.Original).Msg("removed " + PluginName + " from the CNI config")
		}
	}
	// A primary we never recorded (state lost) may still hold our entry.
	if p, _, err := conflist.FindPrimary(in.cfg.CNIConfDir); err == nil && p != "" {
		written = append(written, p)
		if err := stripFile(p); err != nil {
			errs = append(errs, err)
		}
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	in.st = agentState{Confs: left}
	if err := in.undo.save(in.st); err != nil {
		errs = append(errs, err)
	} else if err := in.removeLegacy(); err != nil {
		errs = append(errs, err)
	}
	return written, errs
}

// referencing lists the config files a runtime could load (those in dir,
// and the extra ones) that still name our plugin. A regular file we cannot
// read counts: it may.
func referencing(dir string, extra []string) []string {
	files, err := libcni.ConfFiles(dir, conflist.ConfExtensions)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return []string{dir + " (unreadable: " + err.Error() + ")"}
	}
	files = append(files, extra...)
	slices.Sort(files)
	var out []string
	for _, f := range slices.Compact(files) {
		if fi, err := os.Stat(f); err == nil && !fi.Mode().IsRegular() {
			continue // no runtime loads a FIFO or a directory
		}
		s, err := readSnapshot(f)
		switch {
		case err != nil:
			out = append(out, f+" (unreadable: "+err.Error()+")")
		case s.exists && conflist.HasPlugin(f, s.data):
			out = append(out, f)
		}
	}
	return out
}

// restoreOnce undoes one rewrite (errChanged: the file changed, start over).
func restoreOnce(r confRecord) error {
	cur, err := readSnapshot(r.Written)
	if err != nil {
		return fmt.Errorf("reading %s for cleanup: %w", r.Written, err)
	}
	if !cur.exists {
		return nil // the primary removed it; nothing of ours is left there
	}
	if err := complete(cur); err != nil {
		return err
	}
	if cur.sum != r.WrittenSum {
		// Changed after our write: keep the change, drop only our entry.
		return stripSnapshot(cur)
	}
	if r.Original == r.Written {
		err := replaceIfUnchanged(cur, r.OriginalBytes, r.OriginalMode, r.OriginalUID, r.OriginalGID)
		return unlessChanged(err, "restoring %s", r.Written)
	}
	// We had turned Original (.conf) into Written (.conflist). Put the .conf
	// back first (it sorts first, so the runtime switches to it at once),
	// unless the primary already wrote a new one.
	if _, err := os.Lstat(r.Original); errors.Is(err, fs.ErrNotExist) {
		if err := restoreOriginal(r); err != nil {
			return err
		}
	}
	return unlessChanged(removeIfUnchanged(cur), "removing %s", r.Written)
}

// restoreOriginal puts a converted .conf back where it was: as the link it
// was while the link's target still holds the recorded bytes, else as a
// file with those bytes. A .conf the primary writes meanwhile wins.
func restoreOriginal(r confRecord) error {
	if r.OriginalLink != "" {
		t := r.OriginalLink
		if !filepath.IsAbs(t) {
			t = filepath.Join(filepath.Dir(r.Original), t)
		}
		if b, err := os.ReadFile(t); err == nil && bytes.Equal(b, r.OriginalBytes) {
			if err := os.Symlink(r.OriginalLink, r.Original); err != nil && !errors.Is(err, fs.ErrExist) {
				return fmt.Errorf("restoring the link %s: %w", r.Original, err)
			}
			atomicfile.SyncDir(r.Original)
			return nil
		}
	}
	err := replaceIfUnchanged(snapshot{name: r.Original, path: r.Original}, r.OriginalBytes, r.OriginalMode, r.OriginalUID, r.OriginalGID)
	if err != nil && !errors.Is(err, errChanged) {
		return fmt.Errorf("restoring %s: %w", r.Original, err)
	}
	return nil
}

// stripFile removes our entry from a list file, keeping its mode and owner.
func stripFile(path string) error {
	if !conflist.IsList(path) {
		return nil
	}
	return retryChanged(fmt.Sprintf("removing %s from %s", PluginName, path), func() error {
		cur, err := readSnapshot(path)
		if err != nil {
			return fmt.Errorf("reading %s for cleanup: %w", path, err)
		}
		if err := complete(cur); err != nil {
			return err
		}
		return stripSnapshot(cur)
	})
}

// stripSnapshot writes cur without our entry back unless it changed (errChanged).
func stripSnapshot(cur snapshot) error {
	if !cur.exists || !conflist.IsList(cur.name) {
		return nil
	}
	out, changed, err := conflist.RemovePlugin(cur.name, cur.data)
	if err != nil || !changed {
		return err
	}
	return unlessChanged(replaceIfUnchanged(cur, out, cur.mode, cur.uid, cur.gid), "removing %s from %s", PluginName, cur.name)
}
