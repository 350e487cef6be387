package capture_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nftmesh/nftmesh/capture"
	"github.com/nftmesh/nftmesh/cniplugin"
	"github.com/nftmesh/nftmesh/testkit/nstest"
	"github.com/nftmesh/nftmesh/testkit/scenarios"
)

// TestPluginDelNotWedged: the plugin's DEL (cniplugin.Run, the code of the
// standalone plugin and of the agent's calls) ends with rc 0 and no
// nftmesh table left in a namespace wedged both ways of issue 20: a process
// of another user (nobody, started here, killed by its PID) holds an
// exclusive flock on the namespace file, and table inet nftmesh holds a
// set with `flags timeout`, which the reader does not decode. Before, DEL
// waited on the flock until its timeout, and then failed on the listing.
func TestPluginDelNotWedged(t *testing.T) {
	nstest.NeedRoot(t)
	for _, bin := range []string{"nft", "flock"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("%s missing: %v", bin, err)
		}
	}
	_, path := nstest.New(t, "wedge-")
	runDir := t.TempDir()
	n, err := capture.Linux().Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	if _, err := capture.Linux().Apply(context.Background(), n, scenarios.MustPlan(t, "defaults"), capture.Options{Backend: capture.NFTables, RunDir: runDir}); err != nil {
		t.Fatal(err)
	}
	nstest.Run(t, path, "add set inet nftmesh seen { type ipv4_addr; flags timeout; }\n", "nft", "-f", "-")

	holder := exec.Command("flock", "-x", path, "sh", "-c", "echo locked; exec sleep 600")
	holder.SysProcAttr = &syscall.SysProcAttr{
		Credential: &syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{}},
		Setpgid:    true,
	}
	out, err := holder.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	pid := holder.Process.Pid
	defer func() {
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		_ = holder.Wait()
	}()
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "locked\n" {
		t.Fatalf("nobody's flock on %s: %q, %v", path, line, err)
	}

	conf, err := json.Marshal(map[string]any{
		"cniVersion": "1.0.0", "name": "k8s", "type": "nftmesh-cni",
		"agent_run_dir": runDir, "backend": "auto",
		"prevResult": map[string]any{"cniVersion": "1.0.0", "ips": []any{map[string]any{"address": "198.51.100.7/24"}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{
		"CNI_COMMAND": "DEL", "CNI_CONTAINERID": "wedge", "CNI_NETNS": path, "CNI_IFNAME": "eth0",
		"CNI_PATH": "/opt/cni/bin", "CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAMESPACE=shop;K8S_POD_NAME=web;K8S_POD_INFRA_CONTAINER_ID=wedge",
	}
	var stdout, stderr bytes.Buffer
	start := time.Now()
	rc, err := cniplugin.Run(cniplugin.Env{Getenv: func(k string) string { return env[k] }, Stdin: bytes.NewReader(conf), Stdout: &stdout, Stderr: &stderr})
	if rc != 0 || err != nil {
		t.Fatalf("DEL after %v = %d, %v\nstdout: %s\nstderr: %s", time.Since(start), rc, err, stdout.String(), stderr.String())
	}
	if log := stderr.String(); !strings.Contains(log, "removed unread: reading table inet nftmesh in netns "+path+": set seen") {
		t.Errorf("DEL's log does not say, naming the netns, what it could not read: %s", log)
	}
	if ruleset := nstest.Run(t, path, "", "nft", "list", "ruleset"); strings.Contains(ruleset, "nftmesh") {
		t.Fatalf("nft list ruleset after DEL:\n%s", ruleset)
	}
	t.Logf("DEL took %v; log: %s", time.Since(start).Round(time.Millisecond), strings.TrimSpace(stderr.String()))
}
