package iptables

import (
	"context"
	"errors"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/nftmesh/nftmesh/redirect"

	"github.com/nftmesh/nftmesh/testkit/nstest"
)

// TestReplaceRetriesOnEAGAIN changes the table between our read and our
// write (with the iptables binary): the kernel must refuse the stale write
// with EAGAIN, and updateTable must re-read and keep the other writer's rule.
func TestReplaceRetriesOnEAGAIN(t *testing.T) {
	nstest.NeedRoot(t)
	ns, path := nstest.New(t, "leg-")
	nstest.Run(t, ns, "", "iptables-legacy", "-t", "nat", "-A", "OUTPUT", "-j", "RETURN")
	s, err := openSockets(path, []redirect.Family{redirect.FamilyIPv4}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	fd, l := s.fd[redirect.FamilyIPv4], &layout4
	stale, err := readTable(fd, l, "nat")
	if err != nil {
		t.Fatal(err)
	}
	nstest.Run(t, ns, "", "iptables-legacy", "-t", "nat", "-A", "POSTROUTING", "-s", "192.0.2.1/32", "-j", "ACCEPT")
	if err := stale.replace(fd); !errors.Is(err, unix.EAGAIN) {
		t.Fatalf("stale replace: err = %v, want EAGAIN", err)
	}
	enc := &encoder{l: l}
	x := xtable{name: "nat", chains: []xchain{{name: "OUTPUT", builtin: true, rules: []xrule{{
		matches: []xmatch{mComment{text: commentTag}}, target: tJump{chain: "ISTIO_X"}}}}, {name: "ISTIO_X"}}}
	edits := 0
	_, err = updateTable(context.Background(), fd, l, "nat", func(tb *table) error {
		edits++
		if edits == 1 { // a second writer sneaks in after our first read
			nstest.Run(t, ns, "", "iptables-legacy", "-t", "nat", "-A", "POSTROUTING", "-s", "192.0.2.2/32", "-j", "ACCEPT")
		}
		return tb.addOurs(enc, x)
	})
	if err != nil {
		t.Fatalf("updateTable: %v", err)
	}
	if edits != 2 {
		t.Errorf("edit ran %d times, want 2 (one EAGAIN retry)", edits)
	}
	got := saveTables(t, ns, false)
	for _, want := range []string{"-A POSTROUTING -s 192.0.2.1/32 -j ACCEPT", "-A POSTROUTING -s 192.0.2.2/32 -j ACCEPT", "-A OUTPUT -j RETURN", "-A OUTPUT -m comment --comment nftmesh -j ISTIO_X"} {
		if !strings.Contains(got, want) {
			t.Errorf("missing %q in:\n%s", want, got)
		}
	}
}
