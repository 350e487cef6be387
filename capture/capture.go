// Package capture is the one pipeline between the front ends (the CNI
// plugin, the agent's repair, the `redirect` CLI) and the kernel backends:
// it opens and checks the pod's network namespace, refuses the host's,
// serializes the verbs on one namespace with a per-namespace lock, selects
// the backend, and applies, checks or removes a Plan.
//
// The verbs are methods of a Pipeline over a Kernel: Linux(), or
// testkit/capturetest's in-memory one, which runs every decision of the
// pipeline and the front ends without root. It knows neither Kubernetes
// nor CNI; podinfo and redirect.Build decide what a pod gets.
package capture

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nftmesh/nftmesh/internal/hostns"
	"github.com/nftmesh/nftmesh/internal/phase"
	"github.com/nftmesh/nftmesh/nft"
	"github.com/nftmesh/nftmesh/redirect"
)

// Netns is an opened network namespace whose type has been checked.
type Netns = hostns.Netns

// NotNetnsError is the error for a path that is not a network namespace.
type NotNetnsError = hostns.NotNetnsError

// ErrHostNetns is wrapped by every error that refuses the host's own
// network namespace.
var ErrHostNetns = hostns.ErrOwnNetns

// Open opens the network namespace at path for a verb on a pod's capture,
// without blocking whatever the path names, and refuses the host's (the
// caller's own unless the pipeline allows it, PID 1's, or one registered
// with AddHostNetnsFromProc) however the path reaches it.
func (pl *Pipeline) Open(path string) (*Netns, error) {
	return pl.guard.Check(pl.k.OpenNetns(path))
}

// OpenForReading is Open without the host check, for looking at any
// namespace (`redirect inspect`).
func (pl *Pipeline) OpenForReading(path string) (*Netns, error) { return pl.k.OpenNetns(path) }

// Addrs lists the addresses of the network namespace at path in the
// kernel's order (see Plan).
func (pl *Pipeline) Addrs(path string) ([]netip.Addr, error) { return pl.k.Addrs(path) }

// AllowingOwnNetns returns a copy of pl that, with allow, lets the
// caller's own namespace be programmed (`redirect apply --allow-own-netns`),
// down to the backends' own checks; PID 1's and registered host namespaces
// stay refused.
func (pl *Pipeline) AllowingOwnNetns(allow bool) *Pipeline {
	cp := *pl
	cp.guard.AllowOwn = allow
	return &cp
}

// AddHostNetnsFromProc registers the host's namespace seen through the
// host's /proc at procDir: PID 1's, or else the nearest ancestor's outside
// this process's own namespace (the runtime's shim); it returns the path.
func AddHostNetnsFromProc(procDir string) (string, error) { return hostns.AddHostFromProc(procDir) }

// Options are what every verb needs besides the namespace.
type Options struct {
	// Backend is auto (the default when empty), nftables or iptables-legacy.
	Backend string
	// RunDir holds the per-namespace lock files: runs serialize only with
	// runs of the same run dir. Empty: see lockDir.
	RunDir string
	// Locked, when set, is called once the namespace's lock is held,
	// before anything there is written, and read but for Remove's first
	// look (see nothingToRemove: a Remove with nothing to do takes no
	// lock and does not call it; see cmd/redirect's holdInterrupt).
	Locked func()
	// RefuseForeign makes Apply refuse, with a *ForeignError and nothing
	// written, a namespace that holds another installer's capture (see
	// Foreign), looked for under the lock through the visit that writes.
	RefuseForeign bool
	// ApplyTimeout, when set, bounds an Apply (Add's included): a wedged
	// netlink socket must not hang the caller.
	ApplyTimeout time.Duration
}

func (o Options) backend() string { return cmp.Or(o.Backend, Auto) }

// refuse refuses a bad backend name and the host's n: the start of every
// verb that writes.
func (pl *Pipeline) refuse(n *Netns, o Options) error {
	if err := ValidateBackend(o.backend()); err != nil {
		return err
	}
	return pl.guard.Refuse(n)
}

// lock refuses what refuse refuses and takes n's lock with take (lockNetns,
// or lockForRemoval).
func (pl *Pipeline) lock(ctx context.Context, n *Netns, o Options, take func(context.Context, string, *Netns, string) (*netnsLock, error)) (*netnsLock, error) {
	if err := pl.refuse(n, o); err != nil {
		return nil, err
	}
	lk, err := take(ctx, o.RunDir, n, n.Path)
	if err == nil && o.Locked != nil {
		o.Locked()
	}
	return lk, err
}

