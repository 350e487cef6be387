package main

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nftmesh/nftmesh/iptables"
	"github.com/nftmesh/nftmesh/nft"
	"github.com/nftmesh/nftmesh/redirect"
	"github.com/nftmesh/nftmesh/testkit/notnetns"

	"github.com/nftmesh/nftmesh/testkit/nstest"
)

// TestCLICleanBothBackends: `redirect clean` (auto) removes nftmesh's rules
// from nftables AND iptables-legacy when both hold them, says what it
// removed from which, keeps another installer's ISTIO_* chain, and then says
// there is nothing to remove.
func TestCLICleanBothBackends(t *testing.T) {
	nstest.NeedRoot(t)
	if err := iptables.LegacyAvailable(); err != nil {
		t.Skip(err)
	}
	name, path := nstest.New(t, "rcli-")
	spec := redirect.DefaultSpec()
	spec.InterceptionMode = redirect.ModeTProxy
	spec.IPv6 = true
	p, err := redirect.Build(spec)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := nft.New().Apply(ctx, path, p); err != nil {
		t.Fatal(err)
	}
	if err := iptables.New().Apply(ctx, path, p); err != nil {
		t.Fatal(err)
	}
	nstest.Run(t, name, "", "iptables-legacy", "-t", "nat", "-N", "ISTIO_FOREIGN")
	nstest.Run(t, name, "", "iptables-legacy", "-t", "nat", "-A", "ISTIO_FOREIGN", "-p", "tcp", "--dport", "7", "-j", "RETURN")
	runDir := t.TempDir()

	code, out, errOut := runCLI(t, "clean", "--netns", path, "--run-dir", runDir)
	if code != exitOK {
		t.Fatalf("clean: exit %d: %s", code, errOut)
	}
	for _, want := range []string{"nftables: table inet nftmesh", "iptables-legacy: ", "fwmark 1337", "::6 on lo"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("clean output %q does not say %q", errOut, want)
		}
	}
	if out != "" {
		t.Errorf("stdout: %q", out)
	}
	for _, b := range []redirect.Backend{nft.New(), iptables.New()} {
		if left, err := b.List(ctx, path); err != nil || !left.Empty() {
			t.Errorf("%s still holds rules of ours (%v):\n%s", b.Name(), err, strings.Join(redirect.Describe(left), "\n"))
		}
	}
	if saved := nstest.Run(t, name, "", "iptables-legacy-save", "-t", "nat"); !strings.Contains(saved, "-A ISTIO_FOREIGN -p tcp -m tcp --dport 7 -j RETURN") {
		t.Errorf("the foreign ISTIO_FOREIGN chain is gone:\n%s", saved)
	}
	code, _, errOut = runCLI(t, "clean", "--netns", path, "--run-dir", runDir)
	if code != exitOK || !strings.Contains(errOut, "nothing to remove") {
		t.Errorf("second clean: exit %d, %q; want nothing to remove", code, errOut)
	}
}

// TestCLINotANetns: apply, clean and inspect with --netns naming a FIFO, a
// regular file, a directory, a socket or a device fail at once (no hang on
// the FIFO) with an error naming the path and what it is.
func TestCLINotANetns(t *testing.T) {
	dir := t.TempDir()
	targets := notnetns.Files(t, dir)
	for path, kind := range targets {
		for _, verb := range [][]string{
			{"apply", "-a", "sidecar.istio.io/interceptionMode=REDIRECT"},
			{"clean"},
			{"inspect"},
		} {
			args := append(append([]string{}, verb...), "--netns", path, "--run-dir", dir)
			done := make(chan struct{})
			var code int
			var errOut string
			go func() {
				code, _, errOut = runCLI(t, args...)
				close(done)
			}()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatalf("redirect %v hangs", args)
			}
			if code != exitFailure || !strings.Contains(errOut, path) || !strings.Contains(errOut, kind) {
				t.Errorf("redirect %v: exit %d, %q; want exit %d naming %s and %q", args, code, errOut, exitFailure, path, kind)
			}
		}
	}
}

