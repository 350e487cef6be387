package iptables

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// tableInfo is struct ipt_getinfo.
type tableInfo struct {
	validHooks uint32
	hookEntry  [numHooks]uint32
	underflow  [numHooks]uint32
	numEntries uint32
	size       uint32
}

// tentry is one entry of a table being rewritten. Foreign entries keep
// their bytes; only a jump's verdict is rewritten when offsets move.
type tentry struct {
	raw    []byte
	parsed rawEntry
	oldIdx int // index in the table as read, -1 for entries we add
	// For standard targets with a positive verdict (a jump or a
	// fall-through): the chain whose start it jumps to, or else the entry.
	jumpChain    string
	jumpTo       *tentry
	fallsThrough bool // verdict is the next entry (a rule without -j)
	off          int  // offset in the table being written
}

// tchain is a builtin chain (hook >= 0; tail is its policy) or a user chain
// (head is its ERROR entry; tail its trailing RETURN).
type tchain struct {
	name  string
	hook  int
	head  *tentry
	rules []*tentry
	tail  *tentry
}

func (c *tchain) start() *tentry {
	if len(c.rules) > 0 {
		return c.rules[0]
	}
	return c.tail
}

type table struct {
	name   string
	l      *layout
	info   tableInfo
	chains []*tchain
	end    *tentry // the final ERROR entry
}

func (t *table) chain(name string) *tchain {
	for _, c := range t.chains {
		if c.name == name {
			return c
		}
	}
	return nil
}

func getInfo(fd int, l *layout, name string) (tableInfo, error) {
	b := make([]byte, getInfoLen)
	copy(b[:xtTableMaxNameLen-1], name)
	if _, err := getsockopt(fd, l.sockLevel, soGetInfo, b); err != nil {
		return tableInfo{}, fmt.Errorf("reading %s table %s info: %w", l.fam, name, err)
	}
	var in tableInfo
	in.validHooks = hostEndian.Uint32(b[32:])
	for h := 0; h < numHooks; h++ {
		in.hookEntry[h] = hostEndian.Uint32(b[36+4*h:])
		in.underflow[h] = hostEndian.Uint32(b[56+4*h:])
	}
	in.numEntries = hostEndian.Uint32(b[76:])
	in.size = hostEndian.Uint32(b[80:])
	return in, nil
}

// readTable reads and parses one table. The table changing between the
// two getsockopt calls shows up as a size mismatch (EAGAIN for the caller).
func readTable(fd int, l *layout, name string) (*table, error) {
	info, err := getInfo(fd, l, name)
	if err != nil {
		return nil, err
	}
	b := make([]byte, getEntriesHdr+int(info.size))
	copy(b[:xtTableMaxNameLen-1], name)
	hostEndian.PutUint32(b[32:], info.size)
	if _, err := getsockopt(fd, l.sockLevel, soGetEntries, b); err != nil {
		if errors.Is(err, unix.EAGAIN) {
			return nil, unix.EAGAIN
		}
		return nil, fmt.Errorf("reading %s table %s entries: %w", l.fam, name, err)
	}
	t, err := parseTable(l, name, info, b[getEntriesHdr:])
	if err != nil {
		return nil, fmt.Errorf("parsing %s table %s: %w", l.fam, name, err)
	}
	return t, nil
}

// readTableRetry is readTable, again while another writer changes the
// table in between (EAGAIN), at most maxAttempts times.
func readTableRetry(fd int, l *layout, name string) (t *table, err error) {
	for range maxAttempts {
		if t, err = readTable(fd, l, name); !errors.Is(err, unix.EAGAIN) {
			break
		}
	}
	return t, err
}

// parseTable splits a table blob into chains and resolves jumps. It never
// panics on malformed input (FuzzParseTable).
func parseTable(l *layout, name string, info tableInfo, blob []byte) (*table, error) {
	t := &table{name: name, l: l, info: info}
	ents, byOff, err := splitEntries(l, blob)
	if err != nil {
		return nil, err
	}
	if len(ents) == 0 || uint32(len(ents)) != info.numEntries {
		return nil, fmt.Errorf("%d entries, info says %d", len(ents), info.numEntries)
	}
	if n, ok := ents[len(ents)-1].parsed.errorName(); !ok || n != "ERROR" {
		return nil, fmt.Errorf("table does not end with the ERROR entry")
	}
	t.end = ents[len(ents)-1]
	hookAt, err := hookEntries(info, byOff)
	if err != nil {
		return nil, err
	}
	builtins := 0
	for i := 0; i < len(ents)-1; {
		var c *tchain
		if c, i, err = nextChain(l, info, ents, byOff, hookAt, i); err != nil {
			return nil, err
		}
		if c.hook >= 0 {
			builtins++
		}
		t.chains = append(t.chains, c)
	}
	if len(hookAt) != builtins {
		return nil, fmt.Errorf("hook entries overlap")
	}
	if err := t.resolveJumps(ents, byOff); err != nil {
		return nil, err
	}
	return t, nil
}

