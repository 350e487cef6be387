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
)

// StateFileName is kept in the run dir. It remembers, for every config file
// the agent rewrote, the primary's own bytes, so cleanup can put them back
// exactly, even after an agent restart.
const StateFileName = "agent-state.json"

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

func loadState(path string) (agentState, error) {
	var s agentState
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return s, nil
	}
	if err != nil {
		return s, fmt.Errorf("reading agent state %s: %w", path, err)
	}
	if err := json.Unmarshal(b, &s); err != nil {
		return agentState{}, fmt.Errorf("parsing agent state %s: %w", path, err)
	}
	return s, nil
}

func saveState(path string, s agentState) error {
	if len(s.Confs) == 0 {
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("removing agent state %s: %w", path, err)
		}
		return nil
	}
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding agent state: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("creating run dir: %w", err)
	}
	if err := writeFileAtomic(path, b, 0o600, -1, -1); err != nil {
		return fmt.Errorf("writing agent state %s: %w", path, err)
	}
	return nil
}
