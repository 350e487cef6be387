package iptables

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nftmesh/nftmesh/redirect"
	"github.com/nftmesh/nftmesh/testkit/scenarios"

	"github.com/nftmesh/nftmesh/testkit/nstest"
)

// readNS reads one table of a netns with our reader (test helper).
func readNS(t *testing.T, path string, fam redirect.Family, name string) *table {
	t.Helper()
	s, err := openSockets(path, []redirect.Family{fam}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	tb, err := readTable(s.fd[fam], layoutFor(fam), name)
	if err != nil {
		t.Fatal(err)
	}
	return tb
}

// TestEntriesMatchIptablesBytes: the entries we write are byte-for-byte
// those iptables-legacy-restore writes for the same text (revisions, masks,
// flags, padding), not only printed the same.
func TestEntriesMatchIptablesBytes(t *testing.T) {
	nstest.NeedRoot(t)
	for _, sc := range scenarios.All {
		p, err := sc.Plan()
		if err != nil {
			t.Fatal(err)
		}
		t.Run(sc.Name, func(t *testing.T) {
			nsA, pathA := nstest.New(t, "leg-")
			_, pathB := nstest.New(t, "leg-")
			if err := New().Apply(context.Background(), pathB, p); err != nil {
				t.Fatal(err)
			}
			for _, f := range families {
				text, _ := Render(p, f.fam)
				nstest.Run(t, nsA, text, restoreBin(f.ext == "v6"))
				for name := range splitTables(text) {
					a, b := readNS(t, pathA, f.fam, name), readNS(t, pathB, f.fam, name)
					ab, _, _, _, err := a.layout()
					if err != nil {
						t.Fatal(err)
					}
					bb, _, _, _, err := b.layout()
					if err != nil {
						t.Fatal(err)
					}
					if !bytes.Equal(scrub(a.l, ab), scrub(b.l, bb)) {
						t.Errorf("%s %s: our entries differ from iptables-legacy-restore's:\n%s", f.ext, name, firstDiff(a, b))
					}
				}
			}
		})
	}
}

func firstDiff(a, b *table) string {
	var ea, eb []*tentry
	for _, c := range a.chains {
		ea = append(append(append(ea, c.head), c.rules...), c.tail)
	}
	for _, c := range b.chains {
		eb = append(append(append(eb, c.head), c.rules...), c.tail)
	}
	for i := 0; i < min(len(ea), len(eb)); i++ {
		if ea[i] == nil || eb[i] == nil {
			continue
		}
		x, y := scrub(a.l, ea[i].raw), scrub(b.l, eb[i].raw)
		if !bytes.Equal(x, y) {
			return fmt.Sprintf("entry %d:\niptables: % x\nours:     % x", i, x, y)
		}
	}
	return fmt.Sprintf("%d vs %d entries", len(ea), len(eb))
}

const foreignV4 = `*mangle
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:CNI-MARK - [0:0]
-A PREROUTING -i eth0 -j CNI-MARK
-A OUTPUT -p udp -m udp --dport 4789 -j MARK --set-xmark 0x100/0x100
-A CNI-MARK -m mark --mark 0x4000/0x4000 -j RETURN
-A CNI-MARK -p tcp -m tcp --tcp-flags SYN,RST SYN -j MARK --set-xmark 0x1/0x1
COMMIT
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:AAA-FIRST - [0:0]
:KUBE-SERVICES - [0:0]
:ZZZ-LAST - [0:0]
-A PREROUTING -m comment --comment "kube services" -j KUBE-SERVICES
-A PREROUTING -j AAA-FIRST
-A OUTPUT -j KUBE-SERVICES
-A POSTROUTING -s 10.244.0.0/16 ! -d 10.244.0.0/16 -j MASQUERADE
-A AAA-FIRST -p tcp -m tcp --dport 9999 -j ZZZ-LAST
-A AAA-FIRST -p tcp -j ACCEPT
-A KUBE-SERVICES -d 10.96.0.1/32 -p tcp -m tcp --dport 443 -j DNAT --to-destination 192.0.2.10:6443
-A KUBE-SERVICES -d 10.96.0.10/32 -p udp -m udp --dport 53 -j DNAT --to-destination 192.0.2.53:53
-A ZZZ-LAST -p tcp -m tcp --dport 9999 -j REDIRECT --to-ports 9998
-A ZZZ-LAST -j LOG --log-prefix "zzz "
COMMIT
*filter
:INPUT ACCEPT [0:0]
:FORWARD DROP [0:0]
:OUTPUT ACCEPT [0:0]
:FW - [0:0]
-A INPUT -m conntrack --ctstate INVALID -j DROP
-A INPUT -j FW
-A FW -s 203.0.113.0/24 -j REJECT --reject-with icmp-port-unreachable
COMMIT
`

const foreignV6 = `*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
-A OUTPUT -j KUBE-SERVICES
-A KUBE-SERVICES -d 2001:db8:96::1/128 -p tcp -m tcp --dport 443 -j DNAT --to-destination [2001:db8::10]:6443
COMMIT
*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
-A INPUT -p ipv6-icmp -j ACCEPT
COMMIT
`

// TestForeignRulesSurvive loads foreign chains and rules in nat, mangle and
// filter with iptables-legacy-restore, applies and removes every scenario,
// and checks that the foreign rules print the same throughout and that the
// tables equal the original after Remove. Check reads our rules as planned
// and names, as drift, the foreign rules before ours that can keep packets
// from them (KUBE-SERVICES' DNATs, AAA-FIRST's ACCEPT); CNI-MARK, which only
// marks and returns, is none.
func TestForeignRulesSurvive(t *testing.T) {
	nstest.NeedRoot(t)
	ctx := context.Background()
	for _, sc := range scenarios.All {
		t.Run(sc.Name, func(t *testing.T) {
			p, err := sc.Plan()
			if err != nil {
				t.Fatal(err)
			}
			ns, path := nstest.New(t, "leg-")
			nstest.Run(t, ns, foreignV4, "iptables-legacy-restore")
			nstest.Run(t, ns, foreignV6, "ip6tables-legacy-restore")
			before := [2]string{saveTables(t, ns, false), saveTables(t, ns, true)}
			b := New()
			for i := 0; i < 2; i++ { // apply, then re-apply over our own rules
				if err := b.Apply(ctx, path, p); err != nil {
					t.Fatalf("Apply %d: %v", i+1, err)
				}
			}
			for i, v6 := range []bool{false, true} {
				got := saveTables(t, ns, v6)
				if foreign := withoutOurs(got); foreign != withoutOurs(before[i]) {
					t.Errorf("v6=%v: foreign rules changed by Apply:\n%s", v6, lineDiff(withoutOurs(before[i]), foreign))
				}
			}
			checkForeignAhead(t, b.Check(ctx, path, p))
			if err := b.Remove(ctx, path); err != nil {
				t.Fatalf("Remove: %v", err)
			}
			// Tables that existed must be identical; a table we had to
			// instantiate stays (the kernel cannot drop it) but empty.
			for i, v6 := range []bool{false, true} {
				orig, got := splitTables(before[i]), splitTables(saveTables(t, ns, v6))
				for name, block := range got {
					if o, ok := orig[name]; ok && o != block {
						t.Errorf("v6=%v: after Remove table %s differs from the original:\n%s", v6, name, lineDiff(o, block))
					} else if !ok && strings.Contains(block, "\n-A ") {
						t.Errorf("v6=%v: after Remove table %s we created still has rules:\n%s", v6, name, block)
					}
				}
				for name := range orig {
					if _, ok := got[name]; !ok {
						t.Errorf("v6=%v: table %s vanished", v6, name)
					}
				}
			}
		})
	}
}

// withoutOurs drops our rule and chain lines and the tables that only we
// created, leaving what the foreign software owns.
func withoutOurs(save string) string {
	var out []string
	for name, block := range splitTables(save) {
		var keep []string
		foreign := false
		for _, line := range strings.Split(block, "\n") {
			if strings.Contains(line, "nftmesh") || strings.HasPrefix(line, ":ISTIO_") {
				continue
			}
			if strings.HasPrefix(line, "-A ") {
				foreign = true
			}
			keep = append(keep, line)
		}
		if foreign {
			out = append(out, name+"\n"+strings.Join(keep, "\n"))
		}
	}
	slicesSort(out)
	return strings.Join(out, "\n")
}

// TestConcurrentIptables: another process appends and deletes rules in the
// same netns (taking the xtables lock, as iptables-legacy does) while we
// apply 50 times; none of its rules and none of ours may be lost.
func TestConcurrentIptables(t *testing.T) {
	nstest.NeedRoot(t)
	ctx := context.Background()
	sc, _ := scenarios.ByName("defaults")
	p, err := sc.Plan()
	if err != nil {
		t.Fatal(err)
	}
	ns, path := nstest.New(t, "leg-")
	// A foreign rule that must exist at the end, and a loop that adds and
	// removes another one through the iptables binary.
	nstest.Run(t, ns, "", "iptables-legacy", "-w", "-t", "nat", "-A", "POSTROUTING", "-s", "198.51.100.7/32", "-j", "ACCEPT")
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var loops atomic.Int64
	var loopErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			for _, op := range []string{"-A", "-D"} {
				out, err := exec.Command("ip", "netns", "exec", ns, "iptables-legacy", "-w", "-t", "nat", op, "POSTROUTING", "-s", "203.0.113.9/32", "-j", "RETURN").CombinedOutput()
				if err != nil {
					loopErr = fmt.Errorf("iptables %s: %v: %s", op, err, out)
					return
				}
			}
			loops.Add(1)
		}
	}()
	b := New()
	deadline := time.Now().Add(60 * time.Second)
	// At least 50 applies, and enough that many iptables runs overlap them.
	for i := 0; (i < 50 || loops.Load() < 25) && time.Now().Before(deadline); i++ {
		if i%2 == 1 {
			if err := b.Remove(ctx, path); err != nil {
				t.Errorf("Remove %d: %v", i, err)
			}
		}
		if err := b.Apply(ctx, path, p); err != nil {
			t.Errorf("Apply %d: %v", i, err)
		}
	}
	close(stop)
	wg.Wait()
	if loopErr != nil {
		t.Errorf("concurrent iptables loop: %v", loopErr)
	}
	t.Logf("concurrent iptables -A/-D pairs: %d", loops.Load())
	if loops.Load() == 0 {
		t.Error("the iptables loop never ran concurrently")
	}
	got := saveTables(t, ns, false)
	if !strings.Contains(got, "-A POSTROUTING -s 198.51.100.7/32 -j ACCEPT") {
		t.Errorf("foreign rule lost:\n%s", got)
	}
	if strings.Contains(got, "203.0.113.9") {
		t.Errorf("the loop's rule should be deleted at the end:\n%s", got)
	}
	if err := b.Check(ctx, path, p); err != nil {
		t.Errorf("our rules after the concurrent run: %v", err)
	}
}

// checkForeignAhead: err is drift listing only foreign rules before ours
// that jump to KUBE-SERVICES or AAA-FIRST, IPv4 nat OUTPUT's among them
// (every scenario has rules of ours there).
func checkForeignAhead(t *testing.T, err error) {
	t.Helper()
	var d *redirect.DriftError
	if !errors.As(err, &d) {
		t.Fatalf("Check with foreign rules before ours = %v, want drift naming them", err)
	}
	for _, l := range d.Lines {
		if !strings.Contains(l, ", before nftmesh's, is not nftmesh's and can end the chain: -j KUBE-SERVICES") &&
			!strings.Contains(l, ", before nftmesh's, is not nftmesh's and can end the chain: -j AAA-FIRST") {
			t.Errorf("drift line %q names something else than a foreign rule ahead of ours", l)
		}
	}
	want := "+ ipv4 nat OUTPUT rule 1, before nftmesh's, is not nftmesh's and can end the chain: -j KUBE-SERVICES"
	if !slices.Contains(d.Lines, want) {
		t.Errorf("drift lacks %q:\n%s", want, strings.Join(d.Lines, "\n"))
	}
}
