package nft

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/nftmesh/nftmesh/internal/hostns"
	"github.com/nftmesh/nftmesh/policyroute"
	"github.com/nftmesh/nftmesh/redirect"
)

// Backend programs Plans with nftables over netlink.
type Backend struct {
	// table is TableName, or another name for tests that run two owners
	// side by side (Render always prints TableName).
	table    string
	via      *via      // see Via
	prepared *Prepared // see With
	guard    hostns.Guard
}

// Option configures a Backend.
type Option func(*Backend)

// WithGuard makes the write path refuse what g refuses instead of every
// namespace of the host's (`redirect apply --allow-own-netns`).
func WithGuard(g hostns.Guard) Option { return func(b *Backend) { b.guard = g } }

// New returns an nftables backend.
func New(opts ...Option) *Backend {
	b := &Backend{table: TableName}
	for _, o := range opts {
		o(b)
	}
	return b
}

// Name implements redirect.Backend.
func (b *Backend) Name() string { return redirect.BackendNFTables }

// sendBufferDefault is what a batch may take without growing the
// socket's send buffer: a netlink sendmsg larger than the buffer fails.
const sendBufferDefault = 200 << 10

// connect opens the write path into the namespace, refusing what b's guard
// refuses: Via's Conn, else a lasting google/nftables connection and, with
// raw, a raw socket. A batch over sendBufferDefault gets connections of its
// own with grown send buffers (google/nftables does not expose the Via
// connection's). done releases what connect opened.
func (b *Backend) connect(netnsPath string, batchSize int, raw bool) (netns.NsHandle, *nftables.Conn, *netlink.Conn, func(), error) {
	if v := b.via; v != nil && !v.conn.spoiled && batchSize <= sendBufferDefault {
		if err := b.guard.RefuseFd(v.ns, netnsPath); err != nil {
			return netns.None(), nil, nil, nil, err
		}
		return netns.NsHandle(v.ns), v.conn.cc, v.conn.nf, func() {}, nil
	}
	n, err := b.guard.Open(netnsPath)
	if err != nil {
		return netns.None(), nil, nil, nil, err
	}
	ns := netns.NsHandle(n.Take())
	grow := func(c *netlink.Conn) error {
		if batchSize <= sendBufferDefault {
			return nil
		}
		if err := forceSendBuffer(c, batchSize+64<<10); err != nil {
			return fmt.Errorf("sizing the netlink send buffer: %w", err)
		}
		return nil
	}
	cc, err := nftables.New(nftables.WithNetNSFd(int(ns)), nftables.AsLasting(), nftables.WithSockOptions(grow))
	if err != nil {
		ns.Close()
		return netns.None(), nil, nil, nil, fmt.Errorf("connecting to nftables in netns %s: %w", netnsPath, err)
	}
	if !raw {
		return ns, cc, nil, func() { cc.CloseLasting(); ns.Close() }, nil
	}
	nf, err := dialRaw(ns)
	if err == nil {
		if err = grow(nf); err != nil {
			nf.Close()
		}
	}
	if err != nil {
		cc.CloseLasting()
		ns.Close()
		return netns.None(), nil, nil, nil, fmt.Errorf("connecting to nftables in netns %s: %w", netnsPath, err)
	}
	return ns, cc, nf, func() { nf.Close(); cc.CloseLasting(); ns.Close() }, nil
}

// spoil marks the Via connection unfit for another exchange after err.
func (b *Backend) spoil(err error) {
	if err != nil && b.via != nil {
		b.via.conn.spoiled = true
	}
}

// changed forgets the Via connection's table list: a batch is going out.
func (b *Backend) changed() {
	if b.via != nil {
		b.via.conn.changed()
	}
}

func (b *Backend) applyRoutes(ns netns.NsHandle, p redirect.Plan, reapply bool) error {
	if b.via != nil {
		return policyroute.ApplyVia(b.guard, b.via.route, b.via.ns, p, reapply)
	}
	return policyroute.Apply(b.guard, ns, p, reapply)
}

func (b *Backend) removeRoutes(ns netns.NsHandle) error {
	if b.via != nil {
		return policyroute.RemoveVia(b.guard, b.via.route, b.via.ns)
	}
	return policyroute.Remove(b.guard, ns)
}

// tableExists asks the kernel for our one table: a single non-dump request.
func (b *Backend) tableExists(cc *nftables.Conn) (bool, error) {
	t, err := b.ourTable(cc)
	return t != nil, err
}

// ourTable is our table as the kernel has it (its flags too), nil if none.
func (b *Backend) ourTable(cc *nftables.Conn) (*nftables.Table, error) {
	t, err := cc.ListTableOfFamily(b.table, nftables.TableFamilyINet)
	switch {
	case err == nil:
		return t, nil
	case errors.Is(err, unix.ENOENT):
		return nil, nil
	}
	return nil, fmt.Errorf("querying table inet %s: %w", b.table, err)
}

