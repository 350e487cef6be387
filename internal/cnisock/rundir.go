package cnisock

import (
	"encoding/json"
	"path"
)

// DefaultRunDir is agent_run_dir when a config names none (the plugin
// config's default; a test keeps the two equal).
const DefaultRunDir = "/var/run/nftmesh"

// RunDir finds the agent_run_dir of a plugin config as the plugin reads it
// (podinfo/cniconf): "agent_run_dir", else Istio's "cni_agent_run_dir",
// else DefaultRunDir. ok is false when config is not a JSON object or the
// value is not an absolute path string: the plugin then reports the
// config's problem itself. The agent declines a call whose config names
// another run dir, so a misreading costs speed, never correctness.
func RunDir(config []byte) (dir string, ok bool) {
	var c struct {
		Ours  *string `json:"agent_run_dir"`
		Istio *string `json:"cni_agent_run_dir"`
	}
	if err := json.Unmarshal(config, &c); err != nil {
		return "", false
	}
	v := c.Istio
	if c.Ours != nil {
		v = c.Ours
	}
	if v == nil || *v == "" {
		return DefaultRunDir, true
	}
	if !path.IsAbs(*v) {
		return "", false
	}
	return path.Clean(*v), true
}