// pin returns a path that names exactly n, its descriptor's magic link in
// /proc/self/fd, so the backends, which open by path, program the
// namespace that was checked and locked, not whatever n.Path names by then
// (a PID reused, a bind mount swapped). Where /proc/self does not lead
// back to n, n.Path.
func pin(n *Netns) string {
	p := "/proc/self/fd/" + strconv.Itoa(n.Fd())
	var st unix.Stat_t
	if unix.Stat(p, &st) != nil || st.Dev != n.ID.Dev || st.Ino != n.ID.Ino {
		return n.Path
	}
	return p
}

// pinnedError shows n.Path where a backend's error names the pinned one.
type pinnedError struct {
	err          error
	pinned, path string
}

func (e *pinnedError) Error() string { return strings.ReplaceAll(e.err.Error(), e.pinned, e.path) }
func (e *pinnedError) Unwrap() error { return e.err }

func unpin(err error, pinned string, n *Netns) error {
	if err == nil || pinned == n.Path {
		return err
	}
	return &pinnedError{err: err, pinned: pinned, path: n.Path}
}

// Applied is what Apply did.
type Applied struct {
	Backend string // the backend's name
	Why     string // why it was chosen
	Rules   int    // rules in the plan
}

// cleanupTimeout bounds the clean-up after a failed Apply, which may run
// after the verb's own context expired.
const cleanupTimeout = 5 * time.Second

// Apply programs p into n with the selected backend, under n's lock. When
// nftmesh had nothing there before, a failure is followed by a Remove;
// rules an earlier run installed are never removed by a failed Apply
// (another run's success must not be undone). An error after which the
// namespace is as it was says so (Untouched).
func (pl *Pipeline) Apply(ctx context.Context, n *Netns, p redirect.Plan, o Options) (_ Applied, err error) {
	untouched := true
	defer func() {
		if err != nil && untouched {
			err = &untouchedError{err}
		}
	}()
	if o.ApplyTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.ApplyTimeout)
		defer cancel()
	}
	var prep Prepared
	if b := o.backend(); b == Auto || b == NFTables {
		prep = pl.k.Prepare(p)
	}
	lk, err := pl.lock(ctx, n, o, lockNetns)
	if err != nil {
		return Applied{}, err
	}
	defer lk.unlock(false)
	phase.Mark("locked")
	path := pin(n)
	v, err := pl.k.Enter(n, path, prep, pl.guard)
	if err != nil {
		return Applied{}, unpin(err, path, n)
	}
	defer v.Close()
	phase.Mark("entered")
	if o.RefuseForeign {
		found, err := pl.foreignIn(v, path, n)
		if err != nil {
			return Applied{}, err
		}
		if len(found) > 0 {
			return Applied{}, &ForeignError{Netns: n.Path, Found: found}
		}
	}
	sel, err := pl.choose(ctx, o.backend(), v, path)
	if err != nil {
		return Applied{}, unpin(err, path, n)
	}
	phase.Mark("chosen")
	res := Applied{Backend: sel.backend.Name(), Why: sel.why, Rules: RuleCount(p)}
	untouched = false
	if err := sel.backend.Apply(ctx, path, p); err != nil {
		if !sel.oursWas {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
			defer cancel()
			rerr := sel.backend.Remove(cctx, path)
			if rerr != nil {
				err = errors.Join(err, fmt.Errorf("cleaning up after the failure: %w", rerr))
			}
			// Nothing of ours was there, and nothing is now.
			untouched = rerr == nil
		}
		return res, unpin(err, path, n)
	}
	return res, nil
}

// Untouched reports whether err, from a failed Apply (or Add's apply
// step), left the namespace as it was: Apply failed before the backend
// wrote anything, or nftmesh had nothing there and the clean-up after the
// failed write removed what it left. The same call can then run again from
// scratch elsewhere (the agent declines it to the standalone plugin).
// After a failed write over an earlier run's rules it is false: the
// backends put those back when they can, but cannot always say so.
func Untouched(err error) bool {
	var u *untouchedError
	return errors.As(err, &u)
}

// untouchedError marks an Apply error after which the namespace is as it
// was; its text is the error's.
type untouchedError struct{ err error }

func (e *untouchedError) Error() string { return e.err.Error() }
func (e *untouchedError) Unwrap() error { return e.err }

