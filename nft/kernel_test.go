package nft

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"strings"
	"testing"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/nftmesh/nftmesh/redirect"
	"github.com/nftmesh/nftmesh/testkit/scenarios"

	"github.com/nftmesh/nftmesh/testkit/nstest"
)

// nftJSON is the part of `nft -j list ruleset` the tests read.
type nftJSON struct {
	Nftables []map[string]json.RawMessage `json:"nftables"`
}

type jsonChain struct {
	Table, Name, Type, Hook, Policy string
	Prio                            int32
}

type jsonRule struct {
	Table, Chain string
	Expr         []json.RawMessage
}

type jsonSet struct {
	Table, Name string
	Elem        []json.RawMessage
}

type ruleset struct {
	tables []string
	chains []jsonChain
	rules  []jsonRule
	sets   []jsonSet
}

// readRuleset is the independent reader: the nft binary's JSON output.
func readRuleset(t *testing.T, ns string) ruleset {
	t.Helper()
	var doc nftJSON
	out := nstest.Run(t, ns, "", "nft", "-j", "list", "ruleset")
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("parsing nft -j output: %v\n%s", err, out)
	}
	var rs ruleset
	for _, obj := range doc.Nftables {
		for k, v := range obj {
			var err error
			switch k {
			case "table":
				var tb struct{ Family, Name string }
				err = json.Unmarshal(v, &tb)
				rs.tables = append(rs.tables, tb.Family+" "+tb.Name)
			case "chain":
				var c jsonChain
				err = json.Unmarshal(v, &c)
				rs.chains = append(rs.chains, c)
			case "rule":
				var r jsonRule
				err = json.Unmarshal(v, &r)
				rs.rules = append(rs.rules, r)
			case "set":
				var s jsonSet
				err = json.Unmarshal(v, &s)
				rs.sets = append(rs.sets, s)
			}
			if err != nil {
				t.Fatalf("parsing nft -j %s: %v", k, err)
			}
		}
	}
	return rs
}

func (rs ruleset) rulesOf(chain string) []string {
	var out []string
	for _, r := range rs.rules {
		if r.Chain == chain {
			b, _ := json.Marshal(r.Expr)
			out = append(out, string(b))
		}
	}
	return out
}

// checkAgainstNftJSON compares what nft sees with the plan: one table of
// ours, every chain with its hook, type and priority, the rule count per
// chain, and the named sets.
func checkAgainstNftJSON(t *testing.T, rs ruleset, p redirect.Plan) {
	t.Helper()
	if len(rs.tables) != 1 || rs.tables[0] != "inet "+TableName {
		t.Errorf("nft sees tables %v, want only inet %s", rs.tables, TableName)
	}
	want := map[string]redirect.Chain{}
	for _, tb := range p.Tables {
		for _, c := range tb.Chains {
			want[ChainName(tb.Name, c.Name)] = c
		}
	}
	if len(rs.chains) != len(want) {
		t.Errorf("nft sees %d chains, plan has %d", len(rs.chains), len(want))
	}
	for _, c := range rs.chains {
		w, ok := want[c.Name]
		if !ok {
			t.Errorf("nft sees chain %s the plan does not have", c.Name)
			continue
		}
		if w.IsBase() && (c.Hook != string(w.Hook) || c.Type != string(w.Type) || c.Prio != w.Priority || c.Policy != "accept") {
			t.Errorf("chain %s: nft sees type %s hook %s prio %d policy %s; plan %s %s %d accept", c.Name, c.Type, c.Hook, c.Prio, c.Policy, w.Type, w.Hook, w.Priority)
		}
		if !w.IsBase() && c.Hook != "" {
			t.Errorf("chain %s: regular in the plan, nft sees hook %s", c.Name, c.Hook)
		}
		if got := len(rs.rulesOf(c.Name)); got != len(w.Rules) {
			t.Errorf("chain %s: nft sees %d rules, plan has %d", c.Name, got, len(w.Rules))
		}
	}
	var named []string
	for _, s := range rs.sets {
		named = append(named, s.Name)
	}
	if len(named) != len(p.Sets) {
		t.Errorf("nft sees sets %v, plan has %d", named, len(p.Sets))
	}
}

// ruleWith reports whether a rule of chain contains every fragment of its
// JSON encoding.
func (rs ruleset) ruleWith(chain string, fragments ...string) bool {
next:
	for _, r := range rs.rulesOf(chain) {
		for _, f := range fragments {
			if !strings.Contains(r, f) {
				continue next
			}
		}
		return true
	}
	return false
}

