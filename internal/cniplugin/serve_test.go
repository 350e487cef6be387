package cniplugin

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	"golang.org/x/sys/unix"

	"github.com/nftmesh/nftmesh/capture/capturetest"
	"github.com/nftmesh/nftmesh/podinfo/agentsock"
	"github.com/nftmesh/nftmesh/podinfo/meshpod"
)

// TestAgentDeclinesWhatItsSandboxRefuses: run by the agent, a call the
// kernel refuses to the agent's process (EPERM, EACCES: a capability or a
// security profile its container lacks) is declined, for the standalone
// plugin to run with the host's privileges, and nothing of it stays behind;
// run by the standalone plugin, the same refusal is the call's CNI error.
// (Root-free: the kernel is the in-memory one, its refusals injected.)
func TestAgentDeclinesWhatItsSandboxRefuses(t *testing.T) {
	pod := loadPod(t, "injected.yaml")
	pod.UID = "uid-sandbox"
	body, err := json.Marshal(pod)
	if err != nil {
		t.Fatal(err)
	}
	mp, uid, err := meshpod.DecodeAPIPod(body)
	if err != nil {
		t.Fatal(err)
	}
	for _, errno := range []unix.Errno{unix.EPERM, unix.EACCES} {
		for _, verb := range []string{"ADD", "DEL"} {
			for _, inAgent := range []bool{true, false} {
				t.Run(fmt.Sprintf("%s/%s/agent=%v", errno, verb, inAgent), func(t *testing.T) {
					f := capturetest.New()
					f.AddNetns(fakeNetns, netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("198.51.100.20"))
					if verb == "DEL" {
						f.Install(fakeNetns, "nftables", wantPlan(t, pod, false))
						f.FailRemove("", fmt.Errorf("removing: %w", errno))
					} else {
						f.FailApply("", fmt.Errorf("writing: %w", errno), false)
					}
					runDir, _ := fakeAPIRunDir(t, servePod(t, pod))
					vars := cniVars(verb, fakeNetns, "ctr-sandbox", cniArgsFor(pod, "ctr-sandbox"))
					var out, errOut bytes.Buffer
					e := Env{
						Getenv:   func(k string) string { return vars[k] },
						Stdin:    bytes.NewReader(directConf(t, "1.0.0", runDir, prevResultV4("1.0.0", "198.51.100.20/24"), nil)),
						Stdout:   &out,
						Stderr:   &errOut,
						Pipeline: f.Pipeline(),
					}
					if inAgent {
						e.Ask = func(agentsock.Request) (agentsock.Answer, error) { return agentsock.Found(uid, mp), nil }
						e.RunDir = runDir
					}
					code, err := Run(e)
					if !inAgent {
						var cerr types.Error
						if code != 1 || err != nil || json.Unmarshal(out.Bytes(), &cerr) != nil || !strings.Contains(cerr.Details, errno.Error()) {
							t.Fatalf("standalone: status %d, %v, stdout %q; want the refusal as the CNI error", code, err, out.String())
						}
						return
					}
					if !errors.Is(err, ErrDeclined) {
						t.Fatalf("agent: status %d, %v, stdout %q; want declined", code, err, out.String())
					}
					if verb == "ADD" && len(f.Backends(fakeNetns)) != 0 {
						t.Fatalf("a declined ADD left rules behind: %s", f.Dump(fakeNetns))
					}
				})
			}
		}
	}
}
