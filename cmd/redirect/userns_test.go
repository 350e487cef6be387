package main

import (
	"context"
	"strings"
	"testing"

	"github.com/nftmesh/nftmesh/iptables"
	"github.com/nftmesh/nftmesh/nft"
	"github.com/nftmesh/nftmesh/redirect"
	"github.com/nftmesh/nftmesh/testkit/usernstest"

	"github.com/nftmesh/nftmesh/testkit/nstest"
)

// TestCLIUsernsNetns: for a netns owned by another user namespace (a pod
// with hostUsers: false), `apply --backend iptables-legacy` exits 2 with an
// error naming the reason and writes nothing; `apply` (auto) programs it
// with nftables and says why.
func TestCLIUsernsNetns(t *testing.T) {
	nstest.NeedRoot(t)
	if err := iptables.LegacyAvailable(); err != nil {
		t.Skip(err)
	}
	ns, err := usernstest.New("rcliu-", 3_100_000)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ns.Close() })
	ctx := context.Background()

	code, _, errOut := runCLI(t, "apply", "--netns", ns.Path, "--backend", "iptables-legacy", "--defaults", "--run-dir", t.TempDir())
	if code != exitUsage {
		t.Fatalf("apply --backend iptables-legacy: exit %d, want %d (%s)", code, exitUsage, errOut)
	}
	for _, w := range []string{ns.Path, "iptables-legacy", "user namespace", "hostUsers: false", "owner match"} {
		if !strings.Contains(errOut, w) {
			t.Errorf("stderr %q does not mention %q", errOut, w)
		}
	}
	if live, err := nft.New().List(ctx, ns.Path); err != nil || !live.Empty() {
		t.Fatalf("after the refusal: %v %v, want no rules", live, err)
	}

	code, _, errOut = runCLI(t, "apply", "--netns", ns.Path, "--defaults", "--run-dir", t.TempDir())
	if code != exitOK || !strings.Contains(errOut, "with nftables") || !strings.Contains(errOut, "user namespace") {
		t.Fatalf("apply (auto): exit %d, stderr %q; want 0, nftables and the reason", code, errOut)
	}
	want, err := redirect.Build(redirect.DefaultSpec())
	if err != nil {
		t.Fatal(err)
	}
	if err := nft.New().Check(ctx, ns.Path, want); err != nil {
		t.Fatal(err)
	}
}