// concreteChecks are rule-level facts read with nft, per scenario.
var concreteChecks = map[string][][]string{
	"defaults": {
		{"nat-istio-output", `{"meta":{"key":"skuid"}}`, `"right":1337`, `"return":null`},
		{"nat-istio-in-redirect", `"redirect":{"port":15006}`},
		{"nat-istio-redirect", `"redirect":{"port":15001}`},
		{"nat-istio-inbound", `"right":15008`, `"return":null`},
	},
	"custom-uid-gid": {
		{"nat-istio-output", `{"meta":{"key":"skuid"}}`, `"right":2001`, `"return":null`},
		{"nat-istio-output", `{"meta":{"key":"skgid"}}`, `"right":2002`, `"return":null`},
	},
	"exclude-cidrs": {
		{"nat-istio-output", `"right":"@outbound-exclude-v4"`, `"return":null`},
	},
	"tproxy": {
		{"mangle-istio-tproxy", `"tproxy":{"family":"ip","port":15006}`, `"mangle":{"key":{"meta":{"key":"mark"}},"value":1337}`, `"accept":null`},
		{"mangle-istio-tproxy", `"tproxy":{"family":"ip6","port":15006}`},
	},
	"dns-capture": {
		{"nat-istio-output-dns", `"protocol":"udp"`, `"right":53`, `"redirect":{"port":15053}`},
		{"raw-istio-output-dns", `"zone"`, `"value":1`},
	},
	"drop-invalid": {
		{"mangle-istio-drop", `"drop":null`},
	},
}

// normalize collapses whitespace and drops comment lines. These are the
// only differences between Render and `nft list table inet nftmesh` that
// the comparison forgives: nft wraps long element lists over several lines
// and indents them its own way, and Render appends the policy routes and
// loopback addresses (not nftables objects) as "#" comment lines. Handles
// are not printed by `nft list` without -a; handleRE strips them anyway.
// Everything else — chain order, priorities by name (dstnat, mangle, raw),
// the dependencies nft hides (the nfproto guard before an ip/ip6 match,
// "meta l4proto tcp" before "tcp dport"), marks in hex, "ct state !" —
// Render reproduces exactly; TestKernelVocabulary covers the forms Build
// does not produce.
func normalize(s string) string {
	var lines []string
	for _, l := range strings.Split(s, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			lines = append(lines, l)
		}
	}
	return strings.Join(strings.Fields(strings.Join(lines, "\n")), " ")
}

var handleRE = regexp.MustCompile(` # handle \d+`)

