package iptables

import (
	"context"
	"fmt"

	"github.com/nftmesh/nftmesh/redirect"
)

// A legacy table is shared: our rules in a builtin chain sit among other
// software's, which nftmesh leaves alone (and List leaves out). A foreign
// rule placed before ours that can end the chain's traversal (ACCEPT, a
// DNAT, a jump into a chain that accepts) switches capture off for what it
// matches without changing a rule of ours. CHECK reads them here; the Plan
// has no word for another writer's rule.

// continuing are the x_tables targets that always hand the packet on to
// the next rule (XT_CONTINUE). Every other target may end the chain.
var continuing = map[string]bool{
	"AUDIT": true, "CHECKSUM": true, "CLASSIFY": true, "CONNMARK": true, "CONNSECMARK": true, "CT": true,
	"DSCP": true, "ECN": true, "HL": true, "HMARK": true, "IDLETIMER": true, "LED": true, "LOG": true,
	"MARK": true, "NFLOG": true, "NOTRACK": true, "RATEEST": true, "SECMARK": true, "SET": true,
	"TCPMSS": true, "TCPOPTSTRIP": true, "TEE": true, "TOS": true, "TRACE": true, "TTL": true,
}

// standardNames are the standard targets' verdicts as iptables-save prints
// them; each ends the chain (RETURN ends a builtin chain at its policy).
var standardNames = map[int32]string{verdictAccept: "ACCEPT", verdictDrop: "DROP", -4: "QUEUE", verdictReturn: "RETURN"}

// aheadOfOurs describes, for each builtin chain of t holding rules of
// ours, the foreign rules before the last of ours that can end the chain.
func (t *table) aheadOfOurs() []string {
	var out []string
	ends := map[string]bool{} // user chain -> can end its caller's traversal
	for _, c := range t.chains {
		if c.hook < 0 {
			continue
		}
		last := -1
		for i, e := range c.rules {
			if ours(e) {
				last = i
			}
		}
		for i, e := range c.rules[:max(last, 0)] {
			if ours(e) {
				continue
			}
			if how, ok := t.canEnd(e, ends, true); ok {
				out = append(out, fmt.Sprintf("+ %s %s %s rule %d, before nftmesh's, is not nftmesh's and can end the chain: %s", t.l.fam, t.name, c.name, i+1, how))
			}
		}
	}
	return out
}

// canEnd reports whether entry e can end the traversal of the builtin
// chain it is reached from (inBuiltin: e is in that chain itself), and
// how, as iptables-save would print its target.
func (t *table) canEnd(e *tentry, ends map[string]bool, inBuiltin bool) (string, bool) {
	if e.parsed.targetName != "" {
		return "-j " + e.parsed.targetName, !continuing[e.parsed.targetName]
	}
	v, _ := e.parsed.stdVerdict()
	if name, ok := standardNames[v]; ok {
		return "-j " + name, inBuiltin || v != verdictReturn
	}
	switch {
	case e.fallsThrough:
		return "", false
	case e.jumpChain == "":
		return "a jump into the middle of a chain", true
	case e.raw[t.l.flagsOff]&t.gotoFlag() != 0:
		// Its RETURN goes back past this chain: from a builtin chain,
		// to the policy.
		return "-g " + e.jumpChain, inBuiltin || t.chainCanEnd(e.jumpChain, ends)
	}
	return "-j " + e.jumpChain, t.chainCanEnd(e.jumpChain, ends)
}

// chainCanEnd reports whether user chain name holds a rule, or calls a
// chain holding one, that can end its caller's traversal.
func (t *table) chainCanEnd(name string, ends map[string]bool) bool {
	if v, seen := ends[name]; seen {
		return v
	}
	ends[name] = false // x_tables refuses loops; this only bounds the walk
	c := t.chain(name)
	if c == nil {
		return true
	}
	for _, e := range c.rules {
		if _, ok := t.canEnd(e, ends, false); ok {
			ends[name] = true
			return true
		}
	}
	return false
}

func (t *table) gotoFlag() byte {
	if t.l.fam == redirect.FamilyIPv6 {
		return ip6FGoto
	}
	return ipFGoto
}

// aheadOfOursIn reads every legacy table of netns and returns aheadOfOurs
// of each.
func aheadOfOursIn(ctx context.Context, netns string) ([]string, error) {
	s, err := openSockets(netns, allFamilies, nil)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	var out []string
	for _, fam := range allFamilies {
		for _, name := range readOrder {
			if !s.tables[fam][name] {
				continue
			}
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			t, err := readTableRetry(s.fd[fam], layoutFor(fam), name)
			if err != nil {
				return nil, err
			}
			out = append(out, t.aheadOfOurs()...)
		}
	}
	return out, nil
}
