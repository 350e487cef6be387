package capture

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/nftmesh/nftmesh/iptables"
	"github.com/nftmesh/nftmesh/nft"
	"github.com/nftmesh/nftmesh/redirect"
	"github.com/nftmesh/nftmesh/testkit/scenarios"
)

// tampering is what someone with NET_ADMIN in a pod's namespace (the
// workload, an admin debugging) can do to nftmesh's capture that changes
// what happens to the pod's packets, done with the independent tools
// (nft, iptables-legacy), and the drift lines CHECK must show for it.
var tampering = []struct {
	name, backend, scenario string
	tamper                  func(t *testing.T, path string, p redirect.Plan)
	want                    []string // each in a line of the drift
}{
	{"table dormant", NFTables, "defaults", nftInput("add table inet nftmesh { flags dormant; }\n"),
		[]string{"+ table flags dormant"}},
	{"chain policy drop", NFTables, "defaults", nftInput("add chain inet nftmesh nat-output { policy drop; }\n"),
		[]string{"+ chain nat-output { type nat hook output priority -100 policy drop }"}},
	// A base chain's hook, priority and type change only with the chain
	// deleted and made again: the table is replaced by an edited copy.
	{"chain priority", NFTables, "defaults", nftEdited("type nat hook output priority -100;", "type nat hook output priority 100;"),
		[]string{"+ chain nat-output { type nat hook output priority 100 }", "- chain nat-output { type nat hook output priority -100 }"}},
	{"chain hook", NFTables, "drop-invalid", nftEdited("type filter hook prerouting priority mangle;", "type filter hook forward priority mangle;"),
		[]string{"+ chain mangle-prerouting { type filter hook forward priority -150 }", "- chain mangle-prerouting { type filter hook prerouting priority -150 }"}},
	{"chain type", NFTables, "tproxy", nftEdited("type route hook output priority mangle;", "type filter hook output priority mangle;"),
		[]string{"+ chain mangle-output { type filter hook output priority -150 }", "- chain mangle-output { type route hook output priority -150 }"}},
	{"rule added", NFTables, "defaults", nftInput("insert rule inet nftmesh nat-prerouting meta l4proto tcp accept\n"),
		[]string{"+ rule nat-prerouting: l4proto tcp -> accept"}},
	{"rule removed", NFTables, "defaults", nftInput("flush chain inet nftmesh nat-prerouting\n"),
		[]string{"- rule nat-prerouting: l4proto tcp -> jump nat-istio-inbound"}},
	{"rule changed", NFTables, "defaults", nftEdited("meta l4proto tcp redirect to :15001", "meta l4proto tcp redirect to :15002"),
		[]string{"+ rule nat-istio-redirect: l4proto tcp -> redirect to :15002", "- rule nat-istio-redirect: l4proto tcp -> redirect to :15001"}},
	{"set element added", NFTables, "defaults", nftInput("add element inet nftmesh inbound-exclude-ports { 8080 }\n"),
		[]string{"+ set inbound-exclude-ports inet_service { 8080, 15020-15021, 15090 }", "- set inbound-exclude-ports inet_service { 15020-15021, 15090 }"}},
	{"set element removed", NFTables, "defaults", nftInput("delete element inet nftmesh inbound-exclude-ports { 15090 }\n"),
		[]string{"+ set inbound-exclude-ports inet_service { 15020-15021 }", "- set inbound-exclude-ports inet_service { 15020-15021, 15090 }"}},
	// The same elements, but gone in an hour.
	{"set elements expire", NFTables, "defaults", nftEdited("flags interval\n\t\telements = { 15020-15021, 15090 }", "flags interval,timeout\n\t\telements = { 15020-15021 timeout 1h, 15090 timeout 1h }"),
		[]string{"set inbound-exclude-ports: elements may expire (flag timeout)"}},

	// A legacy table is shared: builtin chains' policies and other
	// software's rules before ours decide whether packets reach ours.
	{"legacy builtin chain policy drop", Legacy, "tproxy", legacyCmd("", "iptables-legacy", "-w", "-t", "mangle", "-P", "PREROUTING", "DROP"),
		[]string{"+ chain mangle-prerouting { type filter hook prerouting priority -150 policy drop }", "- chain mangle-prerouting { type filter hook prerouting priority -150 }"}},
	// iptables refuses -P DROP in nat; iptables-restore does not.
	{"legacy nat policy drop", Legacy, "defaults", legacyCmd("*nat\n:OUTPUT DROP [0:0]\nCOMMIT\n", "ip6tables-legacy-restore", "-w", "--noflush"),
		[]string{"+ chain nat-output { type nat hook output priority -100 policy drop }", "- chain nat-output { type nat hook output priority -100 }"}},
	{"legacy accept before ours", Legacy, "defaults", legacyCmd("", "iptables-legacy", "-w", "-t", "nat", "-I", "PREROUTING", "-p", "tcp", "--dport", "8080", "-j", "ACCEPT"),
		[]string{"+ ipv4 nat PREROUTING rule 1, before nftmesh's, is not nftmesh's and can end the chain: -j ACCEPT"}},
	{"legacy jump before ours to a chain that accepts", Legacy, "defaults", legacyCmd("*nat\n:BYPASS - [0:0]\n-A BYPASS -p tcp --dport 8080 -j ACCEPT\n-I OUTPUT 1 -j BYPASS\nCOMMIT\n", "ip6tables-legacy-restore", "-w", "--noflush"),
		[]string{"+ ipv6 nat OUTPUT rule 1, before nftmesh's, is not nftmesh's and can end the chain: -j BYPASS"}},
	{"legacy DNAT before ours", Legacy, "defaults", legacyCmd("", "iptables-legacy", "-w", "-t", "nat", "-I", "OUTPUT", "-p", "tcp", "-j", "DNAT", "--to-destination", "192.0.2.1"),
		[]string{"+ ipv4 nat OUTPUT rule 1, before nftmesh's, is not nftmesh's and can end the chain: -j DNAT"}},
}

