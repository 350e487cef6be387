package installer

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/rs/zerolog"
	"golang.org/x/time/rate"

	"github.com/nftmesh/nftmesh/installer/conflist"
	"github.com/nftmesh/nftmesh/installer/metrics"
)

// errNoPrimary means the conf dir has no usable primary config yet; the
// loop then waits for the next conf dir event (watching, not polling).
var errNoPrimary = errors.New("no primary CNI config yet")

// ForeignCaptureError means the primary config also chains another capture
// plugin (Istio's istio-cni, Linkerd's linkerd-cni): the agent does not insert ours next to it.
type ForeignCaptureError struct {
	File, Plugin string
	Removed      bool // our entry (standalone: our file) was there too and was taken out
	Standalone   bool // refusing standalone (Multus) mode: the other plugin has a file of its own
}

// foreignAgents names what installs each foreign capture plugin, for the
// refusal's advice.
var foreignAgents = map[string]string{
	"istio-cni":   "Istio's CNI node agent",
	"linkerd-cni": "Linkerd's CNI DaemonSet (linkerd2-cni)",
}

func (e *ForeignCaptureError) Error() string {
	agent := cmp.Or(foreignAgents[e.Plugin], "its CNI node agent")
	if e.Standalone {
		return fmt.Sprintf("%s is the config of %s: %s writes no standalone config beside it (or over it), as two capture plugins would both program every pod's redirect rules and fight over its traffic; "+
			"uninstall %s (a leftover %s must be removed by hand) and %s writes its own",
			e.File, e.Plugin, PluginName, agent, e.File, PluginName)
	}
	return fmt.Sprintf("%s chains %s: %s is not inserted next to it, as two capture plugins would both program every pod's redirect rules and fight over its traffic; "+
		"uninstall %s (a leftover %s entry must be removed from the file by hand) and %s inserts itself",
		e.File, e.Plugin, PluginName, agent, e.Plugin, PluginName)
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
	files, err := libcni.ConfFiles(in.cfg.CNIConfDir, conflist.ConfExtensions)
	if err != nil {
		return nil // the write reports it
	}
	own := in.standalonePath()
	for _, p := range files {
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