// Apply implements redirect.Backend with one netlink batch that only adds
// the table where there is none (a delete costs an RCU grace period), else
// deletes and re-adds it atomically. If the routes and loopback addresses
// that follow fail, a table this call created is removed and one it
// replaced is put back (an earlier run's rules are not this call's).
func (b *Backend) Apply(ctx context.Context, netnsPath string, p redirect.Plan) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	pr := b.prepared
	if pr == nil || !pr.isFor(p, b.table) {
		pr = prepare(p, b.table, false)
	}
	<-pr.done
	if pr.err != nil {
		return fmt.Errorf("encoding plan for netns %s: %w", netnsPath, pr.err)
	}
	size := msgsSize(pr.create)
	if pr.prog != nil {
		size = max(size, pr.prog.batchSize())
	}
	ns, cc, nf, done, err := b.connect(netnsPath, size, true)
	if err != nil {
		return err
	}
	defer done()
	existed, err := b.existed(cc)
	if err != nil {
		b.spoil(err)
		return fmt.Errorf("applying capture table in netns %s: %w", netnsPath, err)
	}
	old := b.restorePoint(ns, existed)
	b.changed()
	if existed {
		prog := pr.prog
		if prog == nil {
			// The creating batch came from the cache (see created).
			if prog, err = encode(p, b.table); err != nil {
				return fmt.Errorf("encoding plan for netns %s: %w", netnsPath, err)
			}
		}
		err = replaceTable(nf, prog)
	} else {
		err = sendBatch(nf, pr.create)
	}
	b.spoil(err)
	if err != nil {
		return fmt.Errorf("applying capture table inet %s in netns %s: %w", b.table, netnsPath, err)
	}
	if err = b.applyRoutes(ns, p, existed); err != nil {
		if rerr := b.rollback(cc, nf, old); rerr != nil {
			b.spoil(rerr)
			err = errors.Join(err, rerr)
		}
		return fmt.Errorf("applying routes in netns %s: %w", netnsPath, err)
	}
	return nil
}

// existed reports whether our table is in the namespace, from the Via
// connection's table list when it has one, else by one query. Creating
// optimistically and retrying on EEXIST was measured: it saves ~25µs on a
// fresh namespace but costs a re-apply a second RCU grace period (~14ms).
func (b *Backend) existed(cc *nftables.Conn) (bool, error) {
	if b.via != nil && cc == b.via.conn.cc {
		if existed, known := b.via.conn.known(b.table); known {
			return existed, nil
		}
	}
	return b.tableExists(cc)
}

// restorePoint is the table a failed Apply must restore, if any; one this
// backend cannot read back (edited by hand) is removed instead.
func (b *Backend) restorePoint(ns netns.NsHandle, existed bool) *program {
	if !existed {
		return nil
	}
	var was redirect.Plan
	if b.listTable(ns, &was) != nil {
		return nil
	}
	if old, err := encode(was, b.table); err == nil {
		return old
	}
	return nil
}

// rollback undoes a committed batch: the old table goes back, else the table goes.
func (b *Backend) rollback(cc *nftables.Conn, nf *netlink.Conn, old *program) error {
	var err error
	if old != nil {
		if err = replaceTable(nf, old); err == nil {
			return nil
		}
		err = fmt.Errorf("restoring the earlier table inet %s: %w", b.table, err)
	}
	if derr := b.deleteTable(cc); derr != nil {
		return errors.Join(err, fmt.Errorf("rolling back table inet %s: %w", b.table, derr))
	}
	return err
}

// replaceTable sends prog as one batch that deletes and re-adds our table,
// as the creating batch goes (raw.go, 1): Conn.Flush's echo of every rule
// overflowed the socket's receive buffer from ~170 rules on (ENOBUFS, a
// pod with 80 excluded interfaces could not be re-applied).
func replaceTable(nf *netlink.Conn, prog *program) error {
	msgs, err := marshal(prog, true)
	if err != nil {
		return err
	}
	return sendBatch(nf, msgs)
}

// deleteTable deletes our table; a missing table is success.
func (b *Backend) deleteTable(cc *nftables.Conn) error {
	cc.DelTable(&nftables.Table{Name: b.table, Family: nftables.TableFamilyINet})
	if err := cc.Flush(); err != nil && !errors.Is(err, unix.ENOENT) {
		return err
	}
	return nil
}

// Check implements redirect.Backend.
func (b *Backend) Check(ctx context.Context, netnsPath string, p redirect.Plan) error {
	return redirect.CheckAgainst(ctx, b, netnsPath, p)
}

// Remove implements redirect.Backend: our table, the TPROXY policy routes
// and the ::6 passthrough address go; anything already gone is success.
func (b *Backend) Remove(ctx context.Context, netnsPath string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	ns, cc, _, done, err := b.connect(netnsPath, 0, false)
	if err != nil {
		return err
	}
	defer done()
	b.changed()
	if err := b.deleteTable(cc); err != nil {
		b.spoil(err)
		return fmt.Errorf("removing table inet %s in netns %s: %w", b.table, netnsPath, err)
	}
	if err := b.removeRoutes(ns); err != nil {
		return fmt.Errorf("removing routes in netns %s: %w", netnsPath, err)
	}
	return nil
}

var _ redirect.Backend = (*Backend)(nil)