// TestCLIInspectJSON: inspect -o json prints the live plan (an empty one in
// a namespace without our rules) and, with a pod, {inSync, drift} with exit
// 0 or 3, read back from a real namespace.
func TestCLIInspectJSON(t *testing.T) {
	nstest.NeedRoot(t)
	_, path := nstest.New(t, "rcli-")
	runDir := t.TempDir()
	pod := filepath.Join("..", "..", "testdata", "pods", "injected.yaml")
	type planDoc struct {
		SchemaVersion int              `json:"schemaVersion"`
		Tables        []map[string]any `json:"tables"`
	}
	var empty planDoc
	code, out, errOut := runCLI(t, "inspect", "--netns", path, "--run-dir", runDir, "--backend", "nftables", "-o", "json")
	if err := json.Unmarshal([]byte(out), &empty); code != exitOK || err != nil || empty.SchemaVersion != schemaVersion || len(empty.Tables) != 0 {
		t.Fatalf("inspect -o json of an empty netns: exit %d, %v, %q (stderr %q)", code, err, out, errOut)
	}
	if code, _, errOut := runCLI(t, "apply", "--netns", path, "--run-dir", runDir, "--backend", "nftables", "-f", pod); code != exitOK {
		t.Fatalf("apply: exit %d: %s", code, errOut)
	}
	var live planDoc
	code, out, _ = runCLI(t, "inspect", "--netns", path, "--run-dir", runDir, "--backend", "nftables", "-o", "json")
	if err := json.Unmarshal([]byte(out), &live); code != exitOK || err != nil || len(live.Tables) == 0 {
		t.Fatalf("inspect -o json after apply: exit %d, %v, %q", code, err, out)
	}

	type driftDoc struct {
		SchemaVersion int      `json:"schemaVersion"`
		Netns         string   `json:"netns"`
		Subject       string   `json:"subject"`
		Backend       string   `json:"backend"`
		InSync        bool     `json:"inSync"`
		Drift         []string `json:"drift"`
		Effects       []struct {
			Packet, Planned, Live, Why string
		} `json:"effects"`
	}
	var d driftDoc
	code, out, errOut = runCLI(t, "inspect", "--netns", path, "--run-dir", runDir, "--backend", "nftables", "-f", pod, "-o", "json")
	if err := json.Unmarshal([]byte(out), &d); code != exitOK || err != nil || !d.InSync || d.Drift == nil || len(d.Drift) != 0 || d.Netns != path || d.Subject != "pod shop/web-1" || d.Backend == "" {
		t.Fatalf("in sync: exit %d, %v, %+v (stderr %q)", code, err, d, errOut)
	}
	code, out, errOut = runCLI(t, "inspect", "--netns", path, "--run-dir", runDir, "--backend", "nftables", "-o", "json",
		"-a", redirect.AnnotationExcludeOutboundIPRanges+"=192.0.2.0/24")
	d = driftDoc{}
	if err := json.Unmarshal([]byte(out), &d); code != exitDrift || err != nil || d.InSync || len(d.Drift) == 0 || d.SchemaVersion != schemaVersion {
		t.Fatalf("drift: exit %d, %v, %+v (stderr %q)", code, err, d, errOut)
	}
	if !strings.Contains(strings.Join(d.Drift, "\n"), "192.0.2.0/24") {
		t.Errorf("drift does not name the missing range: %q", d.Drift)
	}
	// The effect of the missing exclusion: the app's traffic to the range
	// would now be captured instead of going straight out.
	found := false
	for _, e := range d.Effects {
		if strings.Contains(e.Packet, "uid 1000") && strings.Contains(e.Packet, "192.0.2.1:") && e.Planned == "accept" && e.Live == "redirect :15001" &&
			strings.Contains(e.Why, "missing rule in nat-istio-output") && strings.Contains(e.Why, "@outbound-exclude-v4") {
			found = true
		}
	}
	if !found {
		t.Errorf("no effect explains the missing exclusion: %+v", d.Effects)
	}
	code, out, _ = runCLI(t, "inspect", "--netns", path, "--run-dir", runDir, "--backend", "nftables",
		"-a", redirect.AnnotationExcludeOutboundIPRanges+"=192.0.2.0/24")
	if code != exitDrift || !strings.Contains(out, "effect (traced through the planned and the live rules):") || !strings.Contains(out, "planned accept, live redirect :15001") {
		t.Errorf("text inspect does not explain the drift: exit %d\n%s", code, out)
	}
}

// TestCLINetnsName: --netns takes an `ip netns` name as well as a path; a
// name that does not exist is a usage error naming it.
func TestCLINetnsName(t *testing.T) {
	nstest.NeedRoot(t)
	name, path := nstest.New(t, "rcli-")
	runDir := t.TempDir()
	ann := redirect.AnnotationIncludeInboundPorts + "=8080"
	if code, _, errOut := runCLI(t, "apply", "--netns", name, "--run-dir", runDir, "--backend", "nftables", "-a", ann); code != exitOK || !strings.Contains(errOut, path) {
		t.Fatalf("apply --netns %s: exit %d: %s", name, code, errOut)
	}
	if code, out, errOut := runCLI(t, "inspect", "--netns", name, "--run-dir", runDir, "--backend", "nftables", "-a", ann); code != exitOK || !strings.Contains(out, "in sync") || !strings.Contains(out, path) {
		t.Errorf("inspect --netns %s: exit %d: %s %s", name, code, out, errOut)
	}
	if code, _, errOut := runCLI(t, "clean", "--netns", name, "--run-dir", runDir); code != exitOK || !strings.Contains(errOut, "table inet nftmesh") {
		t.Errorf("clean --netns %s: exit %d: %s", name, code, errOut)
	}
	missing := name + "-missing"
	for _, verb := range []string{"apply", "inspect", "clean"} {
		code, _, errOut := runCLI(t, verb, "--netns", missing, "--run-dir", runDir)
		if code != exitUsage || !strings.Contains(errOut, `"`+missing+`"`) || !strings.Contains(errOut, "ip netns list") {
			t.Errorf("%s --netns %s: exit %d: %s", verb, missing, code, errOut)
		}
	}
}
