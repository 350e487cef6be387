package installer

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The image holds the plugin where the agent's --plugin-binary default
// looks, and the companion where the agent then looks for it (the same
// directory, under the name it installs): an image the agent refuses to
// start from would only show on a node. The image tooling is a module of
// its own (tools/imagebuild) that links nothing of this one, so the two
// meet in the Dockerfile: its COPY destinations are the image's paths
// (tools/imagebuild's TestDockerfileMatchesTheReferenceLayout pins that).
func TestImageHoldsWhatTheAgentInstalls(t *testing.T) {
	cfg, err := ParseConfig(nil, func(k string) (string, bool) {
		v, ok := map[string]string{"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}[k]
		return v, ok
	})
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile(filepath.Join("..", "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	var copies []string
	for _, l := range strings.Split(string(src), "\n") {
		if f := strings.Fields(l); len(f) > 1 && f[0] == "COPY" {
			copies = append(copies, f[len(f)-1])
		}
	}
	if !slices.Contains(copies, cfg.PluginBinary) {
		t.Errorf("the agent installs %s by default, the image holds %v", cfg.PluginBinary, copies)
	}
	if want := filepath.Join(filepath.Dir(cfg.PluginBinary), StandaloneName); !slices.Contains(copies, want) {
		t.Errorf("the agent looks for the companion at %s, the image holds %v", want, copies)
	}
}
