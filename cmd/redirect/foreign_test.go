package main

import (
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nftmesh/nftmesh/testkit/nstest"
)

func inNetnsCmd(t *testing.T, path, stdin string, args ...string) {
	t.Helper()
	cmd := exec.Command("nsenter", append([]string{"--net=" + path}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v: %v\n%s", args, err, out)
	}
}

// inspect --pod on a namespace whose nftmesh rules match the plan but which
// also holds Istio's capture (its iptables chains via iptables-nft, the
// tables of its native nftables mode) does not say "in sync": it names
// each foreign object and exits 3, in text and in JSON.
func TestCLIInspectReportsIstioCapture(t *testing.T) {
	nstest.NeedRoot(t)
	_, path := nstest.New(t, "rcli-")
	runDir := t.TempDir()
	pod := filepath.Join("..", "..", "testdata", "pods", "injected.yaml")
	if code, _, errOut := runCLI(t, "apply", "--netns", path, "--run-dir", runDir, "--backend", "nftables", "-f", pod); code != exitOK {
		t.Fatalf("apply: exit %d: %s", code, errOut)
	}
	args := []string{"inspect", "--netns", path, "--run-dir", runDir, "--backend", "nftables", "-f", pod}
	if code, out, errOut := runCLI(t, args...); code != exitOK || !strings.Contains(out, "in sync") {
		t.Fatalf("before: exit %d %q %q", code, out, errOut)
	}
	inNetnsCmd(t, path, "", "iptables-nft", "-t", "nat", "-N", "ISTIO_OUTPUT")
	inNetnsCmd(t, path, "table inet istio-proxy-nat {\n chain output {\n  type nat hook output priority -100; policy accept;\n }\n}\n", "nft", "-f", "-")

	code, out, errOut := runCLI(t, args...)
	if code != exitDrift || strings.Contains(out, "in sync") || !strings.Contains(out, "foreign capture") ||
		!strings.Contains(out, "iptables-nft ipv4 nat ISTIO_OUTPUT") || !strings.Contains(out, "nftables table inet istio-proxy-nat") {
		t.Errorf("with Istio's capture: exit %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = runCLI(t, append(args, "-o", "json")...)
	var d struct {
		InSync  bool     `json:"inSync"`
		Foreign []string `json:"foreign"`
	}
	if err := json.Unmarshal([]byte(out), &d); err != nil || code != exitDrift || d.InSync || len(d.Foreign) != 2 {
		t.Errorf("-o json with Istio's capture: exit %d, %v, %+v %q", code, err, d, errOut)
	}
}

// A pod still on Istio's own rules (istio-cni's ISTIO_* chains through
// iptables-nft, capturing its outbound traffic): inspect without a pod
// says "istio-cni capture present" and exits 3 rather than showing an
// empty, harmless-looking namespace; apply refuses to stack a second
// capture on it (nothing written) unless --force; inspect with the pod
// shows no traced effect (a trace through nftmesh's rules alone would say
// "live accept" for traffic Istio's rules capture).
func TestCLIIstioCaptureRecognised(t *testing.T) {
	nstest.NeedRoot(t)
	_, path := nstest.New(t, "rcli-")
	runDir := t.TempDir()
	pod := filepath.Join("..", "..", "testdata", "pods", "injected.yaml")
	inNetnsCmd(t, path, "", "iptables-nft", "-t", "nat", "-N", "ISTIO_OUTPUT")
	inNetnsCmd(t, path, "", "iptables-nft", "-t", "nat", "-A", "OUTPUT", "-p", "tcp", "-j", "ISTIO_OUTPUT")
	inNetnsCmd(t, path, "", "iptables-nft", "-t", "nat", "-A", "ISTIO_OUTPUT", "-p", "tcp", "-j", "REDIRECT", "--to-ports", "15001")

	code, out, errOut := runCLI(t, "inspect", "--netns", path, "--run-dir", runDir)
	if code != exitDrift || !strings.Contains(out, "istio-cni capture present") || !strings.Contains(out, "ISTIO_OUTPUT") {
		t.Errorf("inspect of a namespace on Istio's rules: exit %d\n%s%s", code, out, errOut)
	}
	code, _, errOut = runCLI(t, "apply", "--netns", path, "--run-dir", runDir, "--backend", "nftables", "-f", pod)
	if code != exitFailure || !strings.Contains(errOut, "istio-cni capture present") || !strings.Contains(errOut, "--force") {
		t.Errorf("apply over Istio's rules: exit %d %q; want a refusal naming --force", code, errOut)
	}
	if out := nstest.Run(t, path, "", "nft", "list", "tables"); strings.Contains(out, "nftmesh") {
		t.Errorf("the refused apply left a table:\n%s", out)
	}
	if code, _, errOut := runCLI(t, "apply", "--netns", path, "--run-dir", runDir, "--backend", "nftables", "-f", pod, "--force"); code != exitOK {
		t.Fatalf("apply --force: exit %d %q", code, errOut)
	}
	code, out, errOut = runCLI(t, "inspect", "--netns", path, "--run-dir", runDir, "--backend", "nftables", "-f", pod)
	if code != exitDrift || !strings.Contains(out, "istio-cni capture present") || strings.Contains(out, "live accept") {
		t.Errorf("inspect -f after --force: exit %d\n%s%s", code, out, errOut)
	}
}
