package iptables

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/nftmesh/nftmesh/internal/hostns"
	"github.com/nftmesh/nftmesh/redirect"
)

// Backend installs Plans into legacy x_tables (iptables-legacy /
// ip6tables-legacy tables nat, mangle, raw) of a network namespace.
type Backend struct {
	mu   sync.Mutex
	revs map[redirect.Family]map[string]uint8
	// guard is the host check of Apply and Remove (see WithGuard).
	guard hostns.Guard
}

// Option configures a Backend.
type Option func(*Backend)

// WithGuard makes Apply and Remove refuse what g refuses instead of every
// namespace of the host's (the zero hostns.Guard): `redirect apply
// --allow-own-netns` lets the CLI's own namespace through.
func WithGuard(g hostns.Guard) Option { return func(b *Backend) { b.guard = g } }

// New returns the iptables-legacy backend.
func New(opts ...Option) *Backend {
	b := &Backend{revs: map[redirect.Family]map[string]uint8{}}
	for _, o := range opts {
		o(b)
	}
	return b
}

// Name implements redirect.Backend.
func (b *Backend) Name() string { return redirect.BackendLegacy }

var allFamilies = []redirect.Family{redirect.FamilyIPv4, redirect.FamilyIPv6}

// ourTables are the tables a Plan may use, in the order we write them: the
// kernel lists tables newest first, so writing raw, nat, mangle into a fresh
// namespace makes iptables-save print mangle, nat, raw, as Render does.
var ourTables = []string{"raw", "nat", "mangle"}

var readOrder = []string{"mangle", "nat", "raw"}

// maxAttempts bounds the re-read/re-write loop when another writer changes
// a table between our read and our replace (EAGAIN).
const maxAttempts = 50

func (b *Backend) encoder(fd int, fam redirect.Family) *encoder {
	b.mu.Lock()
	defer b.mu.Unlock()
	l := layoutFor(fam)
	r, ok := b.revs[fam]
	if !ok {
		r = chooseRevisions(fd, l)
		b.revs[fam] = r
	}
	return &encoder{l: l, revs: r}
}

// Apply implements redirect.Backend: each table is replaced whole, keeping
// every entry that is not ours (see rewrite, which rolls back on failure).
func (b *Backend) Apply(ctx context.Context, netns string, p redirect.Plan) error {
	if err := p.Verify(); err != nil {
		return fmt.Errorf("applying plan to netns %s: %w", netns, err)
	}
	if err := sharedPolicies(p); err != nil {
		return fmt.Errorf("applying plan to netns %s: %w", netns, err)
	}
	want := map[redirect.Family]map[string]xtable{}
	for _, fam := range allFamilies {
		xs, err := lowerPlan(p, fam)
		if err != nil {
			return fmt.Errorf("applying plan to netns %s: %w", netns, err)
		}
		want[fam] = map[string]xtable{}
		for _, x := range xs {
			want[fam][x.name] = x
		}
	}
	if err := b.rewrite(ctx, netns, want, true, func(s *Sockets) error { return applyRoutes(b.guard, s, p) }); err != nil {
		return fmt.Errorf("applying plan to netns %s: %w", netns, err)
	}
	return nil
}

// rewrite replaces our part of each legacy table of netns with want's (if
// any), then runs after, all under the xtables lock. With rollback, a
// failure writes back the tables already replaced.
func (b *Backend) rewrite(ctx context.Context, netns string, want map[redirect.Family]map[string]xtable, rollback bool, after func(*Sockets) error) error {
	s, err := openSockets(netns, allFamilies, &b.guard)
	if err != nil {
		return err
	}
	defer s.Close()
	release, err := xtablesLock(ctx)
	if err != nil {
		return err
	}
	defer release()
	var undo []func() error
	fail := func(err error) error {
		for i := len(undo) - 1; rollback && i >= 0; i-- {
			if uerr := undo[i](); uerr != nil {
				err = errors.Join(err, fmt.Errorf("restoring earlier table: %w", uerr))
			}
		}
		return err
	}
	for _, fam := range allFamilies {
		fd := s.fd[fam]
		for _, name := range ourTables {
			x, wanted := want[fam][name]
			if !wanted && !s.tables[fam][name] {
				continue // never instantiate a table we have nothing for
			}
			restore, err := updateTable(ctx, fd, layoutFor(fam), name, func(t *table) error {
				if err := t.stripOurs(); err != nil {
					return err
				}
				if wanted {
					return t.addOurs(b.encoder(fd, fam), x)
				}
				return nil
			})
			if err != nil {
				return fail(err)
			}
			if restore != nil {
				undo = append(undo, restore)
			}
		}
	}
	if err := after(s); err != nil {
		return fail(err)
	}
	return nil
}