func TestKernelScenarios(t *testing.T) {
	nstest.NeedRoot(t)
	ctx := context.Background()
	for _, sc := range scenarios.All {
		t.Run(sc.Name, func(t *testing.T) {
			p, err := sc.Plan()
			if err != nil {
				t.Fatal(err)
			}
			ns := podNetns(t)
			b := New()
			if err := b.Apply(ctx, ns, p); err != nil {
				t.Fatalf("Apply: %v", err)
			}
			got, err := b.List(ctx, ns)
			if err != nil {
				t.Fatalf("List: %v", err)
			}
			if d := redirect.Diff(p, got); len(d) > 0 {
				t.Fatalf("List differs from the plan:\n%s", strings.Join(d, "\n"))
			}

			// Independent reader 1: nft -j.
			rs := readRuleset(t, ns)
			checkAgainstNftJSON(t, rs, p)
			for _, c := range concreteChecks[sc.Name] {
				if !rs.ruleWith(c[0], c[1:]...) {
					t.Errorf("nft -j: no rule in %s with %v; rules:\n%s", c[0], c[1:], strings.Join(rs.rulesOf(c[0]), "\n"))
				}
			}
			// Independent reader 2: nft's text is what Render prints.
			listed := handleRE.ReplaceAllString(nstest.Run(t, ns, "", "nft", "list", "table", "inet", TableName), "")
			rendered, err := Render(p)
			if err != nil {
				t.Fatal(err)
			}
			if normalize(listed) != normalize(rendered) {
				t.Errorf("nft list differs from Render:\n--- nft list\n%s\n--- Render\n%s", listed, rendered)
			}
			// Routes and the passthrough address, read with ip.
			rules := nstest.Run(t, ns, "", "ip", "rule") + nstest.Run(t, ns, "", "ip", "-6", "rule")
			if n := strings.Count(rules, "fwmark 0x539 lookup 133"); n != len(p.Routes) {
				t.Errorf("ip rule shows %d fwmark rules, plan has %d routes:\n%s", n, len(p.Routes), rules)
			}
			addrs := nstest.Run(t, ns, "", "ip", "-6", "addr", "show", "dev", "lo")
			if strings.Contains(addrs, "::6/128") != (len(p.LoopbackAddrs) > 0) {
				t.Errorf("lo addresses %q, plan wants %v", addrs, p.LoopbackAddrs)
			}

			// Idempotent re-apply: same state, still one table, one rule set.
			if err := b.Apply(ctx, ns, p); err != nil {
				t.Fatalf("second Apply: %v", err)
			}
			again, err := b.List(ctx, ns)
			if err != nil {
				t.Fatal(err)
			}
			if d := redirect.Diff(got, again); len(d) > 0 {
				t.Errorf("re-apply changed the state:\n%s", strings.Join(d, "\n"))
			}
			checkAgainstNftJSON(t, readRuleset(t, ns), p)
			if err := b.Check(ctx, ns, p); err != nil {
				t.Fatalf("Check after apply: %v", err)
			}

			// Tamper: flush ISTIO_OUTPUT behind our back; Check must see it.
			tamper(t, ns, func(cc *nftables.Conn, tbl *nftables.Table) {
				cc.FlushChain(&nftables.Chain{Name: ChainName(redirect.TableNat, redirect.ChainOutbound), Table: tbl})
			})
			err = b.Check(ctx, ns, p)
			var drift *redirect.DriftError
			if !errors.As(err, &drift) {
				t.Fatalf("Check after flushing nat-istio-output: %v, want a *redirect.DriftError", err)
			}
			if !strings.Contains(drift.Error(), "- rule nat-istio-output") {
				t.Errorf("drift does not name the missing ISTIO_OUTPUT rules:\n%v", drift)
			}
			// Apply heals, then delete a single rule by handle.
			if err := b.Apply(ctx, ns, p); err != nil {
				t.Fatal(err)
			}
			if err := b.Check(ctx, ns, p); err != nil {
				t.Fatalf("Check after healing: %v", err)
			}
			deleteLastRule(t, ns)
			if err := b.Check(ctx, ns, p); !redirect.IsDrift(err) {
				t.Fatalf("Check after deleting one rule: %v, want drift", err)
			}

			if err := b.Remove(ctx, ns); err != nil {
				t.Fatalf("Remove: %v", err)
			}
			assertNothingLeft(t, ns)
			if err := b.Remove(ctx, ns); err != nil {
				t.Fatalf("second Remove (nothing there): %v", err)
			}
			empty, err := b.List(ctx, ns)
			if err != nil {
				t.Fatal(err)
			}
			if !empty.Empty() || len(empty.Sets) > 0 {
				t.Errorf("List after Remove: %v", redirect.Describe(empty))
			}
		})
	}
}

func tamper(t *testing.T, path string, f func(*nftables.Conn, *nftables.Table)) {
	t.Helper()
	ns, err := netns.GetFromPath(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	cc, err := nftables.New(nftables.WithNetNSFd(int(ns)))
	if err != nil {
		t.Fatal(err)
	}
	f(cc, &nftables.Table{Name: TableName, Family: nftables.TableFamilyINet})
	if err := cc.Flush(); err != nil {
		t.Fatalf("tampering: %v", err)
	}
}

// deleteLastRule deletes the last rule of the table, found by handle.
func deleteLastRule(t *testing.T, path string) {
	t.Helper()
	ns, err := netns.GetFromPath(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	conn, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: int(ns)})
	if err != nil {
		t.Fatal(err)
	}
	rules, err := dumpRules(conn, TableName)
	conn.Close()
	if err != nil || len(rules) == 0 {
		t.Fatalf("dumping rules: %v (%d rules)", err, len(rules))
	}
	last := rules[len(rules)-1]
	tamper(t, path, func(cc *nftables.Conn, tbl *nftables.Table) {
		if err := cc.DelRule(&nftables.Rule{Table: tbl, Chain: &nftables.Chain{Name: last.chain, Table: tbl}, Handle: last.handle}); err != nil {
			t.Fatal(err)
		}
	})
}

