package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestStandaloneRunsWithOneP: when the agent does not take the call, the
// front runs its companion with GOMAXPROCS=1 in the environment (so the
// plugin's runtime starts with one P), unless the runtime's environment
// names a GOMAXPROCS, which is kept. The companion here is a script beside
// a freshly built front that prints what it got; the run dir has no agent
// socket.
func TestStandaloneRunsWithOneP(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds the front")
	}
	dir := t.TempDir()
	front := filepath.Join(dir, "nftmesh-cni")
	build := exec.Command("go", "build", "-o", front, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the front: %v\n%s", err, out)
	}
	companion := "#!/bin/sh\necho \"GOMAXPROCS=${GOMAXPROCS-unset} CNI_COMMAND=$CNI_COMMAND stdin=$(cat)\"\n"
	if err := os.WriteFile(filepath.Join(dir, StandaloneName), []byte(companion), 0o755); err != nil {
		t.Fatal(err)
	}
	runDir := t.TempDir() // no agent-sock/cni.sock: the agent is down
	config := `{"cniVersion":"1.0.0","name":"k8s-pod-network","type":"nftmesh-cni","agent_run_dir":"` + runDir + `"}`
	for _, tc := range []struct {
		name string
		env  []string
		want string
	}{
		{"unset", nil, "GOMAXPROCS=1 "},
		{"set by the runtime", []string{"GOMAXPROCS=3"}, "GOMAXPROCS=3 "},
		{"set empty", []string{"GOMAXPROCS="}, "GOMAXPROCS= "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, verb := range []string{"ADD", "VERSION", ""} {
				cmd := exec.Command(front)
				cmd.Env = append([]string{"CNI_COMMAND=" + verb, "PATH=/usr/bin:/bin"}, tc.env...)
				cmd.Stdin = strings.NewReader(config)
				out, err := cmd.CombinedOutput()
				if err != nil {
					t.Fatalf("%s: %v\n%s", verb, err, out)
				}
				got := string(out)
				if !strings.HasPrefix(got, tc.want+"CNI_COMMAND="+verb+" ") || !strings.Contains(got, `"agent_run_dir"`) {
					t.Errorf("%s: the companion got %q, want %q with the CNI_COMMAND and the config", verb, got, tc.want)
				}
			}
		})
	}
}