// updateTable reads a table, lets edit change it, and writes it back unless
// it is unchanged, retrying from the read when the kernel says the table
// changed in between. It returns a function that writes the original back.
func updateTable(ctx context.Context, fd int, l *layout, name string, edit func(*table) error) (func() error, error) {
	for attempt := 1; ; attempt++ {
		orig, err := readTable(fd, l, name)
		if err == nil {
			t := orig.clone()
			if err = edit(t); err != nil {
				return nil, fmt.Errorf("%s table %s: %w", l.fam, name, err)
			}
			var same bool
			if same, err = sameTable(orig, t); err == nil && same {
				return nil, nil
			}
			if err == nil {
				err = t.replace(fd)
			}
			if err == nil {
				return func() error { return writeBack(ctx, fd, l, name, orig) }, nil
			}
		}
		if !errors.Is(err, unix.EAGAIN) || attempt == maxAttempts {
			return nil, err
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%s table %s kept changing: %w", l.fam, name, ctx.Err())
		}
	}
}

// clone returns a copy of t whose chains and entries can be edited without
// touching t (entry bytes are shared; nothing edits them).
func (t *table) clone() *table {
	m := map[*tentry]*tentry{}
	cp := func(e *tentry) *tentry {
		if e == nil {
			return nil
		}
		if c, ok := m[e]; ok {
			return c
		}
		c := *e
		m[e] = &c
		return &c
	}
	nt := &table{name: t.name, l: t.l, info: t.info}
	for _, c := range t.chains {
		nc := &tchain{name: c.name, hook: c.hook, head: cp(c.head), tail: cp(c.tail)}
		for _, e := range c.rules {
			nc.rules = append(nc.rules, cp(e))
		}
		nt.chains = append(nt.chains, nc)
	}
	nt.end = cp(t.end)
	for _, c := range m {
		if c.jumpTo != nil {
			c.jumpTo = cp(c.jumpTo)
		}
	}
	return nt
}

// sameTable compares the entries that would be written with those read,
// ignoring what the kernel fills in (comefrom, counters).
func sameTable(a, b *table) (bool, error) {
	ab, ao, ah, au, err := a.layout()
	if err != nil {
		return false, err
	}
	bb, bo, bh, bu, err := b.layout()
	if err != nil {
		return false, err
	}
	if len(ao) != len(bo) || ah != bh || au != bu || len(ab) != len(bb) {
		return false, nil
	}
	return bytes.Equal(scrub(a.l, ab), scrub(b.l, bb)), nil
}

func scrub(l *layout, blob []byte) []byte {
	out := bytes.Clone(blob)
	for off := 0; off < len(out); {
		next := int(hostEndian.Uint16(out[off+l.tgtOffOff+2:]))
		clear(out[off+l.comeOff : off+l.entryLen])
		off += next
	}
	return out
}

// writeBack replaces a table with the entries of an earlier read of it.
func writeBack(ctx context.Context, fd int, l *layout, name string, orig *table) error {
	_, err := updateTable(ctx, fd, l, name, func(t *table) error {
		t.chains, t.end = orig.chains, orig.end
		for _, c := range t.chains {
			for _, e := range append(append([]*tentry{c.head, c.tail}, c.rules...), orig.end) {
				if e != nil {
					e.oldIdx = -1 // counters of the replaced table no longer line up
				}
			}
		}
		return nil
	})
	return err
}