func assertNothingLeft(t *testing.T, ns string) {
	t.Helper()
	if out := strings.TrimSpace(nstest.Run(t, ns, "", "nft", "list", "ruleset")); out != "" {
		t.Errorf("nft list ruleset after Remove:\n%s", out)
	}
	rules := nstest.Run(t, ns, "", "ip", "rule") + nstest.Run(t, ns, "", "ip", "-6", "rule")
	if strings.Contains(rules, "fwmark") {
		t.Errorf("fwmark rules left:\n%s", rules)
	}
	routes := nstest.Run(t, ns, "", "ip", "route", "show", "table", "all") + nstest.Run(t, ns, "", "ip", "-6", "route", "show", "table", "all")
	if strings.Contains(routes, "table 133") {
		t.Errorf("routes left in table 133:\n%s", routes)
	}
	if addrs := nstest.Run(t, ns, "", "ip", "-6", "addr", "show", "dev", "lo"); strings.Contains(addrs, "::6/128") {
		t.Errorf("::6 left on lo:\n%s", addrs)
	}
}

// longChainPlan passes Verify and our encoder but the kernel refuses it: a
// chain name beyond NFT_CHAIN_MAXNAMELEN (256).
func longChainPlan(t *testing.T) redirect.Plan {
	t.Helper()
	sc, _ := scenarios.ByName("tproxy")
	p, err := sc.Plan()
	if err != nil {
		t.Fatal(err)
	}
	long := "ISTIO_" + strings.Repeat("X", 300)
	nat := p.Table(redirect.TableNat)
	nat.Chains = append(nat.Chains, redirect.Chain{Name: long, Rules: []redirect.Rule{{Verdict: redirect.Return{}}}})
	out := nat.Chain(redirect.ChainOutput)
	out.Rules = append(out.Rules, redirect.Rule{Verdict: redirect.Jump{Chain: long}})
	if err := p.Verify(); err != nil {
		t.Fatalf("the long-chain plan should pass Verify: %v", err)
	}
	return p
}

func TestKernelRejectedBatchLeavesNothing(t *testing.T) {
	nstest.NeedRoot(t)
	ctx := context.Background()
	ns := podNetns(t)
	b := New()
	err := b.Apply(ctx, ns, longChainPlan(t))
	if err == nil {
		t.Fatal("Apply of a chain name longer than the kernel allows succeeded")
	}
	t.Logf("kernel refused as expected: %v", err)
	assertNothingLeft(t, ns)

	// A failed re-apply keeps the previous table whole (one atomic batch).
	good, err := scenarios.All[0].Plan()
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Apply(ctx, ns, good); err != nil {
		t.Fatal(err)
	}
	if err := b.Apply(ctx, ns, longChainPlan(t)); err == nil {
		t.Fatal("bad re-apply succeeded")
	}
	if err := b.Check(ctx, ns, good); err != nil {
		t.Fatalf("after a refused re-apply the old plan should still be live: %v", err)
	}
}

func TestKernelRouteFailureRollsBack(t *testing.T) {
	nstest.NeedRoot(t)
	ctx := context.Background()
	sc, _ := scenarios.ByName("tproxy")
	p, err := sc.Plan()
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Routes) != 2 {
		t.Fatalf("tproxy plan has %d routes, want v4 and v6", len(p.Routes))
	}
	// The v4 route goes in, then the second one fails: everything this
	// Apply added, table included, must be gone again.
	p.Routes = append(p.Routes[:1], unprogrammable)
	ns := podNetns(t)
	if err := New().Apply(ctx, ns, p); err == nil {
		t.Fatal("Apply with an unprogrammable route succeeded")
	} else {
		t.Logf("failed as expected: %v", err)
	}
	assertNothingLeft(t, ns)
}

// unprogrammable is a policy route that passes Verify and encode but that
// policyroute refuses, after the batch committed.
var unprogrammable = redirect.PolicyRoute{Family: redirect.FamilyAny, Mark: 1, Table: 7}

// TestKernelFailedReapplyRestores: a re-apply that fails after its batch
// committed puts the earlier table back (an earlier run's rules are not the
// failed call's to remove); routes of the earlier plan stay.
func TestKernelFailedReapplyRestores(t *testing.T) {
	nstest.NeedRoot(t)
	ctx := context.Background()
	ns := podNetns(t)
	tp, _ := scenarios.ByName("tproxy")
	v4, _ := scenarios.ByName("ipv4-only")
	for _, pair := range [][2]scenarios.Scenario{{tp, v4}, {v4, tp}} {
		earlier, err := pair[0].Plan()
		if err != nil {
			t.Fatal(err)
		}
		if err := New().Apply(ctx, ns, earlier); err != nil {
			t.Fatal(err)
		}
		next, _ := pair[1].Plan()
		next.Routes = append(next.Routes, unprogrammable)
		if err := New().Apply(ctx, ns, next); err == nil || !strings.Contains(err.Error(), "policy route for family any") {
			t.Fatalf("Apply with an unprogrammable route: %v", err)
		}
		if err := New().Check(ctx, ns, earlier); err != nil {
			t.Fatalf("%s over %s failed: the earlier rules are not back: %v", pair[1].Name, pair[0].Name, err)
		}
	}
}

