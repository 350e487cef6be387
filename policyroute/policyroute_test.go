package policyroute

import (
	"crypto/rand"
	"encoding/hex"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netns"

	"github.com/nftmesh/nftmesh/internal/hostns"
	"github.com/nftmesh/nftmesh/redirect"
)

// These tests use `ip` (iproute2) as an independent reader and to plant
// another tool's routing, in throw-away namespaces.

func freshNetns(t *testing.T) (string, netns.NsHandle) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces, rtnetlink)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs iproute2's ip")
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	name := "nftmesh-pr-" + hex.EncodeToString(b)
	ipns(t, "", "netns", "add", name)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	ns, err := netns.GetFromName(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	ipns(t, name, "link", "set", "lo", "up")
	return name, ns
}

// ipns runs ip in namespace name ("" = here) and returns its output.
func ipns(t *testing.T, name string, args ...string) string {
	t.Helper()
	if name != "" {
		args = append([]string{"netns", "exec", name, "ip"}, args...)
	}
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func tproxyPlan() redirect.Plan {
	return redirect.Plan{
		Routes: []redirect.PolicyRoute{
			{Family: redirect.FamilyIPv4, Mark: redirect.TProxyMark, Table: redirect.TProxyRouteTab},
			{Family: redirect.FamilyIPv6, Mark: redirect.TProxyMark, Table: redirect.TProxyRouteTab},
		},
		LoopbackAddrs: []netip.Prefix{redirect.InboundPassthroughV6},
	}
}

// TestApplyListRemoveKeepsForeignRouting: our routes go in and read back
// as planned; another tool's fwmark routing in the same namespace survives
// a re-apply with another plan and Remove.
func TestApplyListRemoveKeepsForeignRouting(t *testing.T) {
	name, ns := freshNetns(t)
	ipns(t, name, "rule", "add", "fwmark", "0x100", "lookup", "100")
	ipns(t, name, "route", "add", "local", "default", "dev", "lo", "table", "100")
	foreign := redirect.PolicyRoute{Family: redirect.FamilyIPv4, Mark: 0x100, Table: 100}

	p := tproxyPlan()
	if err := Apply(hostns.Guard{}, ns, p, false); err != nil {
		t.Fatal(err)
	}
	routes, addrs, err := List(ns)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range append(p.Routes, foreign) {
		if !slices.Contains(routes, want) {
			t.Errorf("List lacks %+v: %+v", want, routes)
		}
	}
	if !slices.Equal(addrs, p.LoopbackAddrs) {
		t.Errorf("lo addresses %v, want %v", addrs, p.LoopbackAddrs)
	}
	if out := ipns(t, name, "-4", "rule"); !strings.Contains(out, "fwmark 0x539 lookup 133") {
		t.Errorf("ip rule does not show ours:\n%s", out)
	}

	// Re-apply without TPROXY: ours go, the foreign route stays.
	if err := Apply(hostns.Guard{}, ns, redirect.Plan{}, true); err != nil {
		t.Fatal(err)
	}
	if routes, addrs, _ = List(ns); !slices.Equal(routes, []redirect.PolicyRoute{foreign}) || len(addrs) != 0 {
		t.Errorf("after re-apply without TPROXY: routes %+v addrs %v, want only the foreign route", routes, addrs)
	}
	if err := Apply(hostns.Guard{}, ns, p, true); err != nil {
		t.Fatal(err)
	}
	if err := Remove(hostns.Guard{}, ns); err != nil {
		t.Fatal(err)
	}
	if routes, addrs, _ = List(ns); !slices.Equal(routes, []redirect.PolicyRoute{foreign}) || len(addrs) != 0 {
		t.Errorf("after Remove: routes %+v addrs %v, want only the foreign route", routes, addrs)
	}
	if out := ipns(t, name, "-4", "rule"); !strings.Contains(out, "fwmark 0x100 lookup 100") || strings.Contains(out, "lookup 133") {
		t.Errorf("ip rule after Remove:\n%s", out)
	}
	if err := Remove(hostns.Guard{}, ns); err != nil {
		t.Errorf("Remove of nothing: %v", err)
	}
}

// TestApplyUndoesOnFailure: with IPv6 off in the namespace the ::6 step
// fails after the routes went in; nothing of ours may stay.
func TestApplyUndoesOnFailure(t *testing.T) {
	name, ns := freshNetns(t)
	out, err := exec.Command("ip", "netns", "exec", name, "sysctl", "-qw", "net.ipv6.conf.lo.disable_ipv6=1").CombinedOutput()
	if err != nil {
		t.Skipf("cannot disable IPv6 in the namespace: %v %s", err, out)
	}
	p := tproxyPlan()
	p.Routes = p.Routes[:1] // IPv4 only: its rule and route go in first
	if err := Apply(hostns.Guard{}, ns, p, false); err == nil {
		t.Fatal("adding ::6 to lo with IPv6 disabled succeeded")
	}
	routes, addrs, err := List(ns)
	if err != nil {
		t.Fatal(err)
	}
	if len(routes) != 0 || len(addrs) != 0 {
		t.Errorf("a failed Apply left routes %+v addrs %v", routes, addrs)
	}
	if out := ipns(t, name, "-4", "rule"); strings.Contains(out, "lookup 133") {
		t.Errorf("a failed Apply left its ip rule:\n%s", out)
	}
	if out := ipns(t, name, "-4", "route", "show", "table", "133"); strings.TrimSpace(out) != "" {
		t.Errorf("a failed Apply left its route:\n%s", out)
	}
}

// TestHandleLoopbackAddrs: a Handle opened inside the namespace puts lo's
// addresses on without DAD (ApplyVia), again without error (an address
// already there is no failure), and RemoveVia takes ::6 off.
func TestHandleLoopbackAddrs(t *testing.T) {
	name, ns := freshNetns(t)
	n, err := hostns.Open("/run/netns/" + name)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	var h *Handle
	if err := n.Do(func() (err error) { h, err = OpenHere(); return err }); err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	p := redirect.Plan{LoopbackAddrs: []netip.Prefix{netip.MustParsePrefix("192.0.2.6/32"), redirect.InboundPassthroughV6}}
	for range 2 {
		if err := ApplyVia(hostns.Guard{}, h, int(ns), p, false); err != nil {
			t.Fatal(err)
		}
	}
	show := ipns(t, name, "addr", "show", "dev", "lo")
	for _, a := range p.LoopbackAddrs {
		if !strings.Contains(show, a.String()) {
			t.Errorf("%s not on lo after ApplyVia:\n%s", a, show)
		}
	}
	if !strings.Contains(show, "nodad") {
		t.Errorf("::6 added with DAD:\n%s", show)
	}
	if _, addrs, err := List(ns); err != nil || !slices.Equal(addrs, p.LoopbackAddrs) {
		t.Fatalf("List after ApplyVia = %v, %v; want %v", addrs, err, p.LoopbackAddrs)
	}
	for range 2 {
		if err := RemoveVia(hostns.Guard{}, h, int(ns)); err != nil {
			t.Fatal(err)
		}
	}
	if _, addrs, err := List(ns); err != nil || !slices.Equal(addrs, p.LoopbackAddrs[:1]) {
		t.Fatalf("List after RemoveVia = %v, %v; want only %v", addrs, err, p.LoopbackAddrs[:1])
	}
}