// List implements redirect.Backend: our chains and tagged rules, decoded
// back into a canonical Plan (see Canonical), with the policy routes and
// loopback addresses.
func (b *Backend) List(ctx context.Context, netns string) (redirect.Plan, error) {
	s, err := openSockets(netns, allFamilies, nil)
	if err != nil {
		return redirect.Plan{}, fmt.Errorf("listing rules in netns %s: %w", netns, err)
	}
	defer s.Close()
	byFam := map[redirect.Family][]decodedTable{}
	for _, fam := range allFamilies {
		l := layoutFor(fam)
		for _, name := range readOrder {
			if !s.tables[fam][name] {
				continue
			}
			t, err := readTableRetry(s.fd[fam], l, name)
			if err != nil {
				return redirect.Plan{}, fmt.Errorf("listing rules in netns %s: %w", netns, err)
			}
			dt, err := t.decodeOurs()
			if err != nil {
				return redirect.Plan{}, fmt.Errorf("listing rules in netns %s: %s table %s: %w", netns, fam, name, redirect.Unreadable(err))
			}
			byFam[fam] = append(byFam[fam], dt)
		}
	}
	p, err := raise(byFam)
	if err != nil {
		// Our rules, decoded, that do not form what nftmesh writes.
		return p, fmt.Errorf("listing rules in netns %s: %w", netns, redirect.Unreadable(err))
	}
	if p.Routes, p.LoopbackAddrs, err = listRoutes(s); err != nil {
		return p, fmt.Errorf("listing rules in netns %s: %w", netns, err)
	}
	return p, nil
}

// decodeOurs decodes our rules of builtin chains and our user chains.
func (t *table) decodeOurs() (decodedTable, error) {
	dt := decodedTable{name: t.name}
	mine := t.ourChains()
	for _, c := range t.chains {
		if c.hook < 0 && !mine[c.name] {
			continue
		}
		xc := xchain{name: c.name, builtin: c.hook >= 0}
		if xc.builtin {
			var err error
			if xc.policy, err = chainPolicy(c); err != nil {
				return dt, err
			}
		}
		for i, e := range c.rules {
			if c.hook >= 0 && !ours(e) {
				continue
			}
			r, err := decodeRule(t.l, e.parsed)
			if err != nil {
				return dt, fmt.Errorf("chain %s rule %d: %w", c.name, i+1, err)
			}
			if _, ok := r.target.(tJump); ok {
				if e.jumpChain == "" {
					return dt, fmt.Errorf("chain %s rule %d jumps into the middle of a chain", c.name, i+1)
				}
				r.target = tJump{chain: e.jumpChain}
			}
			xc.rules = append(xc.rules, r)
		}
		dt.chains = append(dt.chains, xc)
	}
	return dt, nil
}

// sharedPolicies refuses a plan that sets a builtin chain's policy: the
// chain is shared with every other user of the table, and its policy is
// its owner's (List reads it, Render prints it, Apply leaves it).
func sharedPolicies(p redirect.Plan) error {
	for _, t := range p.Tables {
		for _, c := range t.Chains {
			if c.Policy != redirect.PolicyAccept {
				return fmt.Errorf("%s/%s: policy %s: nftmesh leaves builtin chains' policies to their owners", t.Name, c.Name, c.Policy)
			}
		}
	}
	return nil
}

// chainPolicy reads a builtin chain's policy entry.
func chainPolicy(c *tchain) (redirect.ChainPolicy, error) {
	switch v, _ := c.tail.parsed.stdVerdict(); v {
	case verdictAccept:
		return redirect.PolicyAccept, nil
	case verdictDrop:
		return redirect.PolicyDrop, nil
	}
	return 0, fmt.Errorf("chain %s: policy entry is neither ACCEPT nor DROP", c.name)
}

// Check implements redirect.Backend: List compared with the canonical
// form of p (redirect.CheckAgainst on Canonical(p)), and the foreign rules
// placed before ours that can end a builtin chain (see aheadOfOurs), each
// a drift line.
func (b *Backend) Check(ctx context.Context, netns string, p redirect.Plan) error {
	err := redirect.CheckAgainst(ctx, b, netns, Canonical(p))
	var drift *redirect.DriftError
	if err != nil && !errors.As(err, &drift) {
		return err
	}
	ahead, aerr := aheadOfOursIn(ctx, netns)
	if aerr != nil {
		return errors.Join(err, fmt.Errorf("reading the rules before nftmesh's in netns %s: %w", netns, aerr))
	}
	if len(ahead) == 0 {
		return err
	}
	if drift == nil {
		drift = &redirect.DriftError{}
	}
	drift.Lines = append(drift.Lines, ahead...)
	return drift
}

// Remove implements redirect.Backend: our chains, our rules in builtin
// chains, our policy routes and loopback address go; foreign entries stay.
// A table that does not exist is left uninstantiated.
func (b *Backend) Remove(ctx context.Context, netns string) error {
	if err := b.rewrite(ctx, netns, nil, false, func(s *Sockets) error { return removeRoutes(b.guard, s) }); err != nil {
		return fmt.Errorf("removing rules from netns %s: %w", netns, err)
	}
	return nil
}

var _ redirect.Backend = (*Backend)(nil)
