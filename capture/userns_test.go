package capture

import (
	"context"
	"errors"
	"io"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/nftmesh/nftmesh/iptables"
	"github.com/nftmesh/nftmesh/netlab"
	"github.com/nftmesh/nftmesh/nft"
	"github.com/nftmesh/nftmesh/redirect"
	"github.com/nftmesh/nftmesh/testkit/nettest"
	"github.com/nftmesh/nftmesh/testkit/scenarios"
	"github.com/nftmesh/nftmesh/testkit/usernstest"
	"github.com/nftmesh/nftmesh/testkit/xttest"
)

// usernsBase is the host ID in-namespace 0 maps to in these tests' user
// namespaces (any unused range does).
const usernsBase = 3_000_000

// usernsNetns makes a network namespace owned by a fresh user namespace, as
// the runtime makes for a pod with hostUsers: false.
func usernsNetns(t *testing.T) *usernstest.Netns {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates user and network namespaces")
	}
	n, err := usernstest.New("capu-", usernsBase)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := n.Close(); err != nil {
			t.Error(err)
		}
	})
	return n
}

// UserNamespaced reports whether the network namespace n is owned by a user
// namespace other than this process's (see ErrUserNamespaced).
func UserNamespaced(n *Netns) (bool, error) { return ownerIsForeign(n.Fd(), n.Path) }

// TestUserNamespaced: NS_GET_USERNS tells a netns owned by another user
// namespace from one owned by ours, whatever names it.
func TestUserNamespaced(t *testing.T) {
	plain := freshNetns(t)
	uns := usernsNetns(t)
	for _, c := range []struct {
		path string
		want bool
	}{
		{plain, false},
		{"/proc/self/ns/net", false},
		{uns.Path, true},
		{"/proc/" + strconv.Itoa(uns.PID()) + "/ns/net", true},
	} {
		n, err := Linux().OpenForReading(c.path)
		if err != nil {
			t.Fatal(err)
		}
		got, err := UserNamespaced(n)
		n.Close()
		if err != nil || got != c.want {
			t.Errorf("UserNamespaced(%s) = %t, %v; want %t", c.path, got, err, c.want)
		}
	}
}

// TestUsernsSelect: in a user-namespaced netns auto picks nftables and says
// why, even where legacy nat rules would otherwise make it pick
// iptables-legacy; an explicit iptables-legacy is refused with
// ErrUserNamespaced before anything is written.
func TestUsernsSelect(t *testing.T) {
	if iptables.LegacyAvailable() != nil && os.Geteuid() == 0 {
		t.Skip("kernel without legacy x_tables: selection between worlds cannot be tested")
	}
	ctx := context.Background()
	t.Run("auto picks nftables", func(t *testing.T) {
		ns := usernsNetns(t)
		b, why, err := sel(ctx, Auto, ns.Path)
		if err != nil || b.Name() != NFTables || why != UsernsReason {
			t.Fatalf("got %v %q %v, want nftables %q", b, why, err, UsernsReason)
		}
	})
	t.Run("auto picks nftables over legacy nat rules", func(t *testing.T) {
		ns := usernsNetns(t)
		// In a netns of ours these rules make auto pick iptables-legacy
		// (TestSelect); here that backend could not write its plan.
		inNetns(t, ns.Path, "", "iptables-legacy", "-t", "nat", "-A", "POSTROUTING", "-o", "lo", "-j", "RETURN")
		b, why, err := sel(ctx, Auto, ns.Path)
		if err != nil || b.Name() != NFTables || why != UsernsReason {
			t.Fatalf("got %v %q %v, want nftables %q", b, why, err, UsernsReason)
		}
	})
	t.Run("explicit nftables accepted", func(t *testing.T) {
		ns := usernsNetns(t)
		b, why, err := sel(ctx, NFTables, ns.Path)
		if err != nil || b.Name() != NFTables || why != "requested" {
			t.Fatalf("got %v %q %v, want nftables requested", b, why, err)
		}
	})
	t.Run("explicit iptables-legacy refused", func(t *testing.T) {
		ns := usernsNetns(t)
		n := open(t, ns.Path)
		_, err := Linux().Apply(ctx, n, defaultPlan(t), Options{Backend: Legacy, RunDir: t.TempDir()})
		if !errors.Is(err, ErrUserNamespaced) {
			t.Fatalf("Apply with iptables-legacy: err = %v, want ErrUserNamespaced", err)
		}
		for _, w := range []string{ns.Path, "iptables-legacy", "user namespace", "hostUsers: false", "owner match"} {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("error %q does not mention %q", err, w)
			}
		}
		if _, err := Linux().Check(ctx, n, defaultPlan(t), Options{Backend: Legacy, RunDir: t.TempDir()}); !errors.Is(err, ErrUserNamespaced) {
			t.Errorf("Check with iptables-legacy: err = %v, want ErrUserNamespaced", err)
		}
		if pr, err := xttest.Probe(ns.Path); err != nil || pr.Ours || pr.NatOrMangleRules {
			t.Errorf("legacy tables after the refusal: %+v %v, want untouched", pr, err)
		}
		if p, err := nft.New().List(ctx, ns.Path); err != nil || !p.Empty() {
			t.Errorf("nftables after the refusal: %v %v, want empty", p, err)
		}
	})
}

