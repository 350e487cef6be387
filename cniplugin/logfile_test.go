package cniplugin

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestLogFileLinkRefused: a link planted at the plugin's log file in the
// run dir is refused, and what it leads to untouched (content and mode):
// a symlink or a hard link to a file the test owns elsewhere, a FIFO (the
// run does not block on it); the run still succeeds, logging to stderr
// that it refused the file. A symlink at the rotated name is replaced by
// the rotation, not followed. Before, the plugin appended its log lines to
// the symlink's or hard link's target and hung on the FIFO.
func TestLogFileLinkRefused(t *testing.T) {
	const own = "the test's own file\n"
	for _, tc := range []struct {
		name    string
		plant   func(t *testing.T, log, target string)
		refused string // in the plugin's stderr; "" for a run that logs to the file
	}{
		{"symlink", func(t *testing.T, log, target string) { must(t, os.Symlink(target, log)) }, "it is a symlink"},
		{"hard link", func(t *testing.T, log, target string) { must(t, os.Link(target, log)) }, "it is a hard link"},
		{"FIFO", func(t *testing.T, log, _ string) { must(t, syscall.Mkfifo(log, 0o600)) }, "it is a FIFO"},
		{"symlink at the rotated name", func(t *testing.T, log, target string) {
			must(t, os.Symlink(target, log+".1"))
			must(t, os.WriteFile(log, bytes.Repeat([]byte("{}\n"), maxLogSize/3+1), 0o640))
		}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			runDir := t.TempDir()
			target := filepath.Join(t.TempDir(), "elsewhere")
			must(t, os.WriteFile(target, []byte(own), 0o600))
			log := filepath.Join(runDir, LogFileName)
			tc.plant(t, log, target)

			conf, err := json.Marshal(map[string]any{"cniVersion": "1.0.0", "name": "k8s", "type": "nftmesh-cni", "agent_run_dir": runDir})
			must(t, err)
			env := map[string]string{"CNI_COMMAND": "DEL", "CNI_CONTAINERID": "c1", "CNI_IFNAME": "eth0", "CNI_PATH": "/opt/cni/bin",
				"CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAMESPACE=shop;K8S_POD_NAME=web"}
			var stdout, stderr bytes.Buffer
			done := make(chan struct{})
			var rc int
			go func() {
				defer close(done)
				rc, err = Run(Env{Getenv: func(k string) string { return env[k] }, Stdin: bytes.NewReader(conf), Stdout: &stdout, Stderr: &stderr})
			}()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatalf("the plugin blocked on a %s at its log file", tc.name)
			}
			if rc != 0 || err != nil {
				t.Fatalf("DEL = %d, %v: %s", rc, err, stderr.String())
			}
			if data, err := os.ReadFile(target); err != nil || string(data) != own {
				t.Errorf("the link's target after the run: %q, %v", data, err)
			}
			if st, err := os.Stat(target); err != nil || st.Mode().Perm() != 0o600 {
				t.Errorf("the link's target's mode after the run: %v, %v", st, err)
			}
			if tc.refused == "" {
				data, err := os.ReadFile(log)
				if err != nil || !strings.Contains(string(data), `"command":"DEL"`) {
					t.Errorf("log file after the rotation: %q, %v", data, err)
				}
				if st, err := os.Lstat(log + ".1"); err != nil || !st.Mode().IsRegular() {
					t.Errorf("rotated log: %v, %v; want the old log, a regular file", st, err)
				}
				return
			}
			if !strings.Contains(stderr.String(), "refusing "+log+" in the run dir: "+tc.refused) {
				t.Errorf("stderr does not say the log file was refused as a %s:\n%s", tc.name, stderr.String())
			}
		})
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
