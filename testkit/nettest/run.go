package nettest

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/nftmesh/nftmesh/internal/netnsaddr"
	"github.com/nftmesh/nftmesh/netlab"
	"github.com/nftmesh/nftmesh/podinfo/meshpod"
	"github.com/nftmesh/nftmesh/redirect"
	"github.com/nftmesh/nftmesh/testkit/scenarios"
)

// Outcome is a probe case and what actually happened.
type Outcome struct {
	Case ProbeCase
	Got  netlab.Result
	// Took is how long the probe took; a captured or direct connection
	// takes about a millisecond, a lost SYN a second or more.
	Took time.Duration
	// Retried: the first attempt timed out and the probe was sent again.
	Retried bool
}

// OK reports whether the probe landed where expected with the expected
// original destination.
func (o Outcome) OK() bool {
	if o.Got.Landed != o.Case.WantLanded {
		return false
	}
	return !o.Case.WantOrig.IsValid() || o.Got.OrigDst == o.Case.WantOrig
}

func (o Outcome) String() string {
	want := o.Case.WantLanded
	if o.Case.WantOrig.IsValid() {
		want = fmt.Sprintf("%s (orig %s)", want, o.Case.WantOrig)
	}
	return fmt.Sprintf("%s [%s]: want %s, got %s (%s)", o.Case.Name, o.Case.Probe, want, o.Got, o.Case.Why)
}

// RunProbes sends every case's probe, one after the other (each fails within
// a few seconds at most), and returns the outcomes in order.
func RunProbes(t *netlab.Topology, cases []ProbeCase) []Outcome {
	out := make([]Outcome, len(cases))
	for i, c := range cases {
		start := time.Now()
		got := t.Probe(c.Probe)
		// A timeout where a landing was expected is retried once: on a
		// loaded 2-core machine a lost first SYN or a starved listener can
		// exceed the deadline. A rule that really sends the probe nowhere
		// times out again; Retried records that it happened.
		retried := false
		if got.Landed == netlab.LandedTimeout && c.WantLanded != netlab.LandedTimeout {
			retried = true
			got = t.Probe(c.Probe)
		}
		out[i] = Outcome{Case: c, Got: got, Took: time.Since(start), Retried: retried}
	}
	return out
}

// TestingT is the part of testing.TB AssertScenario uses; it keeps the
// testing package out of this package's non-test code.
type TestingT interface {
	Helper()
	Logf(format string, args ...any)
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
	Cleanup(func())
}

// NewLab builds a topology and starts its listeners, both removed in
// t.Cleanup (listeners first: their open sockets would keep the namespaces
// alive).
func NewLab(t TestingT, o netlab.TopologyOptions, lo netlab.ListenerOptions) (*netlab.Topology, *netlab.Listeners) {
	t.Helper()
	topo, err := netlab.NewTopology(o)
	if err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(func() {
		if err := topo.Close(); err != nil {
			t.Errorf("%v", err)
		}
	})
	ls, err := netlab.StartListeners(topo, lo)
	if err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(func() {
		if err := ls.Close(); err != nil {
			t.Errorf("closing listeners: %v", err)
		}
	})
	return topo, ls
}

// ScenarioRun is a scenario applied with a backend in a live topology, and
// what its probes did.
type ScenarioRun struct {
	Spec     redirect.Spec
	Plan     redirect.Plan
	Topo     *netlab.Topology
	Outcomes []Outcome
}

// TopologyOptionsFor returns the options a scenario's spec needs: the pod's
// interface takes the name of the first excluded (else rerouted) interface,
// so the rules about that interface apply to the veth.
func TopologyOptionsFor(s redirect.Spec) netlab.TopologyOptions {
	var o netlab.TopologyOptions
	for _, names := range [][]string{s.ExcludeInterfaces, s.RerouteVirtualInterfaces} {
		for _, n := range names {
			if n != "" && !strings.HasSuffix(n, "+") && n != "lo" && o.PodIface == "" {
				o.PodIface = n
			}
		}
	}
	return o
}

