package capture_test

// The pipeline's own decisions (host guard, selection, clean-up after a
// failed Apply, removal from every backend, counts, the lock file's life)
// run here against the in-memory kernel of capturetest: no root needed. The
// kernel tests in this package prove the same paths on real namespaces.

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nftmesh/nftmesh/capture"
	"github.com/nftmesh/nftmesh/redirect"
	"github.com/nftmesh/nftmesh/testkit/capturetest"
	"github.com/nftmesh/nftmesh/testkit/scenarios"
)

const podNS = "/run/netns/pod"

var (
	podV4 = netip.MustParseAddr("198.51.100.7")
	podV6 = netip.MustParseAddr("2001:db8::7")
)

// fake is a fake kernel with one pod namespace, its pipeline and options
// with a private run dir.
func fake(t *testing.T) (*capturetest.Fake, *capture.Pipeline, capture.Options) {
	t.Helper()
	f := capturetest.New()
	f.AddNetns(podNS, podV4, podV6)
	return f, f.Pipeline(), capture.Options{RunDir: t.TempDir()}
}

func open(t *testing.T, pl *capture.Pipeline, path string) *capture.Netns {
	t.Helper()
	n, err := pl.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

func TestFakeSelection(t *testing.T) {
	ctx := context.Background()
	noLegacy := errors.New("no legacy x_tables")
	for _, tc := range []struct {
		name    string
		backend string
		setup   func(*capturetest.Fake)
		want    string // backend chosen
		why     string // in the reason
		wantErr string
	}{
		{name: "fresh", backend: capture.Auto, want: capture.NFTables, why: "auto: default"},
		{name: "empty backend is auto", backend: "", want: capture.NFTables, why: "auto: default"},
		{name: "legacy nat rules", backend: capture.Auto, want: capture.Legacy, why: "legacy nat/mangle",
			setup: func(f *capturetest.Fake) { f.SetForeign(podNS, capturetest.Foreign{LegacyNatRules: true}) }},
		{name: "iptables-nft", backend: capture.Auto, want: capture.NFTables, why: "iptables-nft",
			setup: func(f *capturetest.Fake) { f.SetForeign(podNS, capturetest.Foreign{IptablesNFT: true}) }},
		{name: "ours in legacy", backend: capture.Auto, want: capture.Legacy, why: "iptables-legacy chains already present",
			setup: func(f *capturetest.Fake) { f.Install(podNS, capture.Legacy, scenarios.MustPlan(t, "defaults")) }},
		{name: "ours in nftables beats legacy rules", backend: capture.Auto, want: capture.NFTables, why: "nftables table already present",
			setup: func(f *capturetest.Fake) {
				f.SetForeign(podNS, capturetest.Foreign{LegacyNatRules: true})
				f.Install(podNS, capture.NFTables, scenarios.MustPlan(t, "defaults"))
			}},
		{name: "user namespaced", backend: capture.Auto, want: capture.NFTables, why: capture.UsernsReason,
			setup: func(f *capturetest.Fake) {
				f.SetForeign(podNS, capturetest.Foreign{UserNamespaced: true, LegacyNatRules: true})
			}},
		{name: "no legacy x_tables", backend: capture.Auto, want: capture.NFTables, why: "no legacy x_tables",
			setup: func(f *capturetest.Fake) {
				f.SetForeign(podNS, capturetest.Foreign{LegacyNatRules: true})
				f.SetLegacyAvailable(noLegacy)
			}},
		{name: "nftables requested", backend: capture.NFTables, want: capture.NFTables, why: "requested",
			setup: func(f *capturetest.Fake) { f.SetForeign(podNS, capturetest.Foreign{LegacyNatRules: true}) }},
		{name: "legacy requested", backend: capture.Legacy, want: capture.Legacy, why: "requested"},
		{name: "nftables requested beside ours in legacy", backend: capture.NFTables, wantErr: "already has nftmesh rules from the iptables-legacy backend",
			setup: func(f *capturetest.Fake) { f.Install(podNS, capture.Legacy, scenarios.MustPlan(t, "defaults")) }},
		{name: "legacy requested beside ours in nftables", backend: capture.Legacy, wantErr: "already has nftmesh rules from the nftables backend",
			setup: func(f *capturetest.Fake) { f.Install(podNS, capture.NFTables, scenarios.MustPlan(t, "defaults")) }},
		{name: "legacy requested, user namespaced", backend: capture.Legacy, wantErr: capture.ErrUserNamespaced.Error(),
			setup: func(f *capturetest.Fake) { f.SetForeign(podNS, capturetest.Foreign{UserNamespaced: true}) }},
		{name: "legacy requested, no legacy x_tables", backend: capture.Legacy, wantErr: "no legacy x_tables",
			setup: func(f *capturetest.Fake) { f.SetLegacyAvailable(noLegacy) }},
		{name: "unknown backend", backend: "ipfw", wantErr: `backend "ipfw"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, pl, o := fake(t)
			if tc.setup != nil {
				tc.setup(f)
			}
			o.Backend = tc.backend
			p := scenarios.MustPlan(t, "defaults")
			res, err := pl.Apply(ctx, open(t, pl, podNS), p, o)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Apply = %v, want an error containing %q", err, tc.wantErr)
				}
				if tc.backend == capture.Legacy && strings.Contains(tc.wantErr, "user namespace") && !errors.Is(err, capture.ErrUserNamespaced) {
					t.Errorf("Apply = %v, does not wrap ErrUserNamespaced", err)
				}
				if got := f.Calls(); slices.ContainsFunc(got, func(c string) bool { return strings.HasPrefix(c, capturetest.OpApply) }) {
					t.Errorf("a refused selection still applied: %v", got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if res.Backend != tc.want || !strings.Contains(res.Why, tc.why) {
				t.Errorf("Apply chose %s (%s), want %s (%s)", res.Backend, res.Why, tc.want, tc.why)
			}
			if res.Rules != capture.RuleCount(p) || res.Rules == 0 {
				t.Errorf("Applied.Rules = %d, want %d", res.Rules, capture.RuleCount(p))
			}
			if got := f.Backends(podNS); !slices.Equal(got, []string{tc.want}) {
				t.Errorf("after Apply the backends holding rules are %v, want [%s]", got, tc.want)
			}
			if err := f.Backend(tc.want).Check(ctx, podNS, p); err != nil {
				t.Errorf("the namespace does not hold the plan: %v", err)
			}
			name, err := pl.Check(ctx, open(t, pl, podNS), p, o)
			if err != nil || name != tc.want {
				t.Errorf("Check = %s, %v; want %s, nil", name, err, tc.want)
			}
		})
	}
}

// TestFakeSelectionLegacyProbe: auto asks the kernel whether it has legacy
// x_tables only where the namespace's legacy tables hold something, and
// decides as it would have with the answer: a namespace without legacy
// rules gets nftables whatever the kernel supports.
func TestFakeSelectionLegacyProbe(t *testing.T) {
	ctx := context.Background()
	noLegacy := errors.New("no legacy x_tables")
	for _, tc := range []struct {
		name     string
		foreign  capturetest.Foreign
		noLegacy bool
		want     string
		why      string
		probes   int
	}{
		{name: "fresh", want: capture.NFTables, why: "auto: default"},
		{name: "fresh, kernel without legacy", noLegacy: true, want: capture.NFTables, why: "auto: default"},
		{name: "iptables-nft", foreign: capturetest.Foreign{IptablesNFT: true}, want: capture.NFTables, why: "iptables-nft"},
		{name: "iptables-nft, kernel without legacy", foreign: capturetest.Foreign{IptablesNFT: true}, noLegacy: true, want: capture.NFTables, why: "iptables-nft"},
		{name: "legacy nat rules", foreign: capturetest.Foreign{LegacyNatRules: true}, want: capture.Legacy, why: "legacy nat/mangle", probes: 1},
		{name: "legacy nat rules, kernel without legacy", foreign: capturetest.Foreign{LegacyNatRules: true, IptablesNFT: true}, noLegacy: true, want: capture.NFTables, why: "no legacy x_tables", probes: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, pl, o := fake(t)
			f.SetForeign(podNS, tc.foreign)
			if tc.noLegacy {
				f.SetLegacyAvailable(noLegacy)
			}
			res, err := pl.Apply(ctx, open(t, pl, podNS), scenarios.MustPlan(t, "defaults"), o)
			if err != nil {
				t.Fatal(err)
			}
			if res.Backend != tc.want || !strings.Contains(res.Why, tc.why) {
				t.Errorf("Apply chose %s (%s), want %s (%s)", res.Backend, res.Why, tc.want, tc.why)
			}
			if got := f.LegacyProbes(); got != tc.probes {
				t.Errorf("the kernel was asked for legacy x_tables %d times, want %d", got, tc.probes)
			}
		})
	}
}

// TestFakeHostGuard: the host's namespace is refused by Open and by every
// verb, even when reached through a descriptor opened for reading.
func TestFakeHostGuard(t *testing.T) {
	ctx := context.Background()
	f, pl, o := fake(t)
	if err := f.AddHostNetns("/run/netns/host"); err != nil {
		t.Skip(err)
	}
	if _, err := pl.Open("/run/netns/host"); !errors.Is(err, capture.ErrHostNetns) {
		t.Fatalf("Linux().Open(host) = %v, want ErrHostNetns", err)
	}
	n, err := pl.OpenForReading("/run/netns/host")
	if err != nil {
		t.Fatal(err)
	}
	p := scenarios.MustPlan(t, "defaults")
	if _, err := pl.Apply(ctx, n, p, o); !errors.Is(err, capture.ErrHostNetns) {
		t.Errorf("Linux().Apply(host) = %v, want ErrHostNetns", err)
	}
	if _, err := pl.Check(ctx, n, p, o); !errors.Is(err, capture.ErrHostNetns) {
		t.Errorf("Linux().Check(host) = %v, want ErrHostNetns", err)
	}
	if _, err := pl.Remove(ctx, n, o); !errors.Is(err, capture.ErrHostNetns) {
		t.Errorf("Linux().Remove(host) = %v, want ErrHostNetns", err)
	}
	if c := f.Calls(); len(c) != 0 {
		t.Errorf("backends were called for the host's namespace: %v", c)
	}
	if _, err := pl.Open("/run/netns/missing"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Linux().Open(missing) = %v, want ErrNotExist", err)
	}
}

// TestFakeApplyFailure: a failed Apply into a namespace without rules of
// ours leaves nothing (even when the kernel took part of the write); one
// into a namespace an earlier run programmed never removes that run's
// rules.
func TestFakeApplyFailure(t *testing.T) {
	ctx := context.Background()
	boom := errors.New("netlink: no buffer space")
	for _, backend := range []string{capture.NFTables, capture.Legacy} {
		t.Run(backend+"/fresh, partial write", func(t *testing.T) {
			f, pl, o := fake(t)
			o.Backend = backend
			f.FailApply("", boom, true)
			res, err := pl.Apply(ctx, open(t, pl, podNS), scenarios.MustPlan(t, "tproxy"), o)
			if !errors.Is(err, boom) || res.Backend != backend {
				t.Fatalf("Apply = %+v, %v; want %s and %v", res, err, backend, boom)
			}
			if d := f.Dump(podNS); d != "" {
				t.Errorf("a failed Apply left:\n%s", d)
			}
			if c := f.Calls(); !slices.Contains(c, capturetest.OpRemove+" "+backend+" "+podNS) {
				t.Errorf("no clean-up after the failure: %v", c)
			}
		})
		t.Run(backend+"/fresh, clean-up fails too", func(t *testing.T) {
			f, pl, o := fake(t)
			o.Backend = backend
			stuck := errors.New("device busy")
			f.FailApply("", boom, true)
			f.FailRemove("", stuck)
			_, err := pl.Apply(ctx, open(t, pl, podNS), scenarios.MustPlan(t, "defaults"), o)
			if !errors.Is(err, boom) || !errors.Is(err, stuck) || !strings.Contains(err.Error(), "cleaning up after the failure") {
				t.Fatalf("Apply = %v, want both errors", err)
			}
		})
		t.Run(backend+"/earlier run's rules", func(t *testing.T) {
			f, pl, o := fake(t)
			o.Backend = backend
			before := scenarios.MustPlan(t, "defaults")
			f.Install(podNS, backend, before)
			f.FailApply("", boom, false)
			if _, err := pl.Apply(ctx, open(t, pl, podNS), scenarios.MustPlan(t, "dns-capture"), o); !errors.Is(err, boom) {
				t.Fatalf("Apply = %v, want %v", err, boom)
			}
			if err := f.Backend(backend).Check(ctx, podNS, before); err != nil {
				t.Errorf("the earlier run's rules are not intact: %v", err)
			}
			if c := f.Calls(); slices.ContainsFunc(c, func(s string) bool { return strings.HasPrefix(s, capturetest.OpRemove) }) {
				t.Errorf("a failed Apply removed an earlier run's rules: %v", c)
			}
		})
	}
}

// TestFakeCheck: rules changed behind the pipeline's back are drift, named
// line by line; an unreadable namespace is an error, not drift.
func TestFakeCheck(t *testing.T) {
	ctx := context.Background()
	f, pl, o := fake(t)
	p := scenarios.MustPlan(t, "defaults")
	n := open(t, pl, podNS)
	if _, err := pl.Apply(ctx, n, p, o); err != nil {
		t.Fatal(err)
	}
	if _, err := pl.Check(ctx, n, p, o); err != nil {
		t.Fatalf("Check right after Apply: %v", err)
	}
	f.Tamper(podNS, capture.NFTables, func(q *redirect.Plan) {
		c := &q.Tables[0].Chains[len(q.Tables[0].Chains)-1]
		c.Rules = c.Rules[:len(c.Rules)-1]
	})
	_, err := pl.Check(ctx, n, p, o)
	var d *redirect.DriftError
	if !errors.As(err, &d) || len(d.Lines) != 1 || !strings.HasPrefix(d.Lines[0], "-") {
		t.Fatalf("Check after removing a rule = %v, want one missing line", err)
	}
	if _, err := pl.Check(ctx, n, redirect.Plan{}, o); !redirect.IsDrift(err) {
		t.Errorf("Check against no capture = %v, want drift", err)
	}
	f.FailList("", errors.New("EPERM"))
	if _, err := pl.Check(ctx, n, p, o); err == nil || redirect.IsDrift(err) {
		t.Errorf("Check with an unreadable namespace = %v, want a non-drift error", err)
	}
	// What the reader does not decode of ours is drift, saying what.
	f, pl, o = fake(t)
	f.Install(podNS, capture.NFTables, p)
	f.FailList("", redirect.Unreadable(errors.New("set seen: address set without the interval flag")))
	if _, err := pl.Check(ctx, open(t, pl, podNS), p, o); !redirect.IsDrift(err) || !strings.Contains(err.Error(), "nftmesh does not write: listing nftables rules in netns "+podNS+": set seen") {
		t.Errorf("Check with content the reader does not decode = %v, want drift naming it", err)
	}
}

// TestFakeRemove: Remove with auto takes ours out of every backend that
// holds it (rules split across both worlds included), then the routes;
// with a backend named, only that one. The lock file goes with a
// successful Remove and stays after a failed one.
func TestFakeRemove(t *testing.T) {
	ctx := context.Background()
	locks := func(o capture.Options) []string {
		m, _ := filepath.Glob(filepath.Join(o.RunDir, "netns-locks", "*.lock"))
		return m
	}
	for _, tc := range []struct {
		name    string
		backend string
		in      []string // backends holding the tproxy plan
		want    []string // Removal's backends, in order
		left    []string
		noLeg   bool
	}{
		{name: "auto, nothing", backend: capture.Auto},
		{name: "auto, nftables", backend: capture.Auto, in: []string{capture.NFTables}, want: []string{capture.NFTables, "routes"}},
		{name: "auto, legacy", backend: capture.Auto, in: []string{capture.Legacy}, want: []string{capture.Legacy, "routes"}},
		{name: "auto, both", backend: capture.Auto, in: []string{capture.NFTables, capture.Legacy}, want: []string{capture.NFTables, capture.Legacy, "routes"}},
		{name: "nftables named, both", backend: capture.NFTables, in: []string{capture.NFTables, capture.Legacy}, want: []string{capture.NFTables, "routes"}, left: []string{capture.Legacy}},
		{name: "legacy named, both", backend: capture.Legacy, in: []string{capture.NFTables, capture.Legacy}, want: []string{capture.Legacy, "routes"}, left: []string{capture.NFTables}},
		{name: "auto, no legacy x_tables", backend: capture.Auto, in: []string{capture.NFTables}, want: []string{capture.NFTables, "routes"}, noLeg: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, pl, o := fake(t)
			o.Backend = tc.backend
			for _, b := range tc.in {
				f.Install(podNS, b, scenarios.MustPlan(t, "tproxy"))
			}
			if tc.noLeg {
				f.SetLegacyAvailable(errors.New("no legacy x_tables"))
			}
			removal, err := pl.Remove(ctx, open(t, pl, podNS), o)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, r := range removal {
				got = append(got, r.Backend)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("Remove took %v (%s), want %v", got, removal, tc.want)
			}
			if len(tc.want) == 0 && removal.String() != "nothing to remove" {
				t.Errorf("Removal = %q", removal)
			}
			if left := f.Backends(podNS); !slices.Equal(left, tc.left) {
				t.Errorf("left in %v, want %v:\n%s", left, tc.left, f.Dump(podNS))
			}
			if len(tc.left) == 0 && f.Dump(podNS) != "" {
				t.Errorf("left:\n%s", f.Dump(podNS))
			}
			if l := locks(o); len(l) != 0 {
				t.Errorf("lock files left after a successful Remove: %v", l)
			}
		})
	}
	t.Run("routes alone", func(t *testing.T) {
		f, pl, o := fake(t)
		p := scenarios.MustPlan(t, "tproxy")
		f.Install(podNS, capture.NFTables, redirect.Plan{Routes: p.Routes, LoopbackAddrs: p.LoopbackAddrs})
		f.Tamper(podNS, capture.NFTables, func(*redirect.Plan) {})
		removal, err := pl.Remove(ctx, open(t, pl, podNS), o)
		if err != nil || len(removal) != 1 || removal[0].Backend != "routes" {
			t.Fatalf("Remove = %v, %v; want the routes alone", removal, err)
		}
		if d := f.Dump(podNS); d != "" {
			t.Errorf("left:\n%s", d)
		}
	})
	t.Run("unreadable", func(t *testing.T) {
		// What a backend cannot read of ours is removed by name all the
		// same, the Removal saying so; then the next backend.
		f, pl, o := fake(t)
		f.Install(podNS, capture.NFTables, scenarios.MustPlan(t, "tproxy"))
		f.Install(podNS, capture.Legacy, scenarios.MustPlan(t, "defaults"))
		f.FailList(capture.NFTables, redirect.Unreadable(errors.New("set seen: address set without the interval flag")))
		removal, err := pl.Remove(ctx, open(t, pl, podNS), o)
		if err != nil || len(removal) != 2 || removal[0].Backend != capture.NFTables || !strings.Contains(removal[0].Unread, "set seen") || removal[1].Backend != capture.Legacy || removal[1].Unread != "" {
			t.Fatalf("Remove = %+v, %v; want nftables removed unread, then legacy", removal, err)
		}
		if !strings.Contains(removal.String(), "removed unread: listing nftables rules in netns "+podNS+": set seen") {
			t.Errorf("Removal = %q, want the listing error", removal)
		}
		if d := f.Dump(podNS); d != "" {
			t.Errorf("left:\n%s", d)
		}
		if l := locks(o); len(l) != 0 {
			t.Errorf("lock files left after a successful Remove: %v", l)
		}
	})
	t.Run("unreadable and failure", func(t *testing.T) {
		f, pl, o := fake(t)
		f.Install(podNS, capture.NFTables, scenarios.MustPlan(t, "defaults"))
		f.FailList(capture.NFTables, errors.New("EPERM"))
		f.FailRemove(capture.NFTables, errors.New("EBUSY"))
		_, err := pl.Remove(ctx, open(t, pl, podNS), o)
		if err == nil || !strings.Contains(err.Error(), "EPERM") || !strings.Contains(err.Error(), "removing nftables rules without listing them") || !strings.Contains(err.Error(), "EBUSY") {
			t.Fatalf("Remove = %v, want both errors", err)
		}
	})
	t.Run("failure", func(t *testing.T) {
		f, pl, o := fake(t)
		f.Install(podNS, capture.Legacy, scenarios.MustPlan(t, "defaults"))
		f.FailRemove(capture.Legacy, errors.New("EBUSY"))
		_, err := pl.Remove(ctx, open(t, pl, podNS), o)
		if err == nil || !strings.Contains(err.Error(), "removing iptables-legacy rules") {
			t.Fatalf("Remove = %v, want the legacy error", err)
		}
		if l := locks(o); len(l) != 1 {
			t.Errorf("lock files after a failed Remove: %v, want the namespace's", l)
		}
	})
}

// TestFakeForeign: CHECK's look for another installer's capture reads
// both worlds, legacy only where the kernel has it.
func TestFakeForeign(t *testing.T) {
	ctx := context.Background()
	f, pl, _ := fake(t)
	n := open(t, pl, podNS)
	if got, err := pl.Foreign(ctx, n); err != nil || len(got) != 0 {
		t.Fatalf("Linux().Foreign(clean) = %v, %v", got, err)
	}
	f.SetForeign(podNS, capturetest.Foreign{LegacyChains: []string{"ipv4 nat ISTIO_OUTPUT"}, NFTables: []string{"nftables table inet istio-proxy-nat"}})
	got, err := pl.Foreign(ctx, n)
	want := []string{"iptables-legacy ipv4 nat ISTIO_OUTPUT", "nftables table inet istio-proxy-nat"}
	if err != nil || !slices.Equal(got, want) {
		t.Errorf("Foreign = %v, %v; want %v", got, err, want)
	}
	f.SetLegacyAvailable(errors.New("no legacy x_tables"))
	if got, _ := pl.Foreign(ctx, n); !slices.Equal(got, want[1:]) {
		t.Errorf("Foreign without legacy x_tables = %v, want %v", got, want[1:])
	}
}

// TestFakeApplyRefuseForeign: with RefuseForeign, Apply looks for another
// installer's capture in the visit it writes through (one Enter in all)
// and, finding some, fails with a *ForeignError naming it and writes
// nothing; without the option, or where nothing is found, it applies.
func TestFakeApplyRefuseForeign(t *testing.T) {
	ctx := context.Background()
	p := scenarios.MustPlan(t, "defaults")

	f, pl, o := fake(t)
	o.RefuseForeign = true
	f.SetForeign(podNS, capturetest.Foreign{LegacyChains: []string{"ipv4 nat ISTIO_OUTPUT"}, NFTables: []string{"nftables table inet istio-proxy-nat"}})
	_, err := pl.Apply(ctx, open(t, pl, podNS), p, o)
	var fe *capture.ForeignError
	want := []string{"iptables-legacy ipv4 nat ISTIO_OUTPUT", "nftables table inet istio-proxy-nat"}
	if !errors.As(err, &fe) || fe.Netns != podNS || !slices.Equal(fe.Found, want) {
		t.Fatalf("Apply over foreign capture = %v; want a ForeignError in %s naming %v", err, podNS, want)
	}
	if got := f.Backends(podNS); len(got) != 0 || len(f.Calls()) != 0 {
		t.Errorf("the refused Apply wrote: backends %v, calls %v", got, f.Calls())
	}
	if n := f.Enters(); n != 1 {
		t.Errorf("the refused Apply entered the namespace %d times, want 1", n)
	}

	o.RefuseForeign = false
	if _, err := pl.Apply(ctx, open(t, pl, podNS), p, o); err != nil {
		t.Fatalf("Apply without RefuseForeign over foreign capture: %v", err)
	}

	g, gpl, og := fake(t)
	og.RefuseForeign = true
	if _, err := gpl.Apply(ctx, open(t, gpl, podNS), p, og); err != nil {
		t.Fatalf("Apply with RefuseForeign, nothing foreign: %v", err)
	}
	if got := g.Backends(podNS); !slices.Equal(got, []string{capture.NFTables}) || g.Enters() != 1 {
		t.Errorf("Apply with RefuseForeign, nothing foreign: backends %v after %d visits; want nftables after 1", got, g.Enters())
	}
}

// TestFakeDump: the fake shows a namespace as the renderers write it.
func TestFakeDump(t *testing.T) {
	ctx := context.Background()
	f, pl, o := fake(t)
	p := scenarios.MustPlan(t, "defaults")
	if _, err := pl.Apply(ctx, open(t, pl, podNS), p, o); err != nil {
		t.Fatal(err)
	}
	text, err := capture.RenderNft(p)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := f.Dump(podNS), "# nftables\n"+text; got != want {
		t.Errorf("Dump:\n%s\nwant:\n%s", got, want)
	}
	f2, pl2, o2 := fake(t)
	o2.Backend = capture.Legacy
	if _, err := pl2.Apply(ctx, open(t, pl2, podNS), p, o2); err != nil {
		t.Fatal(err)
	}
	text, err = capture.RenderIptables(p)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := f2.Dump(podNS), "# iptables-legacy\n"+text; got != want {
		t.Errorf("Dump:\n%s\nwant:\n%s", got, want)
	}
}

// TestFakeLock: while one verb is inside a backend, every other verb on
// the same namespace waits for its lock (here until its deadline), and
// one on another namespace does not.
func TestFakeLock(t *testing.T) {
	ctx := context.Background()
	f, pl, o := fake(t)
	f.AddNetns("/run/netns/other", podV4)
	entered, release := f.Block(capturetest.OpApply, "")
	defer release()
	p := scenarios.MustPlan(t, "defaults")
	done := make(chan error, 1)
	go func() {
		n, err := pl.Open(podNS)
		if err == nil {
			_, err = pl.Apply(ctx, n, p, o)
			n.Close()
		}
		done <- err
	}()
	<-entered
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := pl.Check(short, open(t, pl, podNS), p, o); err == nil || !strings.Contains(err.Error(), "waiting for the lock") {
		t.Errorf("Check during an Apply = %v, want it to wait for the lock", err)
	}
	if _, err := pl.Remove(short, open(t, pl, podNS), o); err == nil || !strings.Contains(err.Error(), "waiting for the lock") {
		t.Errorf("Remove during an Apply = %v, want it to wait for the lock", err)
	}
	if _, err := pl.Apply(ctx, open(t, pl, "/run/netns/other"), p, o); err != nil {
		t.Errorf("Apply into another namespace during an Apply: %v", err)
	}
	release()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, err := pl.Check(ctx, open(t, pl, podNS), p, o); err != nil {
		t.Errorf("Check after the Apply: %v", err)
	}
}

// Options.Locked runs once per verb, after the lock is held (a second run
// on the namespace would wait) and before the verb reads or writes the
// namespace; a verb that never gets the lock does not call it.
func TestFakeLockedHook(t *testing.T) {
	ctx := context.Background()
	f, pl, o := fake(t)
	p := scenarios.MustPlan(t, "defaults")
	for _, verb := range []string{"apply", "check", "remove"} {
		t.Run(verb, func(t *testing.T) {
			calls, before := 0, -1
			o := o
			o.Locked = func() {
				calls++
				before = len(f.Calls())
				short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
				defer cancel()
				if _, err := pl.Check(short, open(t, pl, podNS), p, capture.Options{RunDir: o.RunDir}); err == nil || !strings.Contains(err.Error(), "waiting for the lock") {
					t.Errorf("Check inside the hook = %v, want it to wait for the lock", err)
				}
			}
			n := open(t, pl, podNS)
			var err error
			switch verb {
			case "apply":
				_, err = pl.Apply(ctx, n, p, o)
			case "check":
				_, err = pl.Check(ctx, n, p, o)
			case "remove":
				_, err = pl.Remove(ctx, n, o)
			}
			if err != nil {
				t.Fatal(err)
			}
			if calls != 1 {
				t.Fatalf("Locked called %d times, want 1", calls)
			}
			if len(f.Calls()) <= before {
				t.Errorf("the verb touched the kernel before Locked: calls %v, %d before the hook", f.Calls(), before)
			}
		})
	}
	// Refused before the lock (the host's namespace): no hook.
	if err := f.AddHostNetns("/run/netns/host"); err != nil {
		t.Skip(err)
	}
	host, err := pl.OpenForReading("/run/netns/host")
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	o.Locked = func() { t.Error("Locked called for a verb refused before the lock") }
	if _, err := pl.Apply(ctx, host, p, o); !errors.Is(err, capture.ErrHostNetns) {
		t.Fatalf("Linux().Apply(host) = %v, want ErrHostNetns", err)
	}
}
