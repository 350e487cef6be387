package nft

import (
	"context"
	"errors"
	"slices"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/nftmesh/nftmesh/internal/hostns"
	"github.com/nftmesh/nftmesh/policyroute"
	"github.com/nftmesh/nftmesh/redirect"
	"github.com/nftmesh/nftmesh/testkit/nstest"
	"github.com/nftmesh/nftmesh/testkit/scenarios"
)

// visit opens, from one thread inside the namespace at path, the sockets a
// Backend bound with Via works through.
func visit(t *testing.T, path string) (*hostns.Netns, *Conn, *policyroute.Handle) {
	t.Helper()
	n, err := hostns.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	var c *Conn
	var route *policyroute.Handle
	err = n.Do(func() (err error) {
		if c, err = DialHere(); err != nil {
			return err
		}
		route, err = policyroute.OpenHere()
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); route.Close() })
	return n, c, route
}

func hasTable(ts []TableRef, fam uint8, name string) bool {
	return slices.Contains(ts, TableRef{Family: fam, Name: name})
}

// TestKernelVia: a backend bound to sockets opened inside the namespace
// applies (its table's existence taken from the Conn's table dump), is
// read back by path, re-applies over its table, survives a refused batch
// on its socket, removes, and refuses the host's own namespace.
func TestKernelVia(t *testing.T) {
	nstest.NeedRoot(t)
	ctx := context.Background()
	path := podNetns(t)
	nstest.Run(t, path, "", "nft", "add table ip nat")
	n, c, route := visit(t, path)
	b := New().Via(n.Fd(), c, route)
	ts, err := c.Tables()
	if err != nil {
		t.Fatal(err)
	}
	if !hasTable(ts, unix.NFPROTO_IPV4, "nat") || hasTable(ts, unix.NFPROTO_INET, TableName) {
		t.Fatalf("Tables of a namespace with ip nat only = %v", ts)
	}
	tp, _ := scenarios.ByName("tproxy")
	v4, _ := scenarios.ByName("ipv4-only")
	for _, sc := range []scenarios.Scenario{tp, v4, tp} {
		p, err := sc.Plan()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Tables(); err != nil {
			t.Fatal(err)
		}
		if err := b.Apply(ctx, path, p); err != nil {
			t.Fatalf("Apply %s via: %v", sc.Name, err)
		}
		if err := New().Check(ctx, path, p); err != nil {
			t.Fatalf("Check by path after Apply %s via: %v", sc.Name, err)
		}
	}
	if ts, err = c.Tables(); err != nil || !hasTable(ts, unix.NFPROTO_INET, TableName) {
		t.Fatalf("Tables after Apply = %v, %v", ts, err)
	}
	// A refused batch leaves replies on the socket; what follows must not
	// take them for its own.
	if err := b.Apply(ctx, path, longChainPlan(t)); err == nil {
		t.Fatal("bad re-apply via succeeded")
	}
	good, _ := tp.Plan()
	if err := b.Apply(ctx, path, good); err != nil {
		t.Fatalf("Apply via after a refused batch: %v", err)
	}
	if err := b.Remove(ctx, path); err != nil {
		t.Fatal(err)
	}
	nstest.Run(t, path, "", "nft", "delete table ip nat")
	assertNothingLeft(t, path)

	own, oc, oroute := visit(t, "/proc/self/ns/net")
	if err := New().Via(own.Fd(), oc, oroute).Apply(ctx, "/proc/self/ns/net", good); !errors.Is(err, hostns.ErrOwnNetns) {
		t.Fatalf("Apply via the own namespace = %v, want ErrOwnNetns", err)
	}
	if err := New().Via(own.Fd(), oc, oroute).Remove(ctx, "/proc/self/ns/net"); !errors.Is(err, hostns.ErrOwnNetns) {
		t.Fatalf("Remove via the own namespace = %v, want ErrOwnNetns", err)
	}
}

// TestKernelPrepared: a plan prepared ahead of Apply (encoded, its create
// batch marshalled on another goroutine) is what Apply writes into a fresh
// namespace and, through a replace batch from the same encoding, over our
// table; a backend given another plan than the prepared one writes that
// other plan.
func TestKernelPrepared(t *testing.T) {
	nstest.NeedRoot(t)
	ctx := context.Background()
	path := podNetns(t)
	tp, _ := scenarios.ByName("tproxy")
	v4, _ := scenarios.ByName("ipv4-only")
	ptp, err := tp.Plan()
	if err != nil {
		t.Fatal(err)
	}
	pv4, err := v4.Plan()
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range []redirect.Plan{ptp, pv4, ptp} {
		b := New()
		if err := b.With(b.Prepare(p)).Apply(ctx, path, p); err != nil {
			t.Fatalf("Apply %d of a prepared plan: %v", i, err)
		}
		if err := New().Check(ctx, path, p); err != nil {
			t.Fatalf("Check after Apply %d of a prepared plan: %v", i, err)
		}
	}
	b := New()
	if err := b.With(b.Prepare(ptp)).Apply(ctx, path, pv4); err != nil {
		t.Fatal(err)
	}
	if err := New().Check(ctx, path, pv4); err != nil {
		t.Fatalf("a backend prepared for another plan wrote the prepared one: %v", err)
	}
	bad := longChainPlan(t)
	if err := b.With(b.Prepare(bad)).Apply(ctx, path, bad); err == nil {
		t.Fatal("a prepared plan the kernel refuses was applied")
	}
	if err := New().Check(ctx, path, pv4); err != nil {
		t.Fatalf("a refused prepared batch changed the table: %v", err)
	}
}