// Check compares what n holds with p using the selected backend, under n's
// lock; a difference is a *redirect.DriftError. It returns the backend's
// name.
func (pl *Pipeline) Check(ctx context.Context, n *Netns, p redirect.Plan, o Options) (string, error) {
	lk, err := pl.lock(ctx, n, o, lockNetns)
	if err != nil {
		return "", err
	}
	defer lk.unlock(false)
	path := pin(n)
	v, err := pl.k.Enter(n, path, nil, pl.guard)
	if err != nil {
		return "", unpin(err, path, n)
	}
	defer v.Close()
	sel, err := pl.choose(ctx, o.backend(), v, path)
	if err != nil {
		return "", unpin(err, path, n)
	}
	err = sel.backend.Check(ctx, path, p)
	// Callers show the drift's lines, not only its Error().
	if d := (*redirect.DriftError)(nil); path != n.Path && errors.As(err, &d) {
		for i, l := range d.Lines {
			d.Lines[i] = strings.ReplaceAll(l, path, n.Path)
		}
	}
	return sel.backend.Name(), unpin(err, path, n)
}

// List returns what the selected backend finds of ours in n (any namespace,
// the host's included: it only reads) and the backend's name.
func (pl *Pipeline) List(ctx context.Context, n *Netns, o Options) (redirect.Plan, string, error) {
	path := pin(n)
	v, err := pl.k.Enter(n, path, nil, pl.guard)
	if err != nil {
		return redirect.Plan{}, "", unpin(err, path, n)
	}
	defer v.Close()
	sel, err := pl.choose(ctx, o.backend(), v, path)
	if err != nil {
		return redirect.Plan{}, "", unpin(err, path, n)
	}
	p, err := sel.backend.List(ctx, path)
	return p, sel.backend.Name(), unpin(err, path, n)
}

// Removed is what Remove took out of one backend.
type Removed struct {
	Backend string   // nftables, iptables-legacy, or "routes" for the shared part
	What    []string // e.g. "table inet nftmesh (12 rules in 5 chains, 3 sets)"
	// Unread, when set, is why what was there could not be read before it
	// was removed by name: What then names only what went.
	Unread string
}

// Removal is what Remove did; empty when there was nothing of ours.
type Removal []Removed

// String says what was removed from which backend, or "nothing to remove".
func (r Removal) String() string {
	if len(r) == 0 {
		return "nothing to remove"
	}
	parts := make([]string, len(r))
	for i, x := range r {
		parts[i] = x.Backend + ": " + strings.Join(x.What, ", ")
		if x.Unread != "" {
			parts[i] += " (removed unread: " + x.Unread + ")"
		}
	}
	return "removed " + strings.Join(parts, "; ")
}

// Remove deletes nftmesh's rules from n, under its lock: with backend auto
// from every backend that holds them, else from the named one; then the
// TPROXY policy routes and ::6. Foreign rules stay. Nothing of ours there
// is success with an empty Removal, and nothing is written, the run dir
// included (see nothingToRemove). On a full or read-only run dir the lock
// is taken another way (see lockForRemoval): a pod's sandbox must go.
func (pl *Pipeline) Remove(ctx context.Context, n *Netns, o Options) (Removal, error) {
	if err := pl.refuse(n, o); err != nil {
		return nil, err
	}
	if pl.nothingToRemove(ctx, n, o.RunDir) {
		return nil, nil
	}
	lk, err := pl.lock(ctx, n, o, lockForRemoval)
	if err != nil {
		return nil, err
	}
	removed := false
	defer func() { lk.unlock(removed) }()
	path := pin(n)
	v, err := pl.k.Enter(n, path, nil, pl.guard)
	if err != nil {
		return nil, unpin(err, path, n)
	}
	defer v.Close()
	var bs []redirect.Backend
	switch o.backend() {
	case NFTables, Legacy:
		bs = []redirect.Backend{v.Backend(o.backend())}
	default:
		bs = []redirect.Backend{v.Backend(NFTables)}
		// Legacy only where its tables hold ours and the kernel has
		// legacy x_tables.
		pr, err := v.LegacyPresence()
		if err != nil {
			return nil, unpin(fmt.Errorf("looking for legacy rules to remove: %w", err), path, n)
		}
		if pr.Ours && pl.k.LegacyAvailable() == nil {
			bs = append(bs, v.Backend(Legacy))
		}
	}
	out, err := remove(ctx, bs, path)
	for i := range out {
		if out[i].Unread != "" && path != n.Path {
			out[i].Unread = strings.ReplaceAll(out[i].Unread, path, n.Path)
		}
	}
	if err != nil {
		return out, unpin(err, path, n)
	}
	removed = true
	return out, nil
}

