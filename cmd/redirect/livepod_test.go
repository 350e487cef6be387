package main

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/nftmesh/nftmesh/podinfo/agentsock"
	"github.com/nftmesh/nftmesh/podinfo/meshpod/manifest"
	"github.com/nftmesh/nftmesh/testkit/nstest"
)

// inspect NAMESPACE/NAME asks the agent's inspect socket for the pod and
// its network namespace (handed over as a descriptor) and compares the
// live rules with the pod's plan: in sync after apply, drift (exit 3) once
// a rule is gone; a pod the agent does not know is an error naming it.
func TestCLIInspectPodThroughAgent(t *testing.T) {
	nstest.NeedRoot(t)
	_, path := nstest.New(t, "rcli-")
	runDir := t.TempDir()
	podFile := filepath.Join("..", "..", "testdata", "pods", "injected.yaml")
	o, err := manifest.ReadWorkload(podFile, "")
	if err != nil {
		t.Fatal(err)
	}
	// A stand-in for the agent: the pod from the manifest, its namespace
	// the test's.
	ln, err := agentsock.ListenAt(runDir, agentsock.InspectSocketName)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() {
		served <- agentsock.ServeInspect(ctx, ln, func(*net.UnixConn) error { return nil }, func(_ context.Context, req agentsock.InspectRequest) (agentsock.InspectAnswer, int) {
			if req.Namespace != o.Pod.Namespace || req.Name != o.Pod.Name {
				return agentsock.InspectAnswer{Error: "pod " + req.Namespace + "/" + req.Name + " is not on this node"}, -1
			}
			fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				return agentsock.InspectAnswer{Error: err.Error()}, -1
			}
			return agentsock.InspectAnswer{UID: "u-1", Pod: o.Pod, Netns: path, Match: "cgroup"}, fd
		})
	}()
	t.Cleanup(func() { cancel(); <-served })

	if code, _, errOut := runCLI(t, "apply", "--netns", path, "--run-dir", runDir, "--backend", "nftables", "-f", podFile); code != exitOK {
		t.Fatalf("apply: exit %d: %s", code, errOut)
	}
	code, out, errOut := runCLI(t, "inspect", "shop/web-1", "--run-dir", runDir, "--backend", "nftables")
	if code != exitOK || !strings.Contains(out, "in sync") || !strings.Contains(errOut, "found by cgroup") {
		t.Fatalf("inspect shop/web-1: exit %d\n%s%s", code, out, errOut)
	}
	nstest.Run(t, path, "", "nft", "flush", "chain", "inet", "nftmesh", "nat-istio-output")
	if code, out, errOut := runCLI(t, "inspect", "shop/web-1", "--run-dir", runDir, "--backend", "nftables"); code != exitDrift || !strings.Contains(out, "drift") {
		t.Errorf("inspect after a rule went: exit %d\n%s%s", code, out, errOut)
	}
	if code, _, errOut := runCLI(t, "inspect", "shop/nope", "--run-dir", runDir); code != exitFailure || !strings.Contains(errOut, "not on this node") {
		t.Errorf("inspect of an unknown pod: exit %d %q", code, errOut)
	}
	if code, _, errOut := runCLI(t, "inspect", "web-1", "--run-dir", runDir); code != exitUsage || !strings.Contains(errOut, "NAMESPACE/NAME") {
		t.Errorf("inspect web-1: exit %d %q", code, errOut)
	}
	if code, _, errOut := runCLI(t, "inspect", "shop/web-1", "--netns", path); code != exitUsage {
		t.Errorf("inspect shop/web-1 --netns: exit %d %q", code, errOut)
	}
	if _, err := os.Stat(filepath.Join(runDir, agentsock.DirName, agentsock.InspectSocketName)); err != nil {
		t.Error(err)
	}
}
