package inplace

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nftmesh/nftmesh/capture"
	"github.com/nftmesh/nftmesh/installer/repair"
	"github.com/nftmesh/nftmesh/iptables"
	"github.com/nftmesh/nftmesh/netlab"
	"github.com/nftmesh/nftmesh/nft"
	"github.com/nftmesh/nftmesh/podinfo"
	"github.com/nftmesh/nftmesh/redirect"
	"github.com/nftmesh/nftmesh/testkit/cgrouptest"
	"github.com/nftmesh/nftmesh/testkit/nettest"
	"github.com/nftmesh/nftmesh/testkit/usernstest"
	"github.com/nftmesh/nftmesh/testkit/xttest"
)

// TestFindNetnsUsernsPod: the /proc walk finds a pod whose netns is owned by
// its own user namespace (hostUsers: false) through a process living inside
// both, as it finds any other pod.
func TestFindNetnsUsernsPod(t *testing.T) {
	needRoot(t)
	ns, err := usernstest.New("e2e-ru-", 3_400_000)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ns.Close() })
	name := filepath.Base(ns.Path)
	v4, v6 := uniqueAddrs()
	sh(t, "ip", "-n", name, "link", "add", "eth0", "type", "veth", "peer", "name", "p0")
	sh(t, "ip", "-n", name, "link", "set", "eth0", "up")
	sh(t, "ip", "-n", name, "addr", "add", v4.String(), "dev", "eth0")
	sh(t, "ip", "-n", name, "addr", "add", v6.String(), "dev", "eth0", "nodad")
	want, err := nsIdentity(ns.Path)
	if err != nil {
		t.Fatal(err)
	}
	for _, ip := range []netip.Addr{v4.Addr(), v6.Addr()} {
		got, err := FindNetns("/proc", "", []netip.Addr{ip})
		if err != nil {
			t.Fatalf("FindNetns(%s): %v", ip, err)
		}
		if got.PID != ns.PID() || got.Path != fmt.Sprintf("/proc/%d/ns/net", ns.PID()) || (nsID{got.Dev, got.Inode}) != want {
			t.Errorf("FindNetns(%s) = pid %d %s %d:%d, want the user-namespaced holder %d in %d:%d", ip, got.PID, got.Path, got.Dev, got.Inode, ns.PID(), want.dev, want.ino)
		}
	}
}

// TestRepairPodUsernsPod: repair in place of a running pod whose netns is
// owned by its own user namespace. With backend auto the rules are
// programmed with nftables (the report says why) and real traffic from the
// pod's in-pod UIDs lands where Istio's rules send it; with iptables-legacy
// the repair fails as impossible (not retried) naming the reason, and
// writes nothing.
func TestRepairPodUsernsPod(t *testing.T) {
	needRoot(t)
	if err := iptables.LegacyAvailable(); err != nil {
		t.Skip(err)
	}
	for i, backend := range []string{"auto", "iptables-legacy"} {
		t.Run(backend, func(t *testing.T) {
			pod := loadPod(t, "injected.yaml", netlab.PodV4, netlab.PodV6)
			inMesh, _, spec, err := podinfo.FromPod(pod)
			if err != nil || !inMesh {
				t.Fatalf("sample pod not in mesh: %v", err)
			}
			base := uint32(3_500_000 + i*usernstest.Size)
			var holder *usernstest.Netns
			o := nettest.TopologyOptionsFor(spec)
			o.Prefix = "e2e-"
			o.NewPodNetns = func(path string) (io.Closer, error) {
				n, err := usernstest.NewAt(path, base)
				holder = n
				return n, err
			}
			o.PodUIDBase, o.PodGIDBase = base, base
			topo, _ := nettest.NewLab(t, o, netlab.ListenerOptions{ProxyUID: spec.ProxyUIDs[0], ProxyGID: spec.ProxyGIDs[0]})
			cgrouptest.MovePod(t, holder.PID(), cgrouptest.CgroupfsLeaf(string(pod.UID)))
			// nettest topologies share addresses: never program another
			// test's namespace.
			if f, err := FindNetns("/proc", "", []netip.Addr{netlab.PodV4, netlab.PodV6}); err != nil || f.PID != holder.PID() {
				t.Skipf("skipping: another process holds nettest's pod addresses (found %+v, %v)", f, err)
			}

			rep, err := newRepairer(t, backend).RepairPod(context.Background(), pod)
			t.Logf("repair report: %+v, err %v", rep, err)
			if backend == "iptables-legacy" {
				if !errors.Is(err, repair.ErrImpossible) || !errors.Is(err, capture.ErrUserNamespaced) || !strings.Contains(err.Error(), "owner match") {
					t.Fatalf("RepairPod with iptables-legacy: err = %v, want ErrRepairImpossible wrapping ErrUserNamespaced", err)
				}
				if p, err := nft.New().List(context.Background(), topo.PodNetnsPath()); err != nil || !p.Empty() {
					t.Errorf("nftables rules after the refused repair (%v)", err)
				}
				if pr, err := xttest.Probe(topo.PodNetnsPath()); err != nil || pr.Ours {
					t.Errorf("legacy rules after the refused repair: %+v %v", pr, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("RepairPod: %v", err)
			}
			if rep.PID != holder.PID() || rep.Backend != "nftables" || rep.Why != capture.UsernsReason {
				t.Errorf("repaired through pid %d with %s (%s), want the holder %d with nftables (%s)", rep.PID, rep.Backend, rep.Why, holder.PID(), capture.UsernsReason)
			}
			want, err := redirect.Build(spec)
			if err != nil {
				t.Fatal(err)
			}
			if err := nft.New().Check(context.Background(), topo.PodNetnsPath(), want); err != nil {
				t.Fatalf("live rules after the repair: %v", err)
			}
			cases := nettest.ExpectedProbesFor(&spec, topo)
			bad := 0
			for _, o := range nettest.RunProbes(topo, cases) {
				if !o.OK() {
					bad++
					t.Errorf("MISMATCH %s", o)
				}
			}
			t.Logf("%d/%d probes landed as expected after the repair", len(cases)-bad, len(cases))
			if len(cases) < 10 {
				t.Fatalf("only %d probes: the harness did not run", len(cases))
			}
		})
	}
}