// RunScenario builds a topology for the scenario (with the scenario's
// address families), checks that Istio's IPv6 decision taken from the
// addresses the kernel lists there is the scenario's, starts the listeners,
// applies the scenario's plan with backend into the pod namespace, checks
// that ::6 is on lo exactly when IPv6 is captured, and sends every probe of
// ExpectedProbes. Everything is removed in t.Cleanup, so the topology stays
// usable until the test ends.
func RunScenario(t TestingT, backend redirect.Backend, sc scenarios.Scenario) ScenarioRun {
	t.Helper()
	spec, err := sc.Spec()
	if err != nil {
		t.Fatalf("%v", err)
	}
	plan, err := redirect.Build(spec)
	if err != nil {
		t.Fatalf("building plan of scenario %s: %v", sc.Name, err)
	}
	opts := TopologyOptionsFor(spec)
	opts.Stack = sc.Stack
	topo, err := netlab.NewTopology(opts)
	if err != nil {
		t.Fatalf("scenario %s: %v", sc.Name, err)
	}
	t.Cleanup(func() {
		if err := topo.Close(); err != nil {
			t.Errorf("scenario %s: %v", sc.Name, err)
		}
	})
	if err := CheckIPv6Decision(topo, spec); err != nil {
		t.Fatalf("scenario %s: %v", sc.Name, err)
	}
	ls, err := netlab.StartListeners(topo, netlab.ListenerOptions{ProxyUID: spec.ProxyUIDs[0], ProxyGID: spec.ProxyGIDs[0]})
	if err != nil {
		t.Fatalf("scenario %s: %v", sc.Name, err)
	}
	// Registered after the topology's: cleanups run last-in first-out, and
	// open sockets would keep the namespaces alive.
	t.Cleanup(func() {
		if err := ls.Close(); err != nil {
			t.Errorf("scenario %s: closing listeners: %v", sc.Name, err)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := backend.Apply(ctx, topo.PodNetnsPath(), plan); err != nil {
		t.Fatalf("scenario %s: applying with %s: %v", sc.Name, backend.Name(), err)
	}
	if err := CheckPassthroughV6(topo, spec.IPv6); err != nil {
		t.Errorf("scenario %s, backend %s: %v", sc.Name, backend.Name(), err)
	}
	cases := ExpectedProbesFor(&spec, topo)
	return ScenarioRun{Spec: spec, Plan: plan, Topo: topo, Outcomes: RunProbes(topo, cases)}
}

// AssertScenario runs the scenario with RunScenario and reports each probe
// that did not land where ExpectedProbes says, with the probe's name, the
// expected and the actual landing.
func AssertScenario(t TestingT, backend redirect.Backend, sc scenarios.Scenario) {
	t.Helper()
	run := RunScenario(t, backend, sc)
	bad := 0
	for _, o := range run.Outcomes {
		if !o.OK() {
			bad++
			t.Errorf("scenario %s, backend %s: MISMATCH %s", sc.Name, backend.Name(), o)
			continue
		}
		retry := ""
		if o.Retried {
			retry = " (after one timed-out attempt)"
		}
		t.Logf("ok %s in %v%s", o, o.Took.Round(time.Millisecond), retry)
	}
	t.Logf("scenario %s, backend %s: %d/%d probes as expected", sc.Name, backend.Name(), len(run.Outcomes)-bad, len(run.Outcomes))
}

// CheckIPv6Decision reads the pod namespace's addresses as the kernel lists
// them and checks that they are the topology's Stack in the kernel's order
// (IPv4 first, meshpod.KernelOrder), the order Istio's IPv6 decision reads
// them in, and that Istio's decision over them
// (meshpod.IPv6Capture with spec.DualStack) is spec.IPv6.
func CheckIPv6Decision(topo *netlab.Topology, spec redirect.Spec) error {
	all, err := netnsaddr.List(topo.PodNetnsPath())
	if err != nil {
		return err
	}
	counted := slices.DeleteFunc(slices.Clone(all), func(a netip.Addr) bool { return !meshpod.Counts(a) })
	if want := meshpod.KernelOrder(topo.Stack.Added()); !slices.Equal(counted, want) {
		return fmt.Errorf("pod namespace (%s) lists %v, of which %v count for Istio's IPv6 decision; want %v", topo.Stack, all, counted, want)
	}
	if got := meshpod.IPv6Capture(all, spec.DualStack); got != spec.IPv6 {
		return fmt.Errorf("IPv6 capture decided from the pod namespace's addresses %v (dual-stack sidecar %t) is %t, the spec says %t", all, spec.DualStack, got, spec.IPv6)
	}
	return nil
}

// CheckPassthroughV6 checks that ::6 is on the pod's lo exactly when want
// (IPv6 captured): Istio adds it only then.
func CheckPassthroughV6(topo *netlab.Topology, want bool) error {
	all, err := netnsaddr.List(topo.PodNetnsPath())
	if err != nil {
		return err
	}
	if got := slices.Contains(all, netlab.PassthroughV6); got != want {
		return fmt.Errorf("%s on the pod's lo: %t, want %t (addresses %v)", netlab.PassthroughV6, got, want, all)
	}
	return nil
}