// splitEntries cuts the blob into entries and indexes them by offset.
func splitEntries(l *layout, blob []byte) ([]*tentry, map[int]int, error) {
	var ents []*tentry
	byOff := map[int]int{}
	for off := 0; off < len(blob); {
		e, n, err := parseEntry(l, blob[off:])
		if err != nil {
			return nil, nil, fmt.Errorf("entry %d at offset %d: %w", len(ents), off, err)
		}
		byOff[off] = len(ents)
		ents = append(ents, &tentry{raw: e.b, parsed: e, oldIdx: len(ents), off: off})
		off += n
	}
	return ents, byOff, nil
}

// hookEntries maps the index of each valid hook's first entry to the hook.
func hookEntries(info tableInfo, byOff map[int]int) (map[int]int, error) {
	hookAt := map[int]int{}
	for h := 0; h < numHooks; h++ {
		if info.validHooks&(1<<h) == 0 {
			continue
		}
		i, ok := byOff[int(info.hookEntry[h])]
		u, ok2 := byOff[int(info.underflow[h])]
		if !ok || !ok2 || u < i {
			return nil, fmt.Errorf("hook %d entry %d / underflow %d are not entry boundaries", h, info.hookEntry[h], info.underflow[h])
		}
		hookAt[i] = h
	}
	return hookAt, nil
}

// nextChain reads the chain starting at entry i: a builtin chain up to its
// underflow (policy) entry, or a user chain from its ERROR head up to the
// next head or hook entry. It returns the index after the chain.
func nextChain(l *layout, info tableInfo, ents []*tentry, byOff, hookAt map[int]int, i int) (*tchain, int, error) {
	if h, ok := hookAt[i]; ok {
		u := byOff[int(info.underflow[h])]
		c := &tchain{name: hookChainNames[h], hook: h, rules: slices.Clone(ents[i:u]), tail: ents[u]}
		if !c.tail.parsed.unconditional(l) {
			return nil, 0, fmt.Errorf("chain %s policy entry has matches", c.name)
		}
		return c, u + 1, nil
	}
	cname, ok := ents[i].parsed.errorName()
	if !ok {
		return nil, 0, fmt.Errorf("entry %d is outside every chain", i)
	}
	j := i + 1
	for j < len(ents)-1 {
		if _, isHead := ents[j].parsed.errorName(); isHead {
			break
		}
		if _, isHook := hookAt[j]; isHook {
			break
		}
		j++
	}
	if j == i+1 {
		return nil, 0, fmt.Errorf("user chain %s has no RETURN entry", cname)
	}
	return &tchain{name: cname, hook: -1, head: ents[i], rules: slices.Clone(ents[i+1 : j-1]), tail: ents[j-1]}, j, nil
}

// resolveJumps points each entry with a positive standard verdict at the
// user chain it enters, the entry it jumps to, or marks it falling through.
func (t *table) resolveJumps(ents []*tentry, byOff map[int]int) error {
	starts := map[*tentry]string{}
	for _, c := range t.chains {
		if c.hook < 0 {
			starts[c.start()] = c.name
		}
	}
	for _, e := range ents {
		v, ok := e.parsed.stdVerdict()
		if !ok || v < 0 {
			continue
		}
		k, ok := byOff[int(v)]
		if !ok {
			return fmt.Errorf("entry %d jumps to %d, not an entry", e.oldIdx, v)
		}
		if k == e.oldIdx+1 {
			e.fallsThrough = true
		} else if name, ok := starts[ents[k]]; ok {
			e.jumpChain = name
		} else {
			e.jumpTo = ents[k]
		}
	}
	return nil
}

