package main

// The kernel commands (apply, inspect, clean) against capturetest's
// in-memory kernel: their decisions without root. kernel_test.go proves
// them on real namespaces.

import (
	"errors"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nftmesh/nftmesh/capture"
	"github.com/nftmesh/nftmesh/redirect"
	"github.com/nftmesh/nftmesh/testkit/capturetest"
)

const fakeNetns = "/run/netns/cli-fake-pod"

func withFake(t *testing.T, addrs ...netip.Addr) *capturetest.Fake {
	t.Helper()
	f := capturetest.New()
	f.AddNetns(fakeNetns, addrs...)
	old := pipeline
	pipeline = f.Pipeline()
	t.Cleanup(func() { pipeline = old })
	return f
}

// TestFakeCleanEveryBackend: clean, like the plugin's DEL, removes ours
// from every backend that holds it (auto, the default), or from the named
// one only; nothing there is success.
func TestFakeCleanEveryBackend(t *testing.T) {
	run := func(t *testing.T, f *capturetest.Fake, args ...string) string {
		t.Helper()
		code, out, errOut := runCLI(t, append([]string{"clean", "--netns", fakeNetns, "--run-dir", t.TempDir()}, args...)...)
		if code != exitOK || out != "" {
			t.Fatalf("clean %v: exit %d, stdout %q, stderr %q", args, code, out, errOut)
		}
		return errOut
	}
	split := func(t *testing.T) *capturetest.Fake {
		f := withFake(t, netip.MustParseAddr("198.51.100.7"))
		p := tproxyPlan(t)
		f.Install(fakeNetns, capture.NFTables, p)
		f.Install(fakeNetns, capture.Legacy, p)
		return f
	}
	t.Run("auto", func(t *testing.T) {
		f := split(t)
		msg := run(t, f)
		for _, want := range []string{"nftables: table inet", "iptables-legacy: ", "routes: ip rule fwmark 1337 lookup 133"} {
			if !strings.Contains(msg, want) {
				t.Errorf("clean said %q, want %q in it", msg, want)
			}
		}
		if d := f.Dump(fakeNetns); d != "" {
			t.Errorf("clean left:\n%s", d)
		}
		if msg := run(t, f); !strings.Contains(msg, "nothing to remove") {
			t.Errorf("clean of a clean namespace said %q", msg)
		}
	})
	t.Run("named", func(t *testing.T) {
		f := split(t)
		run(t, f, "--backend", capture.NFTables)
		if got := f.Backends(fakeNetns); !slices.Equal(got, []string{capture.Legacy}) {
			t.Errorf("clean --backend nftables left %v, want the legacy rules alone", got)
		}
	})
}

// tproxyPlan is a TPROXY pod's plan (rules and policy routes).
func tproxyPlan(t *testing.T) redirect.Plan {
	t.Helper()
	spec, err := redirect.ParseAnnotations(redirect.DefaultSpec(), map[string]string{redirect.AnnotationInterceptionMode: "TPROXY"})
	if err != nil {
		t.Fatal(err)
	}
	d, err := capture.PlanSpec(spec, nil)
	if err != nil {
		t.Fatal(err)
	}
	return d.Plan
}

// TestFakeApplyInspect: apply decides IPv6 from the namespace's addresses
// (an IPv6-only pod gets it), inspect reports the namespace in sync, then
// drift once a rule is gone; a failing backend is exit 1 with nothing left.
func TestFakeApplyInspect(t *testing.T) {
	pods := filepath.Join("..", "..", "testdata", "pods")
	f := withFake(t, netip.MustParseAddr("2001:db8::7"))
	runDir := t.TempDir()
	code, _, errOut := runCLI(t, "apply", "--netns", fakeNetns, "--run-dir", runDir, "--pod", filepath.Join(pods, "injected.yaml"))
	if code != exitOK {
		t.Fatalf("apply: exit %d: %s", code, errOut)
	}
	held := f.Holds(fakeNetns, capture.NFTables)
	if len(held.LoopbackAddrs) != 1 {
		t.Errorf("apply in an IPv6-only namespace did not capture IPv6 (lo addresses %v)", held.LoopbackAddrs)
	}
	inspect := func() (int, string) {
		code, out, errOut := runCLI(t, "inspect", "--netns", fakeNetns, "--run-dir", runDir, "--pod", filepath.Join(pods, "injected.yaml"))
		return code, out + errOut
	}
	if code, out := inspect(); code != exitOK {
		t.Fatalf("inspect after apply: exit %d: %s", code, out)
	}
	f.Tamper(fakeNetns, capture.NFTables, func(p *redirect.Plan) {
		c := &p.Tables[0].Chains[0]
		c.Rules = c.Rules[1:]
	})
	if code, out := inspect(); code != exitDrift {
		t.Fatalf("inspect after tampering: exit %d, want %d: %s", code, exitDrift, out)
	}

	g := withFake(t, netip.MustParseAddr("198.51.100.7"))
	g.FailApply("", errors.New("no buffer space available"), true)
	code, _, errOut = runCLI(t, "apply", "--netns", fakeNetns, "--run-dir", t.TempDir(), "--defaults")
	if code != exitFailure || !strings.Contains(errOut, "no buffer space available") {
		t.Fatalf("apply with a failing backend: exit %d: %s", code, errOut)
	}
	if d := g.Dump(fakeNetns); d != "" {
		t.Errorf("a failed apply left:\n%s", d)
	}
}

// TestFakeApplyEntersOnce: apply looks for Istio's own capture in the one
// visit of the namespace that writes the rules (entering a namespace is a
// thread switch and a set of sockets, most of a short run's kernel work
// besides the batch), and refuses, writing nothing, when it is there.
func TestFakeApplyEntersOnce(t *testing.T) {
	f := withFake(t, netip.MustParseAddr("198.51.100.7"))
	if code, _, errOut := runCLI(t, "apply", "--netns", fakeNetns, "--run-dir", t.TempDir(), "--defaults"); code != exitOK {
		t.Fatalf("apply: exit %d: %s", code, errOut)
	}
	if n := f.Enters(); n != 1 {
		t.Errorf("apply entered the namespace %d times, want 1", n)
	}

	g := withFake(t, netip.MustParseAddr("198.51.100.7"))
	g.SetForeign(fakeNetns, capturetest.Foreign{IptablesNFT: true, NFTables: []string{"iptables-nft ipv4 nat ISTIO_OUTPUT"}})
	code, _, errOut := runCLI(t, "apply", "--netns", fakeNetns, "--run-dir", t.TempDir(), "--defaults")
	if code != exitFailure || !strings.Contains(errOut, "istio-cni capture present (iptables-nft ipv4 nat ISTIO_OUTPUT)") || !strings.Contains(errOut, "--force") {
		t.Errorf("apply over Istio's capture: exit %d %q; want a refusal naming it and --force", code, errOut)
	}
	if d := g.Dump(fakeNetns); d != "" || g.Enters() != 1 {
		t.Errorf("the refused apply entered %d times and left:\n%s", g.Enters(), d)
	}
	if code, _, errOut := runCLI(t, "apply", "--netns", fakeNetns, "--run-dir", t.TempDir(), "--defaults", "--force"); code != exitOK {
		t.Errorf("apply --force over Istio's capture: exit %d: %s", code, errOut)
	}
}
