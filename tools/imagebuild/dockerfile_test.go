package imagebuild

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"
)

// The Dockerfile, kept for people with Docker, must give the reference
// image's layout: the same binaries at the same paths, the same entrypoint
// and user. The chart starts the agent by path, so it is checked too.
func TestDockerfileMatchesTheReferenceLayout(t *testing.T) {
	root := filepath.Join("..", "..")
	src, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	// The final stage: everything after the last FROM.
	lines := strings.Split(string(src), "\n")
	var final []string
	for _, l := range lines {
		l = strings.TrimSpace(l)
		if strings.HasPrefix(l, "FROM ") {
			final = nil
		}
		final = append(final, l)
	}
	var copies []string
	var user string
	var entrypoint []string
	for _, l := range final {
		f := strings.Fields(l)
		switch {
		case len(f) == 0:
		case f[0] == "COPY":
			copies = append(copies, f[len(f)-1])
		case f[0] == "USER":
			user = f[1]
		case f[0] == "ENTRYPOINT":
			if err := json.Unmarshal([]byte(strings.TrimPrefix(l, "ENTRYPOINT")), &entrypoint); err != nil {
				t.Fatalf("ENTRYPOINT is not exec form: %q", l)
			}
		}
	}
	sort.Strings(copies)
	want := []string{PluginPath, StandalonePath, AgentPath, RedirectPath}
	sort.Strings(want)
	if !reflect.DeepEqual(copies, want) {
		t.Errorf("the Dockerfile's final stage copies to %v, the reference image holds %v", copies, want)
	}
	if user != User {
		t.Errorf("Dockerfile USER %q, the reference image's user is %q", user, User)
	}
	if !reflect.DeepEqual(entrypoint, []string{AgentPath}) {
		t.Errorf("Dockerfile ENTRYPOINT %v, the reference image's is [%s]", entrypoint, AgentPath)
	}

	ds, err := os.ReadFile(filepath.Join(root, "charts", "nftmesh", "templates", "daemonset.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(ds), `command: ["`+AgentPath+`"]`) {
		t.Errorf("the chart's DaemonSet does not start %s", AgentPath)
	}
	// The agent takes the plugin, and its companion next to it, from where
	// the chart says.
	cm, err := os.ReadFile(filepath.Join(root, "charts", "nftmesh", "templates", "configmap.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(cm), `"NFTMESH_PLUGIN_BINARY" "`+PluginPath+`"`) {
		t.Errorf("the chart's agent does not install the plugin from %s", PluginPath)
	}
}
