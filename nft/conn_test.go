package nft

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/nftmesh/nftmesh/testkit/scenarios"
)

// TestPreparePanicFailsClosed: a panic in the work Prepare runs on its own
// goroutine (outside any handler's recover) fails that plan's Apply, which
// sends nothing, and the process goes on serving: the next Apply works.
func TestPreparePanicFailsClosed(t *testing.T) {
	p := scenarios.MustPlan(t, "defaults")
	prepareHook = func() { panic("injected") }
	pr := prepare(p, TableName, true) // on a goroutine, as with GOMAXPROCS > 1
	<-pr.done
	prepareHook = nil
	if os.Geteuid() != 0 {
		err := New().With(pr).Apply(context.Background(), "/nonexistent/netns", p)
		if err == nil || !strings.Contains(err.Error(), "panicked: injected") {
			t.Fatalf("Apply after a panicking prepare: %v; want the panic as its error", err)
		}
		return
	}
	ns, cleanup := newNetns(t)
	defer cleanup()
	err := New().With(pr).Apply(context.Background(), ns, p)
	if err == nil || !strings.Contains(err.Error(), "panicked: injected") {
		t.Fatalf("Apply after a panicking prepare: %v; want the panic as its error", err)
	}
	if got, err := New().List(context.Background(), ns); err != nil || len(got.Tables) != 0 {
		t.Fatalf("after the failed Apply: %d tables listed (%v); want none", len(got.Tables), err)
	}
	b := New()
	if err := b.With(b.Prepare(p)).Apply(context.Background(), ns, p); err != nil {
		t.Fatalf("the next Apply: %v", err)
	}
}