// ours reports whether an entry of a builtin chain is one of our rules.
func ours(e *tentry) bool {
	c, ok := e.parsed.comment()
	return ok && (c == commentTag || strings.HasPrefix(c, commentSetTag))
}

func ourChain(name string) bool { return strings.HasPrefix(name, ourChainPref) }

// ourChains names the user chains of t that nftmesh installed. The ISTIO_
// names are shared with istio-init and hand-written rules, so the name is
// not enough: a chain is ours when every rule in it carries our tag and it
// either holds rules or one of our tagged rules jumps to it.
func (t *table) ourChains() map[string]bool {
	jumped := map[string]bool{}
	for _, c := range t.chains {
		for _, e := range c.rules {
			if e.jumpChain != "" && ours(e) {
				jumped[e.jumpChain] = true
			}
		}
	}
	mine := map[string]bool{}
	for _, c := range t.chains {
		if c.hook >= 0 || !ourChain(c.name) {
			continue
		}
		foreign := slices.ContainsFunc(c.rules, func(e *tentry) bool { return !ours(e) })
		if !foreign && (len(c.rules) > 0 || jumped[c.name]) {
			mine[c.name] = true
		}
	}
	return mine
}

// stripOurs removes our chains and our rules in builtin chains. Chains of
// the same names that are not ours stay. A foreign rule that jumps into one
// of our chains means someone else (istio-init, a hand-written rule) builds
// on our rules; we refuse rather than break their rule.
func (t *table) stripOurs() error {
	mine := t.ourChains()
	var keep []*tchain
	for _, c := range t.chains {
		if c.hook < 0 && mine[c.name] {
			continue
		}
		if c.hook >= 0 {
			c.rules = slices.DeleteFunc(slices.Clone(c.rules), ours)
		}
		keep = append(keep, c)
	}
	for _, c := range keep {
		for _, e := range c.rules {
			if mine[e.jumpChain] {
				return fmt.Errorf("table %s: chain %s has a rule not installed by nftmesh that jumps to %s (iptables rules of another Istio installer?)", t.name, c.name, e.jumpChain)
			}
		}
	}
	t.chains = keep
	return nil
}

// addOurs appends our lowered rules to the builtin chains and adds our user
// chains, keeping user chains sorted by name as libiptc writes them.
func (t *table) addOurs(enc *encoder, x xtable) error {
	for _, xc := range x.chains {
		var rules []*tentry
		for i, r := range xc.rules {
			b, err := enc.entry(r)
			if err != nil {
				return fmt.Errorf("encoding %s rule %d: %w", xc.name, i+1, err)
			}
			e := &tentry{raw: b, oldIdx: -1}
			if j, ok := r.target.(tJump); ok {
				e.jumpChain = j.chain
			}
			rules = append(rules, e)
		}
		if xc.builtin {
			c := t.chain(xc.name)
			if c == nil {
				return fmt.Errorf("table %s has no builtin chain %s", t.name, xc.name)
			}
			c.rules = append(c.rules, rules...)
			continue
		}
		if t.chain(xc.name) != nil {
			return fmt.Errorf("table %s already has a chain %s that nftmesh did not install (iptables rules of another Istio installer?)", t.name, xc.name)
		}
		head := &tentry{raw: append(make([]byte, enc.l.entryLen), errorTarget(xc.name)...), oldIdx: -1}
		setOffsets(enc.l, head.raw, enc.l.entryLen)
		tail := &tentry{raw: append(make([]byte, enc.l.entryLen), stdTarget(verdictReturn)...), oldIdx: -1}
		setOffsets(enc.l, tail.raw, enc.l.entryLen)
		t.chains = append(t.chains, &tchain{name: xc.name, hook: -1, head: head, rules: rules, tail: tail})
	}
	return nil
}

func setOffsets(l *layout, b []byte, targetOff int) {
	hostEndian.PutUint16(b[l.tgtOffOff:], uint16(targetOff))
	hostEndian.PutUint16(b[l.tgtOffOff+2:], uint16(len(b)))
}

