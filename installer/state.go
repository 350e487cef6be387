package installer

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

	"golang.org/x/sys/unix"
)

// legacyStateName is where agents before the undo record (UndoDirName)
// kept it: in the run dir, a tmpfs that a reboot empties. An agent finding
// it moves its content into the undo record and removes it.
const legacyStateName = "agent-state.json"

// confRecord is one rewrite: we turned Original (whose content was
// OriginalBytes) into Written (whose content hashed to WrittenSum).
// Original != Written when a single-plugin .conf became a .conflist.
type confRecord struct {
	Written       string      `json:"written"`
	WrittenSum    string      `json:"written_sha256"`
	Original      string      `json:"original"`
	OriginalBytes []byte      `json:"original_bytes"`
	OriginalMode  fs.FileMode `json:"original_mode"`
	OriginalUID   int         `json:"original_uid"`
	OriginalGID   int         `json:"original_gid"`
	// OriginalLink is the symlink Original was, when converting it
	// removed the link (its target is left alone).
	OriginalLink string `json:"original_link,omitempty"`
}

type agentState struct {
	Confs []confRecord `json:"confs"`
}

func sum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func (s *agentState) record(written string) *confRecord {
	if i := slices.IndexFunc(s.Confs, func(r confRecord) bool { return r.Written == written }); i >= 0 {
		return &s.Confs[i]
	}
	return nil
}

func (s *agentState) put(r confRecord) {
	if old := s.record(r.Written); old != nil {
		*old = r
		return
	}
	s.Confs = append(s.Confs, r)
}

// drop puts back prev as the record of written (nil: no record), undoing a
// put whose write did not happen.
func (s *agentState) drop(written string, prev *confRecord) {
	if prev != nil {
		s.put(*prev)
		return
	}
	s.Confs = slices.DeleteFunc(s.Confs, func(r confRecord) bool { return r.Written == written })
}

// loadLegacyState reads the state an earlier agent kept in the run dir
// (paths absolute, as it wrote them); found says whether there was one.
func loadLegacyState(path string) (s agentState, found bool, err error) {
	b, err := readNoFollow(unix.AT_FDCWD, path, path)
	if errors.Is(err, unix.ENOENT) {
		return s, false, nil
	}
	if err != nil {
		return s, true, err
	}
	if err := json.Unmarshal(b, &s); err != nil {
		return agentState{}, true, fmt.Errorf("parsing agent state %s: %w", path, err)
	}
	return s, true, nil
}

// inConfDir keeps the records of files in confDir that pass the undo
// record's checks, and reports the others: they cannot go into the record,
// whose names are relative to the conf dir.
func inConfDir(confDir string, s agentState) (agentState, error) {
	var out agentState
	var errs []error
	for i, r := range s.Confs {
		rel := r
		rel.Written, rel.Original = filepath.Base(r.Written), filepath.Base(r.Original)
		err := checkRecord(rel)
		if err == nil && (filepath.Dir(r.Written) != confDir || filepath.Dir(r.Original) != confDir) {
			err = fmt.Errorf("written: %s is not in the CNI conf dir %s", quoteBounded(r.Written), confDir)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("agent state: confs[%d].%w", i, err))
			continue
		}
		out.Confs = append(out.Confs, r)
	}
	return out, errors.Join(errs...)
}

// merge adds old's records to s. Where both have a record of one file, the
// one whose written content the file still holds wins (an earlier agent may
// have rewritten it after this one); otherwise s's.
func (s *agentState) merge(old agentState) {
	for _, r := range old.Confs {
		have := s.record(r.Written)
		if have == nil {
			s.Confs = append(s.Confs, r)
			continue
		}
		if cur, err := readSnapshot(r.Written); err == nil && cur.exists && cur.sum == r.WrittenSum && cur.sum != have.WrittenSum {
			*have = r
		}
	}
}

// loadUndo reads the undo record, merged with the state an agent of an
// earlier version left in the run dir (legacy: whether there was one). It
// returns what it could read, and why it could not read the rest.
func (in *Installer) loadUndo() (st agentState, legacy bool, err error) {
	st, err = in.undo.load()
	old, legacy, lerr := loadLegacyState(in.legacyStatePath())
	if legacy && lerr == nil {
		old, lerr = inConfDir(in.cfg.CNIConfDir, old)
		if lerr != nil {
			lerr = fmt.Errorf("leaving out of %s: %w", in.legacyStatePath(), lerr)
		}
		st.merge(old)
	}
	return st, legacy, errors.Join(err, lerr)
}

// moveLegacy makes st, which holds an earlier agent's run dir state, the
// undo record, and removes that state once the record is on disk.
func (in *Installer) moveLegacy(st agentState) error {
	if err := in.undo.save(st); err != nil {
		return fmt.Errorf("moving the agent state from the run dir into the undo record: %w", err)
	}
	return in.removeLegacy()
}

func (in *Installer) removeLegacy() error {
	if err := os.Remove(in.legacyStatePath()); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing the earlier agent state: %w", err)
	}
	return nil
}
