package installer

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/nftmesh/nftmesh/installer/conflist"
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
