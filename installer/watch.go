package installer

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/nftmesh/nftmesh/installer/conflist"
	"github.com/nftmesh/nftmesh/internal/atomicfile"
)

// debounce gathers a burst of events (a rename makes several) into one reconcile.
const debounce = 20 * time.Millisecond

// parts of the install a file event can invalidate.
type parts uint8

const (
	partBinaries parts = 1 << iota
	partKubeconfig
	partConf
	partAll = partBinaries | partKubeconfig | partConf
)

// confWatch is the fsnotify watch of every directory whose changes can
// undo the install: conf dir (and the dirs of linked configs), run dir,
// bin dirs and the service account dir.
type confWatch struct {
	in       *Installer
	w        *fsnotify.Watcher
	confDirs map[string]bool // the conf dir and linked configs' dirs
}

func (in *Installer) newConfWatch() (*confWatch, error) {
	watcher, err := fsnotify.NewBufferedWatcher(256)
	if err != nil {
		return nil, fmt.Errorf("creating file watcher: %w", err)
	}
	return &confWatch{in: in, w: watcher, confDirs: map[string]bool{in.cfg.CNIConfDir: true}}, nil
}

// classify says which parts of the install an event invalidates.
func (cw *confWatch) classify(ev fsnotify.Event) parts {
	cfg := cw.in.cfg
	dir, base := filepath.Dir(ev.Name), filepath.Base(ev.Name)
	if atomicfile.IsTemp(base) {
		return 0
	}
	var p parts
	if slices.Contains(cfg.CNIBinDirs, dir) && (base == PluginName || base == StandaloneName) {
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
