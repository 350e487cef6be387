package cniplugin

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/nftmesh/nftmesh/netlab"
	"github.com/nftmesh/nftmesh/nft"
	"github.com/nftmesh/nftmesh/podinfo"
	"github.com/nftmesh/nftmesh/podinfo/cniconf"
	"github.com/nftmesh/nftmesh/redirect"
	"github.com/nftmesh/nftmesh/testkit/nettest"

	"github.com/nftmesh/nftmesh/testkit/nstest"
)

// TestConcurrentAddsSameNetns: two ADDs for one netns at once (a runtime's
// retry, a repair racing the plugin), as two plugin processes. Whenever
// either returns success, the namespace holds the pod's complete capture:
// the loser must neither delete the winner's rules nor leave a half state.
// 40 rounds per interception mode; in some rounds real connections prove
// where traffic lands.
func TestConcurrentAddsSameNetns(t *testing.T) {
	needEnv(t)
	runDir := agentRunDir(t, env.token)
	for _, mode := range []string{"REDIRECT", "TPROXY"} {
		t.Run(mode, func(t *testing.T) {
			p := loadPod(t, "injected.yaml")
			p.Annotations["sidecar.istio.io/interceptionMode"] = mode
			pod := createPod(t, env.api, p)
			const rounds = 40
			succeeded := 0
			for i := range rounds {
				backend := cniconf.BackendNftables
				if i%2 == 1 {
					backend = cniconf.BackendAuto
				}
				n := raceRound(t, runDir, pod, backend, i%10 == 0)
				succeeded += n
			}
			t.Logf("%s: %d rounds, %d of %d ADDs succeeded, every success left the complete capture", mode, rounds, succeeded, 2*rounds)
			if succeeded < rounds {
				t.Errorf("only %d of %d ADDs succeeded: a serialized second ADD replaces the rules and succeeds too", succeeded, 2*rounds)
			}
		})
	}
}

// raceRound runs two ADDs at once into a fresh netns (with real traffic:
// a pod/peer topology with listeners) and checks the outcome. It returns
// how many succeeded.
func raceRound(t *testing.T, runDir string, pod *corev1.Pod, backend string, traffic bool) int {
	t.Helper()
	inMesh, _, spec, err := podinfo.FromPod(pod)
	if err != nil || !inMesh {
		t.Fatalf("pod not in mesh: %v", err)
	}
	var nsPath string
	prev := prevResultV4("1.0.0", "198.51.100.7/24")
	var topo *netlab.Topology
	if traffic {
		topo, err = netlab.NewTopology(func() netlab.TopologyOptions {
			o := nettest.TopologyOptionsFor(spec)
			o.Prefix = "cni-race-"
			return o
		}())
		if err != nil {
			t.Fatal(err)
		}
		defer func() {
			if err := topo.Close(); err != nil {
				t.Error(err)
			}
		}()
		nsPath = topo.PodNetnsPath()
		prev = map[string]any{
			"cniVersion": "1.0.0",
			"interfaces": []any{map[string]any{"name": topo.PodIface, "sandbox": nsPath}},
			"ips":        []any{map[string]any{"address": netlab.PodV4.String() + "/30", "interface": 0}},
		}
	} else {
		_, nsPath = nstest.New(t, "cni-race-")
	}
	conf := directConf(t, "1.0.0", runDir, prev, map[string]any{"backend": backend})
	type result struct {
		out, stderr []byte
		err         error
	}
	var res [2]result
	var wg sync.WaitGroup
	start := make(chan struct{})
	for j := range res {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := fmt.Sprintf("ctr-race-%d-%s", j, nstest.RandHex(4))
			<-start
			res[j].out, res[j].stderr, res[j].err = execPlugin("ADD", nsPath, id, cniArgsFor(pod, id), conf)
		}()
	}
	close(start)
	wg.Wait()
	ok := 0
	for j, r := range res {
		if r.err == nil {
			ok++
		} else {
			t.Logf("ADD %d failed: %v\n%s", j, r.err, r.out)
		}
	}
	if ok == 0 {
		return 0
	}
	// The decision on IPv6 is the plugin's; the capture must be one of
	// the two complete plans, never a part of one.
	ctx := context.Background()
	var matched *redirect.Spec
	var diffs []string
	for _, v6 := range []bool{false, true} {
		s := spec
		s.IPv6 = v6
		want, err := redirect.Build(s)
		if err != nil {
			t.Fatal(err)
		}
		if err := nft.New().Check(ctx, nsPath, want); err != nil {
			diffs = append(diffs, err.Error())
			continue
		}
		matched = &s
		break
	}
	if matched == nil {
		t.Fatalf("%d ADD(s) returned success (backend %s) but the netns lacks the complete capture:\n%s", ok, backend, strings.Join(diffs, "\n"))
	}
	if traffic {
		ls, err := netlab.StartListeners(topo, netlab.ListenerOptions{ProxyUID: spec.ProxyUIDs[0], ProxyGID: spec.ProxyGIDs[0]})
		if err != nil {
			t.Fatal(err)
		}
		defer ls.Close()
		cases := nettest.ExpectedProbesFor(matched, topo)
		for _, o := range nettest.RunProbes(topo, cases) {
			if !o.OK() {
				t.Errorf("after the racing ADDs: MISMATCH %s", o)
			}
		}
		if len(cases) < 10 {
			t.Fatalf("only %d probes: the harness did not run", len(cases))
		}
	}
	return ok
}
