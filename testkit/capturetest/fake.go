// Package capturetest is an in-memory kernel for the capture pipeline, so
// the pipeline and its front ends (the CNI verbs, the repair, the CLI) are
// tested without root: network namespaces are names in a map, each with the
// plan each backend holds, the shared policy routes and ::6, and the
// foreign state that backend selection reads. Its backends implement
// redirect.Backend with the real backends' contract; Dump shows what a
// namespace holds as the renderers' text (`nft -f` and iptables-save
// syntax), as `nft list ruleset` would.
//
// Faults make each verb fail on demand (FailApply, FailList, FailRemove,
// and below the backends FailKernel) and Tamper changes what a namespace holds behind the pipeline's back, so
// CHECK sees drift.
//
// The real backends stay proven by the kernel tests; this package proves
// the decisions above them. Production code never imports it.
package capturetest

import (
	"context"
	"fmt"
	"io/fs"
	"net/netip"
	"slices"
	"strings"
	"sync"

	"github.com/nftmesh/nftmesh/capture"
	"github.com/nftmesh/nftmesh/internal/hostns"
	"github.com/nftmesh/nftmesh/redirect"
)

// Fake is an in-memory kernel. The zero value is not usable; use New.
type Fake struct {
	mu     sync.Mutex
	netns  map[string]*Netns
	nextID uint64
	// legacyErr is LegacyAvailable's answer; legacyProbes counts the calls.
	legacyErr    error
	legacyProbes int
	faults       []fault
	blocks       []*block
	calls        []string
	enters       int
}

// block holds one call of op on backend until released.
type block struct {
	op, backend string
	entered     chan struct{}
	release     chan struct{}
}

// Netns is one namespace of the fake kernel. Tests change its fields
// through the Fake's methods; reading them is for assertions.
type Netns struct {
	id    hostns.ID
	addrs []netip.Addr
	// tables holds each backend's tables and sets (only Tables and Sets
	// are used); routes and ::6 are shared by both, as in the kernel.
	tables   map[string]redirect.Plan
	routes   []redirect.PolicyRoute
	loopback []netip.Prefix
	// What selection and CHECK read besides our own rules.
	foreignUserns   bool
	iptablesNFT     bool
	legacyNatRules  bool
	legacyForeign   []string
	nftablesForeign []string
}

type fault struct {
	op, backend string
	err         error
	// partial: a failing Apply leaves the plan installed, as a writer the
	// kernel took half of would.
	partial bool
}

// Operation names for Calls and the faults.
const (
	OpApply  = "apply"
	OpList   = "list"
	OpRemove = "remove"
	// The kernel's own steps, for FailKernel.
	OpOpen  = "open"  // OpenNetns
	OpAddrs = "addrs" // Addrs
	OpEnter = "enter" // Enter
)

// New returns an empty fake kernel with legacy x_tables available.
func New() *Fake {
	return &Fake{netns: map[string]*Netns{}, nextID: 1}
}

// Pipeline is the capture pipeline over f.
func (f *Fake) Pipeline() *capture.Pipeline { return capture.New(f) }

// AddNetns creates a namespace at path with the given addresses (in the
// order the kernel would list them).
func (f *Fake) AddNetns(path string, addrs ...netip.Addr) {
	f.mu.Lock()
	defer f.mu.Unlock()
	// Device 0 is no nsfs device: a fake identity never equals a real one.
	f.netns[path] = &Netns{id: hostns.ID{Dev: 0, Ino: f.nextID}, addrs: addrs, tables: map[string]redirect.Plan{}}
	f.nextID++
}

// AddHostNetns makes path name this process's own network namespace, by
// its real identity: the pipeline's host guard must refuse it.
func (f *Fake) AddHostNetns(path string) error {
	self, err := hostns.Open("/proc/thread-self/ns/net")
	if err != nil {
		return fmt.Errorf("reading this process's network namespace: %w", err)
	}
	self.Close()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.netns[path] = &Netns{id: self.ID, tables: map[string]redirect.Plan{}}
	return nil
}

