package cniplugin

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/nftmesh/nftmesh/iptables"
	"github.com/nftmesh/nftmesh/nft"
	"github.com/nftmesh/nftmesh/podinfo/cniconf"
	"github.com/nftmesh/nftmesh/testkit/usernstest"
	"github.com/nftmesh/nftmesh/testkit/xttest"

	"github.com/nftmesh/nftmesh/testkit/cnitest"
)

// TestChainUsernsPod: a pod whose netns is owned by its own user namespace
// (hostUsers: false), through libcni, the reference plugins and the real API
// server. With backend auto ADD programs it with nftables (CHECK and DEL
// agree); with iptables-legacy ADD fails with CodeBackendUnsupported and an
// error naming the reason, and leaves no rules.
func TestChainUsernsPod(t *testing.T) {
	needEnv(t)
	if err := iptables.LegacyAvailable(); err != nil {
		t.Skip(err)
	}
	h := newHost(t, env.api, env.token)
	ctx := context.Background()
	for i, backend := range []string{cniconf.BackendAuto, cniconf.BackendIptablesLegacy} {
		t.Run(backend, func(t *testing.T) {
			pod := createPod(t, env.api, loadPod(t, "injected.yaml"))
			ns, err := usernstest.New("cni-userns-", uint32(3_200_000+i*usernstest.Size))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = ns.Close() })
			cl := h.conflist(t, "1.0.0", map[string]any{"backend": backend})
			rt := cnitest.RuntimeConf(pod, ns.Path, "ctr-")
			_, err = h.add(cl, rt)
			if backend == cniconf.BackendIptablesLegacy {
				var cerr *types.Error
				if !errors.As(err, &cerr) || cerr.Code != CodeBackendUnsupported {
					t.Fatalf("ADD = %v, want CNI error code %d", err, CodeBackendUnsupported)
				}
				for _, w := range []string{"iptables-legacy", "user namespace", "hostUsers: false", "owner match"} {
					if !strings.Contains(cerr.Error(), w) {
						t.Errorf("ADD error %q does not mention %q", cerr, w)
					}
				}
				if p, err := nft.New().List(ctx, ns.Path); err != nil || !p.Empty() {
					t.Errorf("nftables rules after the refused ADD (%v)", err)
				}
				if pr, err := xttest.Probe(ns.Path); err != nil || pr.Ours {
					t.Errorf("legacy rules after the refused ADD: %+v %v", pr, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("ADD: %v", err)
			}
			if err := nft.New().Check(ctx, ns.Path, wantPlan(t, pod, false)); err != nil {
				t.Fatalf("nftables rules: %v", err)
			}
			if err := h.check(cl, rt); err != nil {
				t.Fatalf("CHECK: %v", err)
			}
			if err := h.del(cl, rt); err != nil {
				t.Fatalf("DEL: %v", err)
			}
			if p, err := nft.New().List(ctx, ns.Path); err != nil || !p.Empty() {
				t.Fatalf("nftables rules left after DEL (%v)", err)
			}
		})
	}
}
