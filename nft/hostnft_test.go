package nft

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/nftmesh/nftmesh/redirect"
	"github.com/nftmesh/nftmesh/testkit/nettest"
	"github.com/nftmesh/nftmesh/testkit/nstest"
	"github.com/nftmesh/nftmesh/testkit/scenarios"
)

// The host's nft tools stay happy: operators list a pod's rules with
// whatever `nft` their node has (Istio's rules once crashed older host nft,
// istio/istio#58492), and add rules of their own beside ours. These tests
// run each nft that `make host-nft` unpacked from Debian's archive
// (testkit/hostnft/fetch.sh: bookworm's 1.0.6 and trixie's 1.1.3, each with
// its own libraries, the machine's nft untouched) against every ruleset we
// write.

// hostNft is one nft version: its launcher and what --version says.
type hostNft struct {
	path, version string
}

// hostNfts lists the unpacked nft versions under $NFTMESH_HOST_NFT_DIR. Without
// them the test skips, except in CI, where the Makefile fetches them first.
func hostNfts(t *testing.T) []hostNft {
	t.Helper()
	nstest.NeedRoot(t)
	dir := os.Getenv("NFTMESH_HOST_NFT_DIR")
	paths, _ := filepath.Glob(filepath.Join(dir, "*", "nft"))
	if dir == "" || len(paths) < 2 {
		msg := "host nft versions not unpacked: run `make host-nft` (NFTMESH_HOST_NFT_DIR=" + dir + ")"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	sort.Strings(paths)
	var out []hostNft
	for _, p := range paths {
		v, err := exec.Command(p, "--version").Output()
		if err != nil {
			t.Fatalf("%s --version: %v", p, err)
		}
		out = append(out, hostNft{path: p, version: strings.TrimSpace(string(v))})
	}
	return out
}

// run runs this nft in netns ns and fails t unless it exits 0 with nothing
// on stderr (a warning or an "unknown expression" there is a failure too).
func (h hostNft) run(t *testing.T, ns, stdin string, args ...string) string {
	t.Helper()
	cmd := exec.Command("nsenter", append([]string{"--net=" + ns, "--", h.path}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil || stderr.Len() > 0 {
		t.Fatalf("%s: nft %s: %v\nstderr: %s", h.version, strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String()
}

// hostRuleset is the part of `nft -j list ruleset` these tests compare: the
// tables, each chain as family/table/chain, and the number of rules and set
// elements seen.
type hostRuleset struct {
	tables   []string
	chains   map[string]int // rules per chain
	elements map[string]int // elements per set, by family/table/set
}

func parseHostJSON(t *testing.T, version, out string) hostRuleset {
	t.Helper()
	var doc struct {
		Nftables []map[string]json.RawMessage `json:"nftables"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("%s: nft -j output is not JSON: %v\n%.2000s", version, err, out)
	}
	rs := hostRuleset{chains: map[string]int{}, elements: map[string]int{}}
	type obj struct {
		Family, Table, Name, Chain string
		Elem                       []json.RawMessage
	}
	for _, o := range doc.Nftables {
		for k, raw := range o {
			var v obj
			if k != "metainfo" {
				if err := json.Unmarshal(raw, &v); err != nil {
					t.Fatalf("%s: nft -j %s object: %v: %s", version, k, err, raw)
				}
			}
			switch k {
			case "table":
				rs.tables = append(rs.tables, v.Family+" "+v.Name)
			case "chain":
				rs.chains[v.Family+" "+v.Table+" "+v.Name] += 0
			case "rule":
				rs.chains[v.Family+" "+v.Table+" "+v.Chain]++
			case "set":
				rs.elements[v.Family+" "+v.Table+" "+v.Name] = len(v.Elem)
			}
		}
	}
	return rs
}

// hostPlans is every ruleset nftmesh writes: every scenario (both families,
// TPROXY, DNS capture, ...), the plan using the whole vocabulary, and 10,000
// excluded CIDRs.
func hostPlans(t *testing.T) map[string]redirect.Plan {
	plans := map[string]redirect.Plan{
		"vocabulary": vocabularyPlan(),
		"10k-cidrs":  planWithExcludes(t, 10000),
	}
	for _, sc := range scenarios.All {
		p, err := sc.Plan()
		if err != nil {
			t.Fatal(err)
		}
		plans[sc.Name] = p
	}
	return plans
}

// TestKernelHostNftListsOurRules applies every plan with the nftables backend,
// then lists the ruleset with each host nft version, as text and as JSON:
// both must succeed without a word on stderr, the text must name every chain
// of ours, and the JSON must hold our table, every chain with the plan's
// rule count, and every set with elements (intervals that touch are listed
// merged, so as many elements as the plan only where none touch: 10,000
// CIDRs, every other /24).
func TestKernelHostNftListsOurRules(t *testing.T) {
	nfts := hostNfts(t)
	ctx := context.Background()
	for name, p := range hostPlans(t) {
		t.Run(name, func(t *testing.T) {
			ns, cleanup := newNetns(t)
			t.Cleanup(cleanup)
			if err := New().Apply(ctx, ns, p); err != nil {
				t.Fatalf("Apply: %v", err)
			}
			wantRules := map[string]int{}
			for _, tb := range p.Tables {
				for _, c := range tb.Chains {
					if len(c.Rules) > 0 {
						wantRules[ChainName(tb.Name, c.Name)] = len(c.Rules)
					}
				}
			}

			for _, h := range nfts {
				text := h.run(t, ns, "", "list", "ruleset")
				if !strings.Contains(text, "table inet "+TableName+" {") {
					t.Errorf("%s: nft list ruleset has no table inet %s:\n%.2000s", h.version, TableName, text)
				}
				for chain := range wantRules {
					if !strings.Contains(text, "chain "+chain+" {") {
						t.Errorf("%s: nft list ruleset has no chain %s", h.version, chain)
					}
				}
				rs := parseHostJSON(t, h.version, h.run(t, ns, "", "-j", "list", "ruleset"))
				if len(rs.tables) != 1 || rs.tables[0] != "inet "+TableName {
					t.Errorf("%s: nft -j lists tables %v, want [inet %s]", h.version, rs.tables, TableName)
				}
				for chain, n := range wantRules {
					if got := rs.chains["inet "+TableName+" "+chain]; got != n {
						t.Errorf("%s: nft -j: chain %s has %d rules, the plan %d", h.version, chain, got, n)
					}
				}
				for _, s := range p.Sets {
					// A port set holds its ports merged into ranges.
					want, got := len(s.Prefixes)+len(redirect.MergePorts(s.Ports)), rs.elements["inet "+TableName+" "+s.Name]
					if got == 0 || got > want || (name == "10k-cidrs" && got != want) {
						t.Errorf("%s: nft -j: set %s lists %d elements, the plan has %d", h.version, s.Name, got, want)
					}
				}
			}
		})
	}
}

// adminRules is what a host admin might add beside ours in a pod's
// namespace while debugging: counters and logging in every hook our chains
// use, at priorities before and after ours, a set with timeouts, a verdict
// map, a concatenated set, a NAT chain with no verdict, all in tables of
// their own.
const adminRules = `
table inet hostadmin {
	counter seen { }
	set recent { type ipv4_addr; flags timeout; timeout 1m; }
	set pairs { type ipv4_addr . inet_service; elements = { 192.0.2.1 . 80 } }
	map byport { type inet_service : verdict; elements = { 9 : accept } }
	chain pre { type filter hook prerouting priority -300; policy accept; counter; ct state established,related counter accept; }
	chain natpre { type nat hook prerouting priority -150; policy accept; counter; }
	chain out { type filter hook output priority -150; policy accept; meta l4proto tcp counter name "seen"; ip daddr @recent counter; ip daddr . tcp dport @pairs counter; tcp dport vmap @byport; counter; }
	chain natout { type nat hook output priority 50; policy accept; counter; }
	chain in { type filter hook input priority 0; policy accept; counter; }
	chain post { type filter hook postrouting priority 300; policy accept; counter; }
}
table ip hostadmin4 {
	chain natpost { type nat hook postrouting priority 50; policy accept; counter; }
}
`

// withAdmin applies the plan with the nftables backend, then loads
// adminRules into the pod's namespace with one host nft version.
type withAdmin struct {
	*Backend
	t   *testing.T
	nft hostNft
}

func (w withAdmin) Apply(ctx context.Context, ns string, p redirect.Plan) error {
	if err := w.Backend.Apply(ctx, ns, p); err != nil {
		return err
	}
	w.nft.run(w.t, ns, adminRules, "-f", "-")
	return nil
}

// TestKernelHostNftAdminRulesBeside loads an admin's rules with each host nft
// version beside our capture and sends every probe of the scenario through
// real sockets: each still lands where Istio's rules send it. Our backend
// still reads its table as planned, and removing it leaves the admin's
// tables alone.
func TestKernelHostNftAdminRulesBeside(t *testing.T) {
	nfts := hostNfts(t)
	want := map[string]bool{"defaults": true, "tproxy": true, "dns-capture": true, "exclude-cidrs": true}
	for _, h := range nfts {
		for _, sc := range scenarios.All {
			if !want[sc.Name] {
				continue
			}
			t.Run(strings.Fields(h.version)[1]+"/"+sc.Name, func(t *testing.T) {
				b := withAdmin{Backend: New(), t: t, nft: h}
				run := nettest.RunScenario(t, b, sc)
				for _, o := range run.Outcomes {
					if !o.OK() {
						t.Errorf("with %s's admin rules beside ours: MISMATCH %s", h.version, o)
					}
				}
				ns := run.Topo.PodNetnsPath()
				ctx := context.Background()
				if err := b.Check(ctx, ns, run.Plan); err != nil {
					t.Errorf("Check with the admin's tables beside ours: %v", err)
				}
				h.run(t, ns, "", "-j", "list", "ruleset")
				if err := b.Remove(ctx, ns); err != nil {
					t.Fatalf("Remove: %v", err)
				}
				rs := parseHostJSON(t, h.version, h.run(t, ns, "", "-j", "list", "ruleset"))
				sort.Strings(rs.tables)
				if strings.Join(rs.tables, ",") != "inet hostadmin,ip hostadmin4" {
					t.Errorf("after Remove, tables %v; want only the admin's", rs.tables)
				}
			})
		}
	}
}