func TestKernelReapplySwitchesMode(t *testing.T) {
	nstest.NeedRoot(t)
	ctx := context.Background()
	ns := podNetns(t)
	b := New()
	tp, _ := scenarios.ByName("tproxy")
	v4, _ := scenarios.ByName("ipv4-only")
	for _, sc := range []scenarios.Scenario{tp, v4, tp} {
		p, err := sc.Plan()
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Apply(ctx, ns, p); err != nil {
			t.Fatalf("Apply %s: %v", sc.Name, err)
		}
		if err := b.Check(ctx, ns, p); err != nil {
			t.Fatalf("Check after switching to %s: %v", sc.Name, err)
		}
	}
}

func TestKernelApplyByProcPath(t *testing.T) {
	nstest.NeedRoot(t)
	ns := podNetns(t)
	// /proc/PID/ns/net of a process living in the namespace.
	cmd := inNetnsStart(t, ns, "sleep", "30")
	path := fmt.Sprintf("/proc/%d/ns/net", cmd)
	p, err := scenarios.All[0].Plan()
	if err != nil {
		t.Fatal(err)
	}
	b := New()
	if err := b.Apply(context.Background(), path, p); err != nil {
		t.Fatal(err)
	}
	if err := b.Check(context.Background(), ns, p); err != nil {
		t.Fatalf("applied via %s, checked via %s: %v", path, ns, err)
	}
}

func TestKernel10kCIDRs(t *testing.T) {
	nstest.NeedRoot(t)
	p := planWithExcludes(t, 10000)
	ns := podNetns(t)
	b := New()
	if err := b.Apply(context.Background(), ns, p); err != nil {
		t.Fatal(err)
	}
	if err := b.Check(context.Background(), ns, p); err != nil {
		t.Fatal(err)
	}
	out := nstest.Run(t, ns, "", "nft", "list", "set", "inet", TableName, "outbound-exclude-v4")
	if n := strings.Count(out, "/24"); n != 10000 {
		t.Errorf("nft lists %d /24 elements, want 10000", n)
	}
}

// planWithExcludes is the default plan with n excluded, non-adjacent /24s.
func planWithExcludes(tb testing.TB, n int) redirect.Plan {
	tb.Helper()
	s := scenarios.Base()
	for i := range n {
		// Every other /24 of 10.0.0.0/8 onwards, so nothing merges.
		a := netip.AddrFrom4([4]byte{byte(10 + (2*i)>>16), byte((2 * i) >> 8), byte(2 * i), 0})
		s.OutboundIPRangesExclude = append(s.OutboundIPRangesExclude, netip.PrefixFrom(a, 24))
	}
	p, err := redirect.Build(s)
	if err != nil {
		tb.Fatal(err)
	}
	return p
}

func TestKernelWithTable(t *testing.T) {
	nstest.NeedRoot(t)
	ctx := context.Background()
	ns := podNetns(t)
	p, err := scenarios.All[0].Plan()
	if err != nil {
		t.Fatal(err)
	}
	other := New()
	other.table = "othermesh"
	if err := other.Apply(ctx, ns, p); err != nil {
		t.Fatal(err)
	}
	if err := other.Check(ctx, ns, p); err != nil {
		t.Fatalf("Check of the renamed table: %v", err)
	}
	// The default backend does not see (or remove) the other owner's table.
	mine, err := New().List(ctx, ns)
	if err != nil {
		t.Fatal(err)
	}
	if len(mine.Tables) != 0 {
		t.Errorf("default backend lists the other table: %v", redirect.Describe(mine))
	}
	if rs := readRuleset(t, ns); len(rs.tables) != 1 || rs.tables[0] != "inet othermesh" {
		t.Errorf("nft sees tables %v", rs.tables)
	}
	if err := other.Remove(ctx, ns); err != nil {
		t.Fatal(err)
	}
	assertNothingLeft(t, ns)
}