// nothingToRemove looks at n without its lock, writing nothing (the run
// dir may be full: DEL of every pod nftmesh never captured, and every
// repeated DEL, must pass there): true when no backend holds anything of
// ours in n and n's lock file does not exist in runDir, looked for after
// the namespace. A verb holding the lock (it made the file) may be about
// to write: the removal then waits for it, as it would have. Any doubt (an
// error) is false: the removal under the lock decides.
func (pl *Pipeline) nothingToRemove(ctx context.Context, n *Netns, runDir string) bool {
	path := pin(n)
	v, err := pl.k.Enter(n, path, nil, pl.guard)
	if err != nil {
		return false
	}
	defer v.Close()
	if ours, _, err := v.NFTPresence(); err != nil || ours {
		return false
	}
	if pr, err := v.LegacyPresence(); err != nil || pr.Ours {
		return false
	}
	// The table is not there: this reads the routes and ::6.
	live, err := v.Backend(NFTables).List(ctx, path)
	if err != nil || len(live.Tables) > 0 || len(live.Sets) > 0 || len(ourRoutes(live)) > 0 {
		return false
	}
	return !lockFileExists(runDir, n)
}

func remove(ctx context.Context, bs []redirect.Backend, path string) (Removal, error) {
	var out Removal
	var routes []string
	var remover redirect.Backend
	for i, b := range bs {
		live, err := b.List(ctx, path)
		if err != nil {
			// What cannot be read (a counter someone added to our
			// table) is ours all the same, and a DEL that fails on it
			// would keep the pod Terminating for good: Remove deletes by
			// name, without reading. The listing error goes with it.
			if rerr := b.Remove(ctx, path); rerr != nil {
				return out, errors.Join(fmt.Errorf("listing %s rules before removing them: %w", b.Name(), err),
					fmt.Errorf("removing %s rules without listing them: %w", b.Name(), rerr))
			}
			remover = b
			out = append(out, Removed{Backend: b.Name(), What: []string{unreadRules(b.Name())}, Unread: err.Error()})
			continue
		}
		if i == 0 {
			// Every backend lists routes and ::6: take the first
			// listing, before anything is removed.
			routes = ourRoutes(live)
		}
		if len(live.Tables) == 0 && len(live.Sets) == 0 {
			continue
		}
		if err := b.Remove(ctx, path); err != nil {
			return out, fmt.Errorf("removing %s rules: %w", b.Name(), err)
		}
		remover = b
		out = append(out, Removed{Backend: b.Name(), What: []string{describeRules(b.Name(), live)}})
	}
	if len(routes) > 0 {
		// A backend's Remove takes the routes too; left-overs without
		// rules still need one.
		if remover == nil {
			if err := bs[0].Remove(ctx, path); err != nil {
				return out, fmt.Errorf("removing policy routes: %w", err)
			}
		}
		out = append(out, Removed{Backend: "routes", What: routes})
	}
	return out, nil
}

// ourRoutes names our TPROXY policy routes and passthrough address in a
// listed plan.
func ourRoutes(p redirect.Plan) []string {
	var out []string
	for _, r := range p.Routes {
		if r.Mark == redirect.TProxyMark && r.Table == redirect.TProxyRouteTab {
			out = append(out, fmt.Sprintf("ip rule fwmark %d lookup %d (%s)", r.Mark, r.Table, r.Family))
		}
	}
	if slices.Contains(p.LoopbackAddrs, redirect.InboundPassthroughV6) {
		out = append(out, redirect.InboundPassthroughV6.Addr().String()+" on lo")
	}
	return out
}

// unreadRules names what a backend's Remove deletes by name.
func unreadRules(backend string) string {
	if backend == NFTables {
		return "table inet " + nft.TableName + " and our policy routes"
	}
	return "our chains and tagged rules, and our policy routes"
}

func describeRules(backend string, p redirect.Plan) string {
	chains, tables := 0, make([]string, 0, len(p.Tables))
	for _, t := range p.Tables {
		chains += len(t.Chains)
		tables = append(tables, string(t.Name))
	}
	s := count(RuleCount(p), "rule") + " in " + count(chains, "chain")
	if len(p.Sets) > 0 {
		s += ", " + count(len(p.Sets), "set")
	}
	if backend == NFTables {
		return "table inet " + nft.TableName + " (" + s + ")"
	}
	return s + " (tables " + strings.Join(slices.Compact(slices.Sorted(slices.Values(tables))), ", ") + ")"
}

// count is "1 rule", "2 rules": redirect clean prints it.
func count(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// RuleCount is the number of rules in a plan.
func RuleCount(p redirect.Plan) int {
	n := 0
	for _, t := range p.Tables {
		for _, c := range t.Chains {
			n += len(c.Rules)
		}
	}
	return n
}
