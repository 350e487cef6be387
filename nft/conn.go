package nft

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/nftmesh/nftmesh/policyroute"
	"github.com/nftmesh/nftmesh/redirect"
)

// Conn is a lasting google/nftables connection and a raw netfilter netlink
// socket (for the creating batch, sendBatch), both made by DialHere for a
// caller that enters the namespace once for everything (capture).
type Conn struct {
	cc *nftables.Conn
	nf *netlink.Conn
	// dumped is the last Tables answer until a batch through the Conn.
	dumped   []TableRef
	dumpedOK bool
	// spoiled: a failed exchange may have left replies unread, or an error
	// for the next Flush; the backend then opens a connection of its own.
	spoiled bool
}

// TableRef names one nftables table of a namespace.
type TableRef struct {
	Family uint8 // unix.NFPROTO_INET, NFPROTO_IPV4, NFPROTO_IPV6, ...
	Name   string
}

// DialHere opens a Conn in the calling thread's network namespace (run it
// inside hostns.Netns.Do); the sockets stay there when the thread leaves.
func DialHere() (*Conn, error) {
	cc, err := nftables.New(nftables.AsLasting())
	if err != nil {
		return nil, fmt.Errorf("connecting to nftables: %w", err)
	}
	nf, err := netlink.Dial(unix.NETLINK_NETFILTER, nil)
	if err != nil {
		cc.CloseLasting()
		return nil, fmt.Errorf("connecting to nftables: %w", err)
	}
	return &Conn{cc: cc, nf: nf}, nil
}

// Tables lists every table of the namespace in one dump. A Backend working
// through c (Via) takes whether its table exists from this answer; the
// caller's lock on the namespace keeps it true until the backend's batch.
func (c *Conn) Tables() ([]TableRef, error) {
	ts, err := c.cc.ListTables()
	if err != nil {
		return nil, fmt.Errorf("dumping tables: %w", err)
	}
	out := make([]TableRef, 0, len(ts))
	for _, t := range ts {
		out = append(out, TableRef{Family: uint8(t.Family), Name: t.Name})
	}
	c.dumped, c.dumpedOK = out, true
	return out, nil
}

// ChainRef names one nftables chain of a namespace and its table.
type ChainRef struct {
	Family uint8 // its table's family
	Table  string
	Name   string
}

// Chains lists every chain of the namespace in one dump.
func (c *Conn) Chains() ([]ChainRef, error) {
	cs, err := c.cc.ListChains()
	if err != nil {
		return nil, fmt.Errorf("dumping chains: %w", err)
	}
	out := make([]ChainRef, 0, len(cs))
	for _, ch := range cs {
		out = append(out, ChainRef{Family: uint8(ch.Table.Family), Table: ch.Table.Name, Name: ch.Name})
	}
	return out, nil
}

// Close closes the sockets.
func (c *Conn) Close() error { return errors.Join(c.cc.CloseLasting(), c.nf.Close()) }

// known reports whether the last Tables answer, if still valid (ok),
// holds the inet table name.
func (c *Conn) known(name string) (exists, ok bool) {
	if !c.dumpedOK {
		return false, false
	}
	return slices.Contains(c.dumped, TableRef{Family: unix.NFPROTO_INET, Name: name}), true
}

func (c *Conn) changed() { c.dumped, c.dumpedOK = nil, false }

type via struct {
	ns    int
	conn  *Conn
	route *policyroute.Handle
}

// Via returns a copy of b whose Apply and Remove work in the namespace ns
// (a descriptor, still refused if the host's) through c (DialHere) and
// route (policyroute.OpenHere); netnsPath then only names it in messages.
// List and Check still read by path. The caller keeps ns, c and route.
func (b *Backend) Via(ns int, c *Conn, route *policyroute.Handle) *Backend {
	cp := *b
	cp.via = &via{ns: ns, conn: c, route: route}
	return &cp
}

