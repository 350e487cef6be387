package cniplugin

import (
	"bytes"
	"context"
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/nftmesh/nftmesh/testkit/notnetns"
)

// TestNotANetns: CNI_NETNS naming a FIFO, a directory, a socket or a device
// is a CNI error naming the path and what it is, at once, for ADD, CHECK
// and DEL (a FIFO used to hang the plugin forever: open() blocked outside
// any timeout). A regular file is what an undone netns bind mount leaves:
// DEL is success there, ADD and CHECK are errors.
func TestNotANetns(t *testing.T) {
	if env.pluginBin == "" {
		t.Skipf("skipping: %s", env.skip)
	}
	dir := t.TempDir()
	targets := notnetns.Files(t, dir)
	runDir := t.TempDir() // no kubeconfig: nothing gets as far as a lookup
	conf := directConf(t, "1.0.0", runDir, prevResultV4("1.0.0", "198.51.100.7/24"), map[string]any{"backend": "auto"})
	args := "IgnoreUnknown=1;K8S_POD_NAMESPACE=shop;K8S_POD_NAME=web;K8S_POD_INFRA_CONTAINER_ID=x"
	for path, kind := range targets {
		for _, verb := range []string{"ADD", "CHECK", "DEL"} {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			c := exec.CommandContext(ctx, env.pluginBin)
			c.Env = []string{"CNI_COMMAND=" + verb, "CNI_CONTAINERID=x", "CNI_NETNS=" + path, "CNI_IFNAME=eth0", "CNI_ARGS=" + args, "CNI_PATH=" + env.binDir}
			c.Stdin = bytes.NewReader(conf)
			var out bytes.Buffer
			c.Stdout = &out
			err := c.Run()
			timedOut := ctx.Err() != nil
			cancel()
			if timedOut {
				t.Fatalf("%s CNI_NETNS=%s (%s) hangs", verb, path, kind)
			}
			if kind == "regular file" && verb == "DEL" {
				if err != nil {
					t.Errorf("DEL on a regular file (netns gone): %v %s", err, out.String())
				}
				continue
			}
			var e types.Error
			if err == nil || json.Unmarshal(out.Bytes(), &e) != nil || e.Code != types.ErrInvalidEnvironmentVariables ||
				!strings.Contains(e.Msg, path) || !strings.Contains(e.Details, kind) {
				t.Errorf("%s CNI_NETNS=%s: want CNI error %d naming the path and %q, got %v %s", verb, path, types.ErrInvalidEnvironmentVariables, kind, err, out.String())
			}
		}
	}
}
