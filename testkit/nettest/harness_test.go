package nettest

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"

	"github.com/nftmesh/nftmesh/netlab"
	"github.com/nftmesh/nftmesh/redirect"
	"github.com/nftmesh/nftmesh/testkit/scenarios"
)

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces, veths and netfilter rules")
	}
}

// TestProbesWithoutRules: with no capture rules every probe reaches its real
// destination, as the nil-spec model says.
func TestProbesWithoutRules(t *testing.T) {
	needRoot(t)
	topo, _ := NewLab(t, netlab.TopologyOptions{}, netlab.ListenerOptions{})
	cases := ExpectedProbesFor(nil, topo)
	peer := 0
	for _, o := range RunProbes(topo, cases) {
		if !o.OK() {
			t.Errorf("%s", o)
		}
		if strings.HasPrefix(o.Got.Landed, "peer:") {
			peer++
		}
		if o.Got.Landed == netlab.ListenerOutbound || o.Got.Landed == netlab.ListenerInbound || o.Got.Landed == netlab.ListenerDNS {
			t.Errorf("captured without rules: %s", o)
		}
	}
	if peer < 10 {
		t.Errorf("only %d probes reached the peer", peer)
	}
}

// TestHarnessDetectsMissingCapture makes sure AssertScenario can fail: with a
// backend that installs nothing, exactly the probes whose expected landing
// differs from the no-rules landing must be reported.
func TestHarnessDetectsMissingCapture(t *testing.T) {
	needRoot(t)
	for _, name := range []string{"defaults", "dns-capture", "tproxy"} {
		sc, _ := scenarios.ByName(name)
		spec, err := sc.Spec()
		if err != nil {
			t.Fatal(err)
		}
		// Count how many landings the scenario changes (same probes, no rules).
		withRules := ExpectedProbesFor(&spec, &netlab.Topology{AppPorts: netlab.DefaultAppPorts, PeerTCPPorts: netlab.DefaultPeerTCPPorts, PeerUDPPorts: netlab.DefaultPeerUDPPorts, PodIface: "eth0"})
		without := ExpectedProbesFor(nil, &netlab.Topology{AppPorts: netlab.DefaultAppPorts, PeerTCPPorts: netlab.DefaultPeerTCPPorts, PeerUDPPorts: netlab.DefaultPeerUDPPorts, PodIface: "eth0"})
		byName := map[string]string{}
		for _, c := range without {
			byName[c.Name] = c.WantLanded
		}
		differ := 0
		for _, c := range withRules {
			if l, ok := byName[c.Name]; ok && l != c.WantLanded {
				differ++
			} else if !ok {
				// Only probed with rules (e.g. passthrough over ::6, which
				// the backend adds): without the backend it cannot land.
				differ++
			}
		}
		if spec.IPv6 {
			differ++ // ::6 missing from lo
		}
		if differ < 5 {
			t.Fatalf("%s: only %d probes depend on the rules; the scenario proves little", name, differ)
		}
		ft := &fakeT{}
		done := make(chan struct{})
		go func() { // Fatalf ends this goroutine, not the test's
			defer close(done)
			AssertScenario(ft, noopBackend{}, sc)
		}()
		<-done
		ft.runCleanups()
		t.Logf("%s: no-op backend: %d mismatches, as expected", name, len(ft.errors))
		if ft.fatal != "" {
			t.Fatalf("%s: %s", name, ft.fatal)
		}
		if len(ft.errors) != differ {
			t.Errorf("%s: no-op backend produced %d mismatches, want %d:\n%s", name, len(ft.errors), differ, strings.Join(ft.errors, "\n"))
		}
	}
}

type noopBackend struct{}

func (noopBackend) Name() string                                        { return "noop" }
func (noopBackend) Apply(context.Context, string, redirect.Plan) error  { return nil }
func (noopBackend) List(context.Context, string) (redirect.Plan, error) { return redirect.Plan{}, nil }
func (noopBackend) Check(context.Context, string, redirect.Plan) error  { return nil }
func (noopBackend) Remove(context.Context, string) error                { return nil }

type fakeT struct {
	errors   []string
	fatal    string
	cleanups []func()
}

func (f *fakeT) Helper()             {}
func (f *fakeT) Logf(string, ...any) {}
func (f *fakeT) Errorf(format string, args ...any) {
	f.errors = append(f.errors, fmt.Sprintf(format, args...))
}
func (f *fakeT) Fatalf(format string, args ...any) {
	f.fatal = fmt.Sprintf(format, args...)
	runtime.Goexit()
}
func (f *fakeT) Cleanup(fn func()) { f.cleanups = append(f.cleanups, fn) }
func (f *fakeT) runCleanups() {
	for i := len(f.cleanups) - 1; i >= 0; i-- {
		f.cleanups[i]()
	}
}
