package capture

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/nftmesh/nftmesh/iptables"
	"github.com/nftmesh/nftmesh/testkit/scenarios"
)

// TestForeign plants the capture state Istio leaves in a pod netns (its
// iptables chains in legacy x_tables and through iptables-nft, and the
// inet istio-proxy-* tables of its native nftables mode) next to our own
// legacy rules, whose chains share the ISTIO_ names: Foreign reports each
// planted object and none of ours; an untouched netns has nothing.
func TestForeign(t *testing.T) {
	if iptables.LegacyAvailable() != nil && os.Geteuid() == 0 {
		t.Skip("kernel without legacy x_tables")
	}
	ctx := context.Background()
	clean := freshNetns(t)
	if got, err := Linux().Foreign(ctx, open(t, clean)); err != nil || len(got) != 0 {
		t.Fatalf("fresh netns: %q, %v", got, err)
	}

	path := freshNetns(t)
	if err := iptables.New().Apply(ctx, path, scenarios.MustPlan(t, "defaults")); err != nil {
		t.Fatal(err)
	}
	if got, err := Linux().Foreign(ctx, open(t, path)); err != nil || len(got) != 0 {
		t.Fatalf("only our legacy rules: %q, %v", got, err)
	}
	ipnetns(t, path, "", "ip6tables-legacy", "-t", "mangle", "-N", "ISTIO_DIVERT")
	ipnetns(t, path, "", "ip6tables-legacy", "-t", "mangle", "-A", "ISTIO_DIVERT", "-j", "MARK", "--set-mark", "1337")
	ipnetns(t, path, "", "iptables-nft", "-t", "nat", "-N", "ISTIO_OUTPUT")
	ipnetns(t, path, "", "iptables-nft", "-t", "nat", "-A", "OUTPUT", "-p", "tcp", "-j", "ISTIO_OUTPUT")
	ipnetns(t, path, "table inet istio-proxy-nat {\n chain prerouting {\n  type nat hook prerouting priority dstnat; policy accept;\n }\n}\n", "nft", "-f", "-")
	got, err := Linux().Foreign(ctx, open(t, path))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"iptables-legacy ipv6 mangle ISTIO_DIVERT", "iptables-nft ipv4 nat ISTIO_OUTPUT", "nftables table inet istio-proxy-nat"}
	slices.Sort(got)
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("Foreign = %q, want %q", got, want)
	}
	if e := (&ForeignError{Netns: path, Found: got}).Error(); !strings.Contains(e, "istio-proxy-nat") || !strings.Contains(e, path) {
		t.Errorf("ForeignError: %s", e)
	}
}