func nftInput(input string) func(*testing.T, string, redirect.Plan) {
	return func(t *testing.T, path string, _ redirect.Plan) { ipnetns(t, path, input, "nft", "-f", "-") }
}

// nftEdited replaces our table, in one transaction, by the plan's as
// Render prints it with old replaced by new.
func nftEdited(old, new string) func(*testing.T, string, redirect.Plan) {
	return func(t *testing.T, path string, p redirect.Plan) {
		text, err := nft.Render(p)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(text, old) {
			t.Fatalf("the rendered table has no %q:\n%s", old, text)
		}
		ipnetns(t, path, "delete table inet nftmesh\n"+strings.Replace(text, old, new, 1), "nft", "-f", "-")
	}
}

func legacyCmd(stdin string, args ...string) func(*testing.T, string, redirect.Plan) {
	return func(t *testing.T, path string, _ redirect.Plan) { ipnetns(t, path, stdin, args...) }
}

// TestCheckSeesTampering: CHECK passes right after ADD, fails once the
// namespace is tampered with, naming each difference, and passes again
// after a re-ADD. Before CHECK read table flags, a dormant table (every
// rule off) passed; a policy of drop was "policy 0, ours are accept" and a
// chain moved to another hook "unsupported hook 2"; the legacy backend saw
// neither a builtin chain's policy nor a rule put before ours.
func TestCheckSeesTampering(t *testing.T) {
	ctx := context.Background()
	for _, tc := range tampering {
		t.Run(tc.name, func(t *testing.T) {
			path := freshNetns(t)
			if tc.backend == Legacy {
				if err := iptables.LegacyAvailable(); err != nil {
					t.Skipf("no legacy x_tables: %v", err)
				}
			}
			n := open(t, path)
			o := Options{Backend: tc.backend, RunDir: t.TempDir()}
			p := scenarios.MustPlan(t, tc.scenario)
			if _, err := Linux().Apply(ctx, n, p, o); err != nil {
				t.Fatal(err)
			}
			if _, err := Linux().Check(ctx, n, p, o); err != nil {
				t.Fatalf("Check untampered: %v", err)
			}
			tc.tamper(t, path, p)
			_, err := Linux().Check(ctx, n, p, o)
			var d *redirect.DriftError
			if !errors.As(err, &d) {
				t.Fatalf("Check after tampering = %v, want drift", err)
			}
			for _, w := range tc.want {
				if !slices.ContainsFunc(d.Lines, func(l string) bool { return strings.Contains(l, w) }) {
					t.Errorf("drift lacks %q; it is:\n%s", w, strings.Join(d.Lines, "\n"))
				}
			}
			if tc.backend == Legacy {
				return // ADD does not undo another writer's rules or policies
			}
			if _, err := Linux().Apply(ctx, n, p, o); err != nil {
				t.Fatalf("re-Apply: %v", err)
			}
			if _, err := Linux().Check(ctx, n, p, o); err != nil {
				t.Fatalf("Check after the re-Apply: %v", err)
			}
		})
	}
}

// TestCheckPassesBesideForeignLegacyRules: other software's rules in the
// builtin chains we share that cannot keep a packet from ours (a MARK
// before ours, an ACCEPT after ours, a jump before ours into a chain that
// only marks) are no drift.
func TestCheckPassesBesideForeignLegacyRules(t *testing.T) {
	if err := iptables.LegacyAvailable(); err != nil {
		t.Skipf("no legacy x_tables: %v", err)
	}
	ctx := context.Background()
	path := freshNetns(t)
	n := open(t, path)
	o := Options{Backend: Legacy, RunDir: t.TempDir()}
	p := scenarios.MustPlan(t, "defaults")
	if _, err := Linux().Apply(ctx, n, p, o); err != nil {
		t.Fatal(err)
	}
	ipnetns(t, path, "*nat\n:MARKS - [0:0]\n-A MARKS -j MARK --set-mark 7\n-A MARKS -j RETURN\n"+
		"-I OUTPUT 1 -j MARKS\n-I PREROUTING 1 -j MARK --set-mark 5\n-A PREROUTING -j ACCEPT\nCOMMIT\n",
		"iptables-legacy-restore", "-w", "--noflush")
	if _, err := Linux().Check(ctx, n, p, o); err != nil {
		t.Fatalf("Check beside foreign rules that let packets reach ours: %v", err)
	}
}
