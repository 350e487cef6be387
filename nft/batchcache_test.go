package nft

import (
	"bytes"
	"runtime"
	"testing"

	"github.com/mdlayher/netlink"

	"github.com/nftmesh/nftmesh/redirect"
)

// TestBatchCache: a plan prepared again (an Equal one, not the same value)
// gets the creating batch marshalled the first time, byte for byte, with
// headers of its own; a changed plan, another table, or a plan pushed out
// by newer ones is marshalled anew; changing the plan the cache was given
// changes nothing in it.
func TestBatchCache(t *testing.T) {
	c := &batchCache{max: 3}
	plan := func(port uint16) redirect.Plan {
		s := redirect.DefaultSpec()
		s.InboundPortsExclude = []uint16{port}
		p, err := redirect.Build(s)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	batch := func(p redirect.Plan) []netlink.Message {
		prog, err := encode(p, TableName)
		if err != nil {
			t.Fatal(err)
		}
		msgs, err := marshal(prog, false)
		if err != nil {
			t.Fatal(err)
		}
		return msgs
	}
	p1 := plan(1001)
	m1 := batch(p1)
	c.remember(p1, TableName, m1)
	// The caller's plan and messages are its own to change afterwards.
	p1.Tables[0].Chains[0].Rules = nil
	m1[0].Header.Flags = 0xffff

	got, ok := c.lookup(plan(1001), TableName)
	if !ok {
		t.Fatal("an Equal plan missed")
	}
	want := batch(plan(1001))
	if len(got) != len(want) {
		t.Fatalf("%d messages, marshalling gives %d", len(got), len(want))
	}
	for i := range got {
		if got[i].Header.Flags != want[i].Header.Flags || got[i].Header.Type != want[i].Header.Type || !bytes.Equal(got[i].Data, want[i].Data) {
			t.Fatalf("message %d differs from a fresh marshal", i)
		}
	}
	got[0].Header.Sequence = 77
	if again, _ := c.lookup(plan(1001), TableName); again[0].Header.Sequence != 0 {
		t.Fatal("a caller's header change reached the cache")
	}
	if _, ok := c.lookup(plan(1002), TableName); ok {
		t.Fatal("another plan hit")
	}
	if _, ok := c.lookup(plan(1001), "other"); ok {
		t.Fatal("another table hit")
	}
	// Three newer plans push the first out; the most recently used stays.
	for _, port := range []uint16{2001, 2002} {
		c.remember(plan(port), TableName, batch(plan(port)))
	}
	if _, ok := c.lookup(plan(1001), TableName); !ok {
		t.Fatal("evicted before max")
	}
	c.remember(plan(2003), TableName, batch(plan(2003)))
	for port, want := range map[uint16]bool{1001: true, 2001: false, 2002: true, 2003: true} {
		if _, ok := c.lookup(plan(port), TableName); ok != want {
			t.Errorf("plan %d cached %v, want %v (least recently used goes)", port, ok, want)
		}
	}
	if len(c.entries) != c.max {
		t.Fatalf("%d entries, max %d", len(c.entries), c.max)
	}
}

// TestPrepareWithOneP: with GOMAXPROCS 1 (the CLI, the standalone plugin)
// Prepare has done its work when it returns (a goroutine would only run
// once the caller blocks); with more it may still be working.
func TestPrepareWithOneP(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	s := redirect.DefaultSpec()
	p, err := redirect.Build(s)
	if err != nil {
		t.Fatal(err)
	}
	pr := New().Prepare(p)
	select {
	case <-pr.done:
	default:
		t.Fatal("with one P, Prepare returned before the batch was ready")
	}
	if pr.err != nil || len(pr.create) == 0 {
		t.Fatalf("prepared: %v, %d messages", pr.err, len(pr.create))
	}
}