// Prepared is a plan encoded and its creating batch marshalled ahead of
// Apply (Prepare), overlapping the caller's lock, entry and backend choice.
// Replacing a table takes another batch, marshalled from the same encoding.
type Prepared struct {
	plan   redirect.Plan
	table  string
	done   chan struct{}
	prog   *program
	create []netlink.Message
	err    error
}

// Prepare starts preparing p for b's table on another goroutine; pass the
// result to With. With one P (the CLI, the standalone plugin), where no
// goroutine could run beside the caller, it does the work before returning.
func (b *Backend) Prepare(p redirect.Plan) *Prepared {
	return prepare(p, b.table, runtime.GOMAXPROCS(0) > 1)
}

// prepareHook, when set, starts prepare's work; tests inject a panic.
var prepareHook func()

func prepare(p redirect.Plan, table string, async bool) *Prepared {
	pr := &Prepared{plan: p, table: table, done: make(chan struct{})}
	work := func() {
		defer close(pr.done)
		// Outside the caller's recover a panic would end the process with
		// every call in flight; it fails this plan's Apply instead.
		defer func() {
			if r := recover(); r != nil {
				pr.prog, pr.create = nil, nil
				pr.err = fmt.Errorf("preparing the batch panicked: %v", r)
			}
		}()
		if prepareHook != nil {
			prepareHook()
		}
		if msgs, ok := created.lookup(p, table); ok {
			// Encoding is left to the rare Apply that replaces a table.
			pr.create = msgs
			return
		}
		if pr.prog, pr.err = encode(p, table); pr.err != nil {
			return
		}
		if pr.create, pr.err = marshal(pr.prog, false); pr.err == nil {
			created.remember(p, table, pr.create)
		}
	}
	if async {
		go work()
	} else {
		work()
	}
	return pr
}

// created remembers the creating batches of the last plans prepared. The
// agent runs every pod's ADD on its node, most pods get one of a few plans,
// and marshalling is then most of an ADD's CPU and memory (BenchmarkMarshal:
// 0.4-1.0 ms and 80 KB for the default pod on a loaded 2-core machine).
var created = batchCache{max: 16}

// batchCache maps plans (by Equal) to the messages of the batch that
// creates their table, the most recently used first.
type batchCache struct {
	mu      sync.Mutex
	max     int
	entries []cachedBatch
}

type cachedBatch struct {
	table string
	plan  redirect.Plan // a clone: callers may reuse theirs
	msgs  []netlink.Message
}

// lookup returns a copy of the batch for p in table: the caller may change
// the headers, not the shared data.
func (c *batchCache) lookup(p redirect.Plan, table string) ([]netlink.Message, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, e := range c.entries {
		if e.table == table && e.plan.Equal(p) {
			c.entries = slices.Insert(slices.Delete(c.entries, i, i+1), 0, e)
			return slices.Clone(e.msgs), true
		}
	}
	return nil, false
}

// remember keeps a copy of msgs' headers, the batch marshalled for p.
func (c *batchCache) remember(p redirect.Plan, table string, msgs []netlink.Message) {
	if c.max == 0 {
		return
	}
	e := cachedBatch{table: table, plan: p.Clone(), msgs: slices.Clone(msgs)}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.entries = slices.Insert(c.entries[:min(len(c.entries), c.max-1)], 0, e)
}

// isFor reports whether pr was prepared for table from p itself (the same
// slice arrays; the caller must not change the plan in place in between).
func (pr *Prepared) isFor(p redirect.Plan, table string) bool {
	q := pr.plan
	return pr.table == table && same(q.Tables, p.Tables) && same(q.Sets, p.Sets) &&
		same(q.Routes, p.Routes) && same(q.LoopbackAddrs, p.LoopbackAddrs)
}

func same[T any](a, b []T) bool { return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0]) }

// With returns a copy of b whose Apply of pr's plan uses (waits for) pr.
func (b *Backend) With(pr *Prepared) *Backend {
	cp := *b
	cp.prepared = pr
	return &cp
}
