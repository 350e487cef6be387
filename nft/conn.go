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

	"github.com/nftmesh/nftmesh/internal/policyroute"
	"github.com/nftmesh/nftmesh/redirect"
)

// Conn is the backend's way into one network namespace for a caller that
// enters it once for everything it opens there (capture): a lasting
// google/nftables connection and a netfilter netlink socket, both created
// from inside the namespace (DialHere). The caller's look at the tables
// (Tables) goes over the first, the batch that creates the backend's table
// over the second (sendBatch), anything else the backend sends over the
// first.
type Conn struct {
	cc *nftables.Conn
	nf *netlink.Conn
	// dumped is the last Tables answer, until a batch through the Conn
	// changes what the namespace holds; dumpedOK says there is one.
	dumped   []TableRef
	dumpedOK bool
	// spoiled: an exchange failed and may have left replies unread, or a
	// marshalling error on the connection that its next Flush would
	// return; the backend then opens a connection of its own.
	spoiled bool
}

// TableRef names one nftables table of a namespace.
type TableRef struct {
	Family uint8 // unix.NFPROTO_INET, NFPROTO_IPV4, NFPROTO_IPV6, ...
	Name   string
}

// DialHere opens a lasting nftables connection in the calling thread's
// network namespace. It must run on a thread inside the namespace
// (hostns.Netns.Do); the socket stays there when the thread leaves.
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

// Tables lists every nftables table of the namespace, of every family, in
// one dump. A Backend working through c (Via) takes whether its table exists
// from this answer instead of asking again; the caller's lock on the
// namespace keeps the answer true until the backend's batch.
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

// Chains lists every chain of every table of the namespace, in one dump
// over the lasting connection.
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

// Close closes the socket.
func (c *Conn) Close() error { return errors.Join(c.cc.CloseLasting(), c.nf.Close()) }

// known reports whether the last Tables answer, still valid, holds the inet
// table name.
func (c *Conn) known(name string) (exists, ok bool) {
	if !c.dumpedOK {
		return false, false
	}
	for _, t := range c.dumped {
		if t.Family == unix.NFPROTO_INET && t.Name == name {
			return true, true
		}
	}
	return false, true
}

// changed forgets the last Tables answer: a batch went through.
func (c *Conn) changed() { c.dumped, c.dumpedOK = nil, false }

// via is what a Backend bound with Via works through.
type via struct {
	ns    int
	conn  *Conn
	route *policyroute.Handle
}

// Via returns a copy of b that works in the namespace whose descriptor is
// ns through sockets the caller opened inside it: c (DialHere) and route
// (policyroute.OpenHere). Apply and Remove then open nothing and name their
// netnsPath only in messages; List and Check still read by path. The write
// path still refuses ns when it is the host's. The caller keeps ownership
// of ns, c and route.
func (b *Backend) Via(ns int, c *Conn, route *policyroute.Handle) *Backend {
	cp := *b
	cp.via = &via{ns: ns, conn: c, route: route}
	return &cp
}

// Prepared is a plan encoded, and the batch that creates its table
// marshalled, ahead of Apply on another goroutine (Prepare): CPU work that
// then overlaps what the caller does until Apply (taking the namespace's
// lock, entering it, choosing the backend). A namespace that already has
// the table needs a batch that replaces it: Apply has google/nftables
// marshal that one from the same encoding.
type Prepared struct {
	plan   redirect.Plan
	table  string
	done   chan struct{}
	prog   *program
	create []netlink.Message
	err    error
}

// Prepare starts encoding p for b's table and marshalling the batch that
// creates it, on another goroutine. Pass the result to With. With one P
// (the CLI, the standalone plugin) it does the work before it returns: a
// goroutine could not run beside the caller there.
func (b *Backend) Prepare(p redirect.Plan) *Prepared {
	return prepare(p, b.table, runtime.GOMAXPROCS(0) > 1)
}

// prepareHook, when set, runs at the start of prepare's work; tests use it
// to inject a panic there.
var prepareHook func()

func prepare(p redirect.Plan, table string, async bool) *Prepared {
	pr := &Prepared{plan: p, table: table, done: make(chan struct{})}
	work := func() {
		defer close(pr.done)
		// On its own goroutine the work is outside the caller's recover: a
		// panic here would end the process with every call in flight. It
		// fails this plan's Apply instead (nothing is sent).
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
			// The encoding is left for the rare Apply that replaces a
			// table.
			pr.create = msgs
			return
		}
		if pr.prog, pr.err = encode(p, table); pr.err != nil {
			return
		}
		if pr.create, pr.err = marshal(pr.prog); pr.err == nil {
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
// agent runs the plugin's ADD for every pod start on its node, and most
// pods get one of a few plans; marshalling the batch through
// google/nftables is then most of the CPU, and of the memory, an ADD costs
// there (BenchmarkMarshal: 0.4-1.0 ms and 80 KB for the default pod on a
// loaded 2-core machine). A process that prepares one plan (the standalone
// plugin, the CLI) pays a plan's copy.
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

// lookup returns a copy of the batch for p's table in table, whose headers
// the caller may change (sending sets flags and sequence numbers); the
// messages' data is shared and must not be.
func (c *batchCache) lookup(p redirect.Plan, table string) ([]netlink.Message, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, e := range c.entries {
		if e.table == table && e.plan.Equal(p) {
			copy(c.entries[1:i+1], c.entries[:i])
			c.entries[0] = e
			return slices.Clone(e.msgs), true
		}
	}
	return nil, false
}

// remember keeps msgs, the batch just marshalled for p, for the next
// lookups; msgs stays the caller's (a copy of the headers is kept).
func (c *batchCache) remember(p redirect.Plan, table string, msgs []netlink.Message) {
	if c.max == 0 {
		return
	}
	e := cachedBatch{table: table, plan: p.Clone(), msgs: slices.Clone(msgs)}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.entries) < c.max {
		c.entries = append(c.entries, cachedBatch{})
	}
	copy(c.entries[1:], c.entries)
	c.entries[0] = e
}

// isFor reports whether pr was prepared from p itself for table: the same
// Plan value, its slices the same arrays. The caller must not change the
// plan in place between Prepare and Apply; any other plan is encoded anew.
func (pr *Prepared) isFor(p redirect.Plan, table string) bool {
	q := pr.plan
	return pr.table == table && same(q.Tables, p.Tables) && same(q.Sets, p.Sets) &&
		same(q.Routes, p.Routes) && same(q.LoopbackAddrs, p.LoopbackAddrs)
}

func same[T any](a, b []T) bool { return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0]) }

// With returns a copy of b whose Apply of the plan pr was prepared from
// uses pr's work (waiting for it); Apply of any other plan encodes its own.
func (b *Backend) With(pr *Prepared) *Backend {
	cp := *b
	cp.prepared = pr
	return &cp
}