// DeleteNetns makes path name nothing, as after the pod's sandbox is gone.
func (f *Fake) DeleteNetns(path string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.netns, path)
}

// SetLegacyAvailable says whether the kernel has legacy x_tables; without,
// LegacyAvailable returns err.
func (f *Fake) SetLegacyAvailable(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.legacyErr = err
}

// Foreign is what other tools hold in a namespace.
type Foreign struct {
	// UserNamespaced: owned by another user namespace (hostUsers: false).
	UserNamespaced bool
	// IptablesNFT: ip/ip6 nat or mangle tables exist (iptables-nft).
	IptablesNFT bool
	// LegacyNatRules: the legacy nat or mangle tables hold rules.
	LegacyNatRules bool
	// LegacyChains and NFTables name another installer's capture, as
	// capture.Foreign lists them ("ipv4 nat ISTIO_OUTPUT", "nftables
	// table inet istio-proxy-nat").
	LegacyChains, NFTables []string
}

// SetForeign sets what other tools hold in the namespace at path.
func (f *Fake) SetForeign(path string, fr Foreign) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := f.must(path)
	n.foreignUserns, n.iptablesNFT, n.legacyNatRules = fr.UserNamespaced, fr.IptablesNFT, fr.LegacyNatRules
	n.legacyForeign, n.nftablesForeign = slices.Clone(fr.LegacyChains), slices.Clone(fr.NFTables)
}

// Install puts p into the namespace at path as backend would have
// installed it, without going through the pipeline (an earlier run's
// rules).
func (f *Fake) Install(path, backend string, p redirect.Plan) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.install(f.must(path), backend, p)
}

// Tamper changes what backend holds in the namespace at path (routes and
// ::6 included), as someone editing the rules by hand would.
func (f *Fake) Tamper(path, backend string, change func(*redirect.Plan)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := f.must(path)
	p := n.plan(backend)
	change(&p)
	f.install(n, backend, p)
	if len(p.Tables) == 0 && len(p.Sets) == 0 {
		delete(n.tables, backend)
	}
}

// FailApply makes every later Apply of backend ("" for either) fail with
// err; with partial the plan is installed all the same, as a kernel that
// took part of a write would leave it.
func (f *Fake) FailApply(backend string, err error, partial bool) {
	f.addFault(fault{op: OpApply, backend: backend, err: err, partial: partial})
}

// FailKernel makes every later call of the kernel's op (OpOpen, OpAddrs,
// OpEnter) fail with err, as a process out of descriptors or memory sees
// it: before anything is read or written.
func (f *Fake) FailKernel(op string, err error) {
	f.addFault(fault{op: op, err: err})
}

// kernelFault is the fault of the kernel's op, under f.mu.
func (f *Fake) kernelFault(op string) error {
	if ft := f.fault(op, ""); ft != nil {
		return ft.err
	}
	return nil
}

// FailList makes every later List (and Check) of backend fail with err.
func (f *Fake) FailList(backend string, err error) {
	f.addFault(fault{op: OpList, backend: backend, err: err})
}

// FailRemove makes every later Remove of backend fail with err.
func (f *Fake) FailRemove(backend string, err error) {
	f.addFault(fault{op: OpRemove, backend: backend, err: err})
}

// Block makes the next call of op on backend ("" for either) wait until
// release is called or its context ends; entered is closed once the call
// waits. It shows what runs while a verb is inside a backend (the lock's
// work).
func (f *Fake) Block(op, backend string) (entered <-chan struct{}, release func()) {
	b := &block{op: op, backend: backend, entered: make(chan struct{}), release: make(chan struct{})}
	f.mu.Lock()
	f.blocks = append(f.blocks, b)
	f.mu.Unlock()
	var once sync.Once
	return b.entered, func() { once.Do(func() { close(b.release) }) }
}

