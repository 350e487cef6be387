package capture

import (
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/nftmesh/nftmesh/internal/usernstest"
	"github.com/nftmesh/nftmesh/nft"
	"github.com/nftmesh/nftmesh/redirect/legacy"
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
		n, err := OpenForReading(c.path)
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
	if legacy.LegacyAvailable() != nil && os.Geteuid() == 0 {
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
	t.Run("explicit iptables-legacy refused", func(t *testing.T) {
		ns := usernsNetns(t)
		n := open(t, ns.Path)
		_, err := Apply(ctx, n, defaultPlan(t), Options{Backend: Legacy, RunDir: t.TempDir()})
		if !errors.Is(err, ErrUserNamespaced) {
			t.Fatalf("Apply with iptables-legacy: err = %v, want ErrUserNamespaced", err)
		}
		for _, w := range []string{ns.Path, "iptables-legacy", "user namespace", "hostUsers: false", "owner match"} {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("error %q does not mention %q", err, w)
			}
		}
		if _, err := Check(ctx, n, defaultPlan(t), Options{Backend: Legacy, RunDir: t.TempDir()}); !errors.Is(err, ErrUserNamespaced) {
			t.Errorf("Check with iptables-legacy: err = %v, want ErrUserNamespaced", err)
		}
		if pr, err := legacy.Probe(ns.Path); err != nil || pr.Ours || pr.NatOrMangleRules {
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
	if os.Geteuid() == 0 && legacy.LegacyAvailable() != nil {
		t.Skip("kernel without legacy x_tables")
	}
	ctx := context.Background()
	plain := freshNetns(t)
	if err := legacy.New().Apply(ctx, plain, defaultPlan(t)); err != nil {
		t.Fatalf("legacy Apply into a netns of ours: %v", err)
	}
	ns := usernsNetns(t)
	err := legacy.New().Apply(ctx, ns.Path, defaultPlan(t))
	if !errors.Is(err, unix.EINVAL) {
		t.Fatalf("legacy Apply into a user-namespaced netns: err = %v, want EINVAL", err)
	}
	t.Logf("without the refusal: %v", err)
	if pr, err := legacy.Probe(ns.Path); err != nil || pr.Ours {
		t.Errorf("legacy tables after the failed Apply: %+v %v, want nothing of ours", pr, err)
	}
	if err := nft.New().Apply(ctx, ns.Path, defaultPlan(t)); err != nil {
		t.Fatalf("nftables Apply into the user-namespaced netns: %v", err)
	}
}