// TestUsernsLegacyEINVAL shows why the refusal is needed: the same plan the
// legacy backend writes into a netns of ours is refused by the kernel with a
// bare EINVAL in a user-namespaced one (the owner match), while nftables
// programs it.
func TestUsernsLegacyEINVAL(t *testing.T) {
	if os.Geteuid() == 0 && iptables.LegacyAvailable() != nil {
		t.Skip("kernel without legacy x_tables")
	}
	ctx := context.Background()
	plain := freshNetns(t)
	if err := iptables.New().Apply(ctx, plain, defaultPlan(t)); err != nil {
		t.Fatalf("legacy Apply into a netns of ours: %v", err)
	}
	ns := usernsNetns(t)
	err := iptables.New().Apply(ctx, ns.Path, defaultPlan(t))
	if !errors.Is(err, unix.EINVAL) {
		t.Fatalf("legacy Apply into a user-namespaced netns: err = %v, want EINVAL", err)
	}
	t.Logf("without the refusal: %v", err)
	if pr, err := xttest.Probe(ns.Path); err != nil || pr.Ours {
		t.Errorf("legacy tables after the failed Apply: %+v %v, want nothing of ours", pr, err)
	}
	if err := nft.New().Apply(ctx, ns.Path, defaultPlan(t)); err != nil {
		t.Fatalf("nftables Apply into the user-namespaced netns: %v", err)
	}
}

// TestUsernsTraffic: the real pipeline (Open, Apply with backend auto) run
// from the host programs a pod netns owned by its own user namespace (IDs
// 0..65535 inside mapped to usernsBase.. on the host) with nftables, and
// real connections land where Istio's rules send them for every probe of
// the scenario: the app's outbound (in-pod uid 1000) on 15001 with its
// original destination (SO_ORIGINAL_DST), the proxy's (in-pod uid 1337)
// straight out, inbound on 15006; with REDIRECT and TPROXY, and with the DNS
// capture whose conntrack-zone rules match the proxy's in-pod UID.
func TestUsernsTraffic(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates user and network namespaces, real traffic")
	}
	for _, name := range []string{"defaults", "tproxy", "dns-capture", "custom-uid-gid"} {
		t.Run(name, func(t *testing.T) {
			sc, ok := scenarios.ByName(name)
			if !ok {
				t.Fatalf("no scenario %s", name)
			}
			spec, err := sc.Spec()
			if err != nil {
				t.Fatal(err)
			}
			plan, err := redirect.Build(spec)
			if err != nil {
				t.Fatal(err)
			}
			opts := nettest.TopologyOptionsFor(spec)
			opts.Stack = sc.Stack
			opts.Prefix = "capu-"
			opts.NewPodNetns = func(path string) (io.Closer, error) { return usernstest.NewAt(path, usernsBase) }
			opts.PodUIDBase, opts.PodGIDBase = usernsBase, usernsBase
			topo, _ := nettest.NewLab(t, opts, netlab.ListenerOptions{ProxyUID: spec.ProxyUIDs[0], ProxyGID: spec.ProxyGIDs[0]})

			n := open(t, topo.PodNetnsPath())
			if uns, err := UserNamespaced(n); err != nil || !uns {
				t.Fatalf("pod netns user-namespaced: %t %v, want true", uns, err)
			}
			res, err := Linux().Apply(context.Background(), n, plan, Options{Backend: Auto, RunDir: t.TempDir()})
			if err != nil {
				t.Fatalf("Apply (auto): %v", err)
			}
			if res.Backend != NFTables || res.Why != UsernsReason {
				t.Fatalf("Apply chose %s (%s), want nftables (%s)", res.Backend, res.Why, UsernsReason)
			}
			if err := nettest.CheckPassthroughV6(topo, spec.IPv6); err != nil {
				t.Error(err)
			}
			var appOut, proxyOut, inbound int
			cases := nettest.ExpectedProbesFor(&spec, topo)
			bad := 0
			for _, o := range nettest.RunProbes(topo, cases) {
				if !o.OK() {
					bad++
					t.Errorf("MISMATCH %s", o)
					continue
				}
				p := o.Case.Probe
				switch {
				case p.From == netlab.FromApp && p.UID == netlab.AppUID && o.Got.Landed == netlab.ListenerOutbound:
					appOut++
				case p.From == netlab.FromApp && p.UID == spec.ProxyUIDs[0] && strings.HasPrefix(o.Got.Landed, "peer:"):
					proxyOut++
				case p.From == netlab.FromPeer && o.Got.Landed == netlab.ListenerInbound:
					inbound++
				}
			}
			t.Logf("scenario %s in a user-namespaced pod: %d/%d probes as expected (app outbound captured %d, proxy outbound direct %d, inbound captured %d)",
				name, len(cases)-bad, len(cases), appOut, proxyOut, inbound)
			if appOut == 0 || proxyOut == 0 || inbound == 0 {
				t.Errorf("the probes did not cover app outbound captured (%d), proxy outbound direct (%d) and inbound captured (%d)", appOut, proxyOut, inbound)
			}
		})
	}
}

// TestUsernsJoinRefusedMultithreaded shows why no pure-Go writer can put an
// iptables owner match into a user-namespaced netns: the match needs a
// writer inside the netns's user namespace, and the kernel refuses setns
// into a user namespace for a multi-threaded process (EINVAL), which every
// Go program is.
func TestUsernsJoinRefusedMultithreaded(t *testing.T) {
	n := usernsNetns(t)
	fd, err := unix.Open("/proc/"+strconv.Itoa(n.PID())+"/ns/user", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	errc := make(chan error, 1)
	go func() {
		// Never unlocked: should setns succeed, the thread must die with
		// the goroutine instead of serving others from that namespace.
		runtime.LockOSThread()
		errc <- unix.Setns(fd, unix.CLONE_NEWUSER)
	}()
	if err := <-errc; err != unix.EINVAL {
		t.Fatalf("setns into the pod's user namespace from a Go program: %v, want EINVAL", err)
	}
}