// wait holds a call that a Block names, outside f.mu.
func (f *Fake) wait(ctx context.Context, op, backend string) error {
	f.mu.Lock()
	var b *block
	for i, x := range f.blocks {
		if x.op == op && (x.backend == "" || x.backend == backend) {
			b = x
			f.blocks = slices.Delete(f.blocks, i, i+1)
			break
		}
	}
	f.mu.Unlock()
	if b == nil {
		return nil
	}
	close(b.entered)
	select {
	case <-b.release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Heal drops every fault.
func (f *Fake) Heal() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.faults = nil
}

func (f *Fake) addFault(ft fault) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.faults = append(f.faults, ft)
}

func (f *Fake) fault(op, backend string) *fault {
	for i := range f.faults {
		if ft := &f.faults[i]; ft.op == op && (ft.backend == "" || ft.backend == backend) {
			return ft
		}
	}
	return nil
}

// Calls lists the backend calls made so far, as "<op> <backend> <path>".
func (f *Fake) Calls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

// Holds returns what backend holds in the namespace at path (its tables
// and sets, the shared routes and ::6), as its List would.
func (f *Fake) Holds(path, backend string) redirect.Plan {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := f.netns[path]
	if n == nil {
		return redirect.Plan{}
	}
	return n.plan(backend)
}

// Backends names the backends that hold tables or sets in the namespace
// at path, nftables first.
func (f *Fake) Backends(path string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	if n := f.netns[path]; n != nil {
		for _, b := range []string{capture.NFTables, capture.Legacy} {
			if _, ok := n.tables[b]; ok {
				out = append(out, b)
			}
		}
	}
	return out
}