// layout orders the chains (builtins by hook, user chains by name), assigns
// offsets, and returns the entries in that order, their blob with jump
// verdicts patched in, and the new hook entry / underflow offsets.
func (t *table) layout() (blob []byte, order []*tentry, hookEntry, underflow [numHooks]uint32, err error) {
	slices.SortStableFunc(t.chains, func(a, b *tchain) int {
		switch {
		case a.hook >= 0 && b.hook >= 0:
			return a.hook - b.hook
		case a.hook >= 0:
			return -1
		case b.hook >= 0:
			return 1
		}
		return strings.Compare(a.name, b.name)
	})
	for _, c := range t.chains {
		if c.head != nil {
			order = append(order, c.head)
		}
		order = append(order, c.rules...)
		order = append(order, c.tail)
	}
	order = append(order, t.end)
	off := 0
	for _, e := range order {
		e.off = off
		off += len(e.raw)
	}
	for _, c := range t.chains {
		if c.hook >= 0 {
			hookEntry[c.hook] = uint32(c.start().off)
			underflow[c.hook] = uint32(c.tail.off)
		}
	}
	blob = make([]byte, 0, off)
	for _, e := range order {
		start := len(blob)
		blob = append(blob, e.raw...)
		var dst *tentry
		switch {
		case e.fallsThrough:
			dst = &tentry{off: e.off + len(e.raw)}
		case e.jumpChain != "":
			c := t.chain(e.jumpChain)
			if c == nil || c.hook >= 0 {
				return nil, nil, hookEntry, underflow, fmt.Errorf("table %s: jump to missing user chain %s", t.name, e.jumpChain)
			}
			dst = c.start()
		case e.jumpTo != nil:
			dst = e.jumpTo
			if !slices.Contains(order, dst) {
				return nil, nil, hookEntry, underflow, fmt.Errorf("table %s: a kept rule jumps into a removed entry", t.name)
			}
		default:
			continue
		}
		to := int(hostEndian.Uint16(e.raw[t.l.tgtOffOff:]))
		hostEndian.PutUint32(blob[start+to+xtMatchHdrLen:], uint32(dst.off))
	}
	return blob, order, hookEntry, underflow, nil
}

// replace writes the table with IPT_SO_SET_REPLACE, passing the number of
// entries we read (the kernel answers EAGAIN if the table changed since),
// then restores the counters of the entries we kept.
func (t *table) replace(fd int) error {
	blob, order, hookEntry, underflow, err := t.layout()
	if err != nil {
		return err
	}
	oldN := int(t.info.numEntries)
	counters := make([]byte, max(oldN, 1)*counterLen)
	b := make([]byte, replaceHdrLen+len(blob))
	copy(b[:xtTableMaxNameLen-1], t.name)
	hostEndian.PutUint32(b[32:], t.info.validHooks)
	hostEndian.PutUint32(b[36:], uint32(len(order)))
	hostEndian.PutUint32(b[40:], uint32(len(blob)))
	for h := 0; h < numHooks; h++ {
		hostEndian.PutUint32(b[44+4*h:], hookEntry[h])
		hostEndian.PutUint32(b[64+4*h:], underflow[h])
	}
	hostEndian.PutUint32(b[84:], uint32(oldN))
	hostEndian.PutUint64(b[88:], uint64(uintptr(unsafe.Pointer(&counters[0]))))
	copy(b[replaceHdrLen:], blob)
	err = setsockopt(fd, t.l.sockLevel, soSetReplace, b)
	runtime.KeepAlive(counters)
	if err != nil {
		if errors.Is(err, unix.EAGAIN) {
			return unix.EAGAIN
		}
		return fmt.Errorf("replacing %s table %s: %w", t.l.fam, t.name, err)
	}
	t.addCounters(fd, order, counters)
	return nil
}

// addCounters gives the entries of order that were kept the packet/byte
// counts old (the replaced table's, by oldIdx) had for them, as libiptc
// does after a replace. Best effort: if another writer replaced the table
// in between, the kernel refuses and the counts start from zero.
func (t *table) addCounters(fd int, order []*tentry, old []byte) {
	b := make([]byte, countersInfoHd+len(order)*counterLen)
	any := false
	for i, e := range order {
		if e.oldIdx >= 0 && (e.oldIdx+1)*counterLen <= len(old) {
			c := old[e.oldIdx*counterLen : (e.oldIdx+1)*counterLen]
			copy(b[countersInfoHd+i*counterLen:], c)
			any = any || !allZero(c)
		}
	}
	if !any {
		return
	}
	copy(b[:xtTableMaxNameLen-1], t.name)
	hostEndian.PutUint32(b[32:], uint32(len(order)))
	_ = setsockopt(fd, t.l.sockLevel, soSetAddCounters, b)
}
