package cniplugin

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nftmesh/nftmesh/iptables"
	"github.com/nftmesh/nftmesh/nft"
	"github.com/nftmesh/nftmesh/podinfo/cniconf"
	"github.com/nftmesh/nftmesh/redirect"

	"github.com/nftmesh/nftmesh/testkit/nstest"

	"github.com/nftmesh/nftmesh/testkit/cnitest"
)

// TestChainBackends: the chain with backend auto (a fresh netns: nftables)
// and iptables-legacy installs the pod's plan with that backend only, and
// DEL leaves neither backend's rules.
func TestChainBackends(t *testing.T) {
	needEnv(t)
	h := newHost(t, env.api, env.token)
	tests := []struct {
		backend string
		want    redirect.Backend
		other   redirect.Backend
	}{
		{cniconf.BackendAuto, nft.New(), iptables.New()},
		{cniconf.BackendIptablesLegacy, iptables.New(), nft.New()},
	}
	for _, tt := range tests {
		t.Run(tt.backend, func(t *testing.T) {
			pod := createPod(t, env.api, loadPod(t, "injected.yaml"))
			_, nsPath := nstest.New(t, "cni-pod-")
			cl := h.conflist(t, "1.0.0", map[string]any{"backend": tt.backend})
			rt := cnitest.RuntimeConf(pod, nsPath, "ctr-")
			if _, err := h.add(cl, rt); err != nil {
				if tt.backend == cniconf.BackendIptablesLegacy && strings.Contains(err.Error(), "legacy") {
					t.Skipf("kernel without legacy x_tables: %v", err)
				}
				t.Fatalf("ADD: %v", err)
			}
			ctx := context.Background()
			if err := tt.want.Check(ctx, nsPath, wantPlan(t, pod, false)); err != nil {
				t.Fatalf("%s rules: %v", tt.want.Name(), err)
			}
			if p, err := tt.other.List(ctx, nsPath); err != nil || !p.Empty() {
				t.Fatalf("%s also has rules (%v):\n%s", tt.other.Name(), err, strings.Join(redirect.Describe(p), "\n"))
			}
			if err := h.check(cl, rt); err != nil {
				t.Fatalf("CHECK: %v", err)
			}
			if err := h.del(cl, rt); err != nil {
				t.Fatalf("DEL: %v", err)
			}
			for _, b := range []redirect.Backend{tt.want, tt.other} {
				if p, err := b.List(ctx, nsPath); err != nil || !p.Empty() {
					t.Fatalf("%s rules left after DEL (%v)", b.Name(), err)
				}
			}
		})
	}
}

// TestLogFileCapped: a log file past the cap is rotated before writing.
func TestLogFileCapped(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, LogFileName)
	if err := os.WriteFile(path, nil, 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, maxLogSize+1); err != nil {
		t.Fatal(err)
	}
	conf, err := cniconf.ParseConfig([]byte(`{"agent_run_dir":"` + dir + `"}`))
	if err != nil {
		t.Fatal(err)
	}
	log, _, closeLog := newLoggers(Env{Stderr: os.Stderr}, conf, "ADD")
	log.Info().Str("pod", "p").Msg("hello")
	closeLog()
	if st, err := os.Stat(path + ".1"); err != nil || st.Size() != maxLogSize+1 {
		t.Fatalf("old log not rotated: %v", err)
	}
	data, err := os.ReadFile(path)
	if err != nil || !strings.Contains(string(data), `"pod":"p"`) || len(data) > 1000 {
		t.Fatalf("new log: %q %v", data, err)
	}
	// No run dir (agent not installed yet): stderr only, no error.
	conf.AgentRunDir = filepath.Join(dir, "missing")
	_, _, closeLog = newLoggers(Env{Stderr: os.Stderr}, conf, "ADD")
	closeLog()
	if _, err := os.Stat(conf.AgentRunDir); err == nil {
		t.Fatal("logger created the run dir")
	}
}
