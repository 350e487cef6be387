package capture

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/nftmesh/nftmesh/iptables"
	"github.com/nftmesh/nftmesh/redirect"
	"github.com/nftmesh/nftmesh/testkit/scenarios"
)

// unreadable is what someone else (a workload with NET_ADMIN in its own
// namespace, an admin debugging) may add to nftmesh's own objects that
// the backends' readers do not decode: a test-only `nft -f` or
// iptables-legacy input, and the reason CHECK must name.
var unreadable = []struct {
	name, backend, input, why string
}{
	{"counter object", NFTables, "add counter inet nftmesh dbg\n", "object counter dbg"},
	{"counter statement", NFTables, "insert rule inet nftmesh nat-output counter\n", `expression "counter"`},
	{"timeout set", NFTables, "add set inet nftmesh seen { type ipv4_addr; flags timeout; }\n", "set seen"},
	{"verdict map", NFTables, "add map inet nftmesh vm { type ipv4_addr : verdict; elements = { 192.0.2.1 : accept } }\n", "set vm"},
	{"concatenated set", NFTables, "add set inet nftmesh cs { type ipv4_addr . inet_service; elements = { 192.0.2.1 . 80 } }\n", "set cs"},
	// Tagged as ours, in our chain: a target and a match the legacy
	// reader does not decode.
	{"legacy LOG target", Legacy, "-t nat -A ISTIO_OUTPUT -m comment --comment nftmesh -j LOG", "ISTIO_OUTPUT rule 12: entry uses a match or target nftmesh does not install: target LOG"},
	{"legacy limit match", Legacy, "-t nat -I ISTIO_OUTPUT -m limit --limit 5/s -m comment --comment nftmesh -j RETURN", "match limit"},
}

// addUnreadable applies the defaults plan with tc's backend into a fresh
// namespace, adds tc's input with the independent tool, and checks that
// the backend's reader indeed cannot decode it.
func addUnreadable(t *testing.T, backend, input string) (string, *Netns, Options) {
	t.Helper()
	path := freshNetns(t)
	if backend == Legacy {
		if err := iptables.LegacyAvailable(); err != nil {
			t.Skipf("no legacy x_tables: %v", err)
		}
	}
	n := open(t, path)
	o := Options{Backend: backend, RunDir: t.TempDir()}
	if _, err := Linux().Apply(context.Background(), n, scenarios.MustPlan(t, "defaults"), o); err != nil {
		t.Fatal(err)
	}
	if backend == NFTables {
		ipnetns(t, path, input, "nft", "-f", "-")
	} else {
		ipnetns(t, path, "", append([]string{"iptables-legacy", "-w"}, strings.Fields(input)...)...)
	}
	if _, _, err := Linux().List(context.Background(), n, o); !redirect.IsUnreadable(err) {
		t.Fatalf("List after adding %q = %v, want an unreadable table", input, err)
	}
	return path, n, o
}

// TestRemoveUnreadable: DEL and `redirect clean` (both Pipeline.Remove,
// backend auto) succeed when nftmesh's table, or a legacy chain of ours,
// holds what the reader does not decode: the objects are removed by name,
// nothing of ours is left (read with nft and iptables-legacy-save), and the
// Removal says what could not be read. Before, Remove failed on the listing
// error, for good.
func TestRemoveUnreadable(t *testing.T) {
	for _, tc := range unreadable {
		t.Run(tc.name, func(t *testing.T) {
			path, n, o := addUnreadable(t, tc.backend, tc.input)
			o.Backend = Auto
			r, err := Linux().Remove(context.Background(), n, o)
			if err != nil {
				t.Fatalf("Remove: %v", err)
			}
			if len(r) == 0 || r[0].Backend != tc.backend || !strings.Contains(r[0].Unread, tc.why) || !strings.Contains(r.String(), tc.why) {
				t.Errorf("Removal = %+v (%s), want %s removed unread naming %q", r, r, tc.backend, tc.why)
			}
			if out := ipnetns(t, path, "", "nft", "list", "ruleset"); strings.Contains(out, "nftmesh") {
				t.Errorf("nft list ruleset after Remove:\n%s", out)
			}
			if tc.backend == Legacy {
				if out := ipnetns(t, path, "", "iptables-legacy-save"); strings.Contains(out, "nftmesh") || strings.Contains(out, "ISTIO_") {
					t.Errorf("iptables-legacy-save after Remove:\n%s", out)
				}
			}
			if r, err := Linux().Remove(context.Background(), n, o); err != nil || len(r) != 0 {
				t.Errorf("second Remove = %v, %v; want nothing to remove", r, err)
			}
		})
	}
}

// TestCheckUnreadable: CHECK of such a namespace is drift whose one line
// names what could not be read (it was an error that was not drift), and
// ADD replaces it: after a re-Apply, CHECK passes.
func TestCheckUnreadable(t *testing.T) {
	p := scenarios.MustPlan(t, "defaults")
	for _, tc := range unreadable {
		t.Run(tc.name, func(t *testing.T) {
			_, n, o := addUnreadable(t, tc.backend, tc.input)
			_, err := Linux().Check(context.Background(), n, p, o)
			var d *redirect.DriftError
			if !errors.As(err, &d) || len(d.Lines) != 1 || !strings.Contains(d.Lines[0], "nftmesh does not write") || !strings.Contains(d.Lines[0], tc.why) {
				t.Fatalf("Check = %v, want drift naming %q", err, tc.why)
			}
			// The line names the namespace as the caller did, not as
			// the pipeline pinned it (/proc/self/fd/N).
			if tc.backend == NFTables && !strings.Contains(d.Lines[0], n.Path) || strings.Contains(d.Lines[0], "/proc/self/fd/") {
				t.Errorf("drift line %q does not name netns %s", d.Lines[0], n.Path)
			}
			if _, err := Linux().Apply(context.Background(), n, p, o); err != nil {
				t.Fatalf("re-Apply: %v", err)
			}
			if _, err := Linux().Check(context.Background(), n, p, o); err != nil {
				t.Fatalf("Check after the re-Apply: %v", err)
			}
		})
	}
}