// Dump is what the namespace at path holds, as the renderers write it: the
// nftables backend's table in `nft -f` syntax (routes and ::6 as its
// comments), the iptables-legacy backend's rules in iptables-save syntax,
// each under a "# <backend>" line; the shared routes and ::6 alone when no
// backend holds rules. Nothing of ours gives "".
func (f *Fake) Dump(path string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := f.netns[path]
	if n == nil {
		return ""
	}
	var b strings.Builder
	for _, name := range []string{capture.NFTables, capture.Legacy} {
		if _, ok := n.tables[name]; !ok {
			continue
		}
		p := n.plan(name)
		var text string
		var err error
		if name == capture.NFTables {
			text, err = capture.RenderNft(p)
		} else {
			text, err = capture.RenderIptables(p)
		}
		if err != nil {
			text = "render error: " + err.Error() + "\n"
		}
		fmt.Fprintf(&b, "# %s\n%s", name, text)
	}
	if len(n.tables) == 0 && (len(n.routes) > 0 || len(n.loopback) > 0) {
		b.WriteString("# routes\n")
		for _, l := range redirect.Describe(redirect.Plan{Routes: n.routes, LoopbackAddrs: n.loopback}) {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

// must returns the namespace at path; the test set it up, so a missing
// one is the test's bug.
func (f *Fake) must(path string) *Netns {
	n := f.netns[path]
	if n == nil {
		panic("capturetest: no namespace " + path + " (AddNetns first)")
	}
	return n
}

func (n *Netns) plan(backend string) redirect.Plan {
	t := n.tables[backend]
	return redirect.Plan{
		Tables:        cloneTables(t.Tables),
		Sets:          cloneSets(t.Sets),
		Routes:        slices.Clone(n.routes),
		LoopbackAddrs: slices.Clone(n.loopback),
	}
}

func (f *Fake) install(n *Netns, backend string, p redirect.Plan) {
	n.tables[backend] = redirect.Plan{Tables: cloneTables(p.Tables), Sets: cloneSets(p.Sets)}
	n.routes, n.loopback = slices.Clone(p.Routes), slices.Clone(p.LoopbackAddrs)
}

// cloneTables copies down to the rules' match lists, so what a namespace
// holds never shares memory with a caller's plan (matches and verdicts
// are immutable values).
func cloneTables(ts []redirect.Table) []redirect.Table {
	out := slices.Clone(ts)
	for i := range out {
		out[i].Chains = slices.Clone(out[i].Chains)
		for j := range out[i].Chains {
			c := &out[i].Chains[j]
			c.Rules = slices.Clone(c.Rules)
			for k := range c.Rules {
				c.Rules[k].Matches = slices.Clone(c.Rules[k].Matches)
			}
		}
	}
	return out
}

func cloneSets(ss []redirect.Set) []redirect.Set {
	out := slices.Clone(ss)
	for i := range out {
		out[i].Prefixes = slices.Clone(out[i].Prefixes)
		out[i].Ports = slices.Clone(out[i].Ports)
	}
	return out
}

// lookup finds the namespace a backend was handed.
func (f *Fake) lookup(path string) (*Netns, error) {
	n := f.netns[path]
	if n == nil {
		return nil, fmt.Errorf("opening netns %s: %w", path, fs.ErrNotExist)
	}
	return n, nil
}

// Kernel methods (capture.Kernel).

// OpenNetns implements capture.Kernel: a namespace AddNetns created, as a
// Netns without a descriptor; any other path does not exist.
func (f *Fake) OpenNetns(path string) (*capture.Netns, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n, err := f.lookup(path)
	if err != nil {
		return nil, err
	}
	if err := f.kernelFault(OpOpen); err != nil {
		return nil, fmt.Errorf("opening netns %s: %w", path, err)
	}
	return hostns.Stub(path, n.id), nil
}

// LegacyAvailable implements capture.Kernel.
func (f *Fake) LegacyAvailable() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.legacyProbes++
	return f.legacyErr
}

// LegacyProbes counts the LegacyAvailable calls so far: the pipeline asks
// the kernel only where legacy tables hold something.
func (f *Fake) LegacyProbes() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.legacyProbes
}

// Addrs implements capture.Kernel.
func (f *Fake) Addrs(path string) ([]netip.Addr, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n, err := f.lookup(path)
	if err != nil {
		return nil, fmt.Errorf("listing addresses: %w", err)
	}
	if err := f.kernelFault(OpAddrs); err != nil {
		return nil, fmt.Errorf("listing addresses in %s: %w", path, err)
	}
	return slices.Clone(n.addrs), nil
}

// Prepare implements capture.Kernel: the fake has nothing to prepare.
func (f *Fake) Prepare(redirect.Plan) capture.Prepared { return nil }

// Enter implements capture.Kernel: a visit reads the namespace at path as
// it is at each call, as the kernel's sockets do.
func (f *Fake) Enter(_ *capture.Netns, path string, _ capture.Prepared, _ capture.Guard) (capture.Visit, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.enters++
	if err := f.kernelFault(OpEnter); err != nil {
		return nil, fmt.Errorf("opening sockets in netns %s: %w", path, err)
	}
	return &visit{f: f, path: path}, nil
}

// Enters counts the visits (Enter) so far. On the running kernel each one
// is a switch of a thread into the namespace and back, and its sockets.
func (f *Fake) Enters() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.enters
}

// visit is a capture.Visit of the fake kernel.
type visit struct {
	f    *Fake
	path string
}

func (v *visit) Close() error { return nil }

// Backend implements capture.Visit.
func (v *visit) Backend(name string) redirect.Backend { return v.f.Backend(name) }

// LegacyPresence implements capture.Visit: what SetForeign and Install
// put in the namespace's legacy tables. Like the kernel's, it does not
// depend on SetLegacyAvailable (a kernel with one family's legacy module
// loaded and not the other's has rules and no usable backend).
func (v *visit) LegacyPresence() (capture.LegacyPresence, error) {
	v.f.mu.Lock()
	defer v.f.mu.Unlock()
	var pr capture.LegacyPresence
	n, err := v.f.lookup(v.path)
	if err != nil {
		return pr, err
	}
	_, pr.Ours = n.tables[capture.Legacy]
	pr.NatOrMangleRules = pr.Ours || n.legacyNatRules
	pr.Foreign = slices.Clone(n.legacyForeign)
	return pr, nil
}

// NFTPresence implements capture.Visit.
func (v *visit) NFTPresence() (ours, iptablesNFT bool, err error) {
	v.f.mu.Lock()
	defer v.f.mu.Unlock()
	n, err := v.f.lookup(v.path)
	if err != nil {
		return false, false, err
	}
	_, ours = n.tables[capture.NFTables]
	return ours, n.iptablesNFT, nil
}

