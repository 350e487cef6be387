package installer

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/containernetworking/cni/libcni"

	"github.com/nftmesh/nftmesh/installer/conflist"
	"github.com/nftmesh/nftmesh/internal/atomicfile"
)

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
