package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nftmesh/nftmesh/netlab"
	"github.com/nftmesh/nftmesh/nft"
	"github.com/nftmesh/nftmesh/podinfo/meshpod"
	"github.com/nftmesh/nftmesh/podinfo/meshpod/manifest"
	"github.com/nftmesh/nftmesh/redirect"
	"github.com/nftmesh/nftmesh/testkit/nettest"
)

// TestCLIApplyDecidesIPv6FromNetns: apply --netns captures IPv6 as Istio
// and the CNI plugin do, from the namespace's addresses and the sidecar's
// ISTIO_DUAL_STACK (--pod's istio-proxy env, or --dual-stack), unless
// --ipv6 says otherwise; inspect --netns decides the same way, so it finds
// the namespace in sync. The live rules are read back and compared with the
// plan built with the expected IPv6 setting.
func TestCLIApplyDecidesIPv6FromNetns(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces and nftables rules")
	}
	pods := filepath.Join("..", "..", "testdata", "pods")
	injected, annotated := filepath.Join(pods, "injected.yaml"), filepath.Join(pods, "annotated.json")
	for _, tc := range []struct {
		name     string
		stack    netlab.Stack
		spec     []string // --pod or annotation flags
		extra    []string
		wantIPv6 bool
	}{
		{"v4-only pod", netlab.StackIPv4, []string{"--pod", injected}, nil, false},
		{"dual-stack pod, sidecar not dual-stack", netlab.StackDual, []string{"--pod", injected}, nil, false},
		{"dual-stack pod given IPv6 first, sidecar not dual-stack", netlab.StackDualV6First, []string{"--pod", injected}, nil, false},
		{"dual-stack pod, ISTIO_DUAL_STACK=true", netlab.StackDual, []string{"--pod", annotated}, nil, true},
		{"v6-only pod", netlab.StackIPv6, []string{"--pod", injected}, nil, true},
		{"explicit --ipv6 wins", netlab.StackDual, []string{"--pod", injected}, []string{"--ipv6"}, true},
		{"annotations, dual-stack pod", netlab.StackDual, []string{"-a", redirect.AnnotationExcludeInboundPorts + "=9090"}, nil, false},
		{"annotations, dual-stack pod, --dual-stack", netlab.StackDual, []string{"-a", redirect.AnnotationExcludeInboundPorts + "=9090"}, []string{"--dual-stack"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			topo, err := netlab.NewTopology(netlab.TopologyOptions{Prefix: "cli6-", Stack: tc.stack})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				if err := topo.Close(); err != nil {
					t.Error(err)
				}
			})
			ns := topo.PodNetnsPath()
			args := append(append([]string{"apply", "--netns", ns, "--backend", "nftables"}, tc.spec...), tc.extra...)
			if code, _, errOut := runCLI(t, args...); code != exitOK {
				t.Fatalf("%v: exit %d: %s", args, code, errOut)
			}

			want := expectedPlan(t, tc.spec, tc.extra, tc.wantIPv6)
			if err := nft.New().Check(context.Background(), ns, want); err != nil {
				t.Fatalf("live rules are not the plan with IPv6=%t: %v", tc.wantIPv6, err)
			}
			if err := nettest.CheckPassthroughV6(topo, tc.wantIPv6); err != nil {
				t.Error(err)
			}
			args = append(append([]string{"inspect", "--netns", ns, "--backend", "nftables"}, tc.spec...), tc.extra...)
			if code, out, errOut := runCLI(t, args...); code != exitOK || !strings.Contains(out, "in sync") {
				t.Errorf("%v: exit %d, want in sync:\n%s%s", args, code, out, errOut)
			}
		})
	}
}

// expectedPlan builds the plan for the CLI's spec flags with IPv6 set.
func expectedPlan(t *testing.T, spec, extra []string, ipv6 bool) redirect.Plan {
	t.Helper()
	var s redirect.Spec
	if spec[0] == "--pod" {
		o, err := manifest.ReadWorkload(spec[1], "")
		if err != nil {
			t.Fatal(err)
		}
		_, _, s, err = meshpod.Decide(o.Pod)
		if err != nil {
			t.Fatal(err)
		}
	} else {
		k, v, _ := strings.Cut(spec[1], "=")
		var err error
		if s, err = redirect.ParseAnnotations(redirect.DefaultSpec(), map[string]string{k: v}); err != nil {
			t.Fatal(err)
		}
	}
	s.IPv6 = ipv6
	p, err := redirect.Build(s)
	if err != nil {
		t.Fatal(err)
	}
	return p
}