// NFTForeign implements capture.Visit.
func (v *visit) NFTForeign() ([]string, error) {
	v.f.mu.Lock()
	defer v.f.mu.Unlock()
	n, err := v.f.lookup(v.path)
	if err != nil {
		return nil, err
	}
	return slices.Clone(n.nftablesForeign), nil
}

// ForeignUserns implements capture.Visit.
func (v *visit) ForeignUserns() (bool, error) {
	v.f.mu.Lock()
	defer v.f.mu.Unlock()
	n, err := v.f.lookup(v.path)
	if err != nil {
		return false, err
	}
	return n.foreignUserns, nil
}

// Backend returns the fake's backend named name (capture.NFTables or
// capture.Legacy).
func (f *Fake) Backend(name string) redirect.Backend { return &Backend{f: f, name: name} }

var _ capture.Kernel = (*Fake)(nil)

// Backend is one of the fake kernel's backends (nftables or
// iptables-legacy), keyed by namespace path.
type Backend struct {
	f    *Fake
	name string
}

// Name implements redirect.Backend.
func (b *Backend) Name() string { return b.name }

// begin records the call and returns the namespace and the fault for it.
func (b *Backend) begin(ctx context.Context, op, path string) (*Netns, *fault, error) {
	b.f.calls = append(b.f.calls, op+" "+b.name+" "+path)
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	n, err := b.f.lookup(path)
	if err != nil {
		return nil, nil, err
	}
	return n, b.f.fault(op, b.name), nil
}

// Apply implements redirect.Backend: p replaces what the backend held;
// on a fault nothing changes unless the fault is partial.
func (b *Backend) Apply(ctx context.Context, path string, p redirect.Plan) error {
	if err := b.f.wait(ctx, OpApply, b.name); err != nil {
		return err
	}
	b.f.mu.Lock()
	defer b.f.mu.Unlock()
	n, ft, err := b.begin(ctx, OpApply, path)
	if err != nil {
		return err
	}
	if ft != nil && !ft.partial {
		return fmt.Errorf("applying %s rules in netns %s: %w", b.name, path, ft.err)
	}
	b.f.install(n, b.name, p)
	if ft != nil {
		return fmt.Errorf("applying %s rules in netns %s: %w", b.name, path, ft.err)
	}
	return nil
}

// List implements redirect.Backend.
func (b *Backend) List(ctx context.Context, path string) (redirect.Plan, error) {
	if err := b.f.wait(ctx, OpList, b.name); err != nil {
		return redirect.Plan{}, err
	}
	b.f.mu.Lock()
	defer b.f.mu.Unlock()
	n, ft, err := b.begin(ctx, OpList, path)
	if err != nil {
		return redirect.Plan{}, err
	}
	if ft != nil {
		return redirect.Plan{}, fmt.Errorf("listing %s rules in netns %s: %w", b.name, path, ft.err)
	}
	return n.plan(b.name), nil
}

// Check implements redirect.Backend as the real backends do: List, then
// redirect.Diff.
func (b *Backend) Check(ctx context.Context, path string, p redirect.Plan) error {
	return redirect.CheckAgainst(ctx, b, path, p)
}

// Remove implements redirect.Backend: the backend's tables, the routes and
// ::6 go; nothing there is success.
func (b *Backend) Remove(ctx context.Context, path string) error {
	if err := b.f.wait(ctx, OpRemove, b.name); err != nil {
		return err
	}
	b.f.mu.Lock()
	defer b.f.mu.Unlock()
	n, ft, err := b.begin(ctx, OpRemove, path)
	if err != nil {
		return err
	}
	if ft != nil {
		return fmt.Errorf("removing %s rules in netns %s: %w", b.name, path, ft.err)
	}
	delete(n.tables, b.name)
	n.routes, n.loopback = nil, nil
	return nil
}

var _ redirect.Backend = (*Backend)(nil)
