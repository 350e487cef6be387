package nft

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"

	"github.com/google/nftables"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/nftmesh/nftmesh/internal/hostns"
	"github.com/nftmesh/nftmesh/policyroute"
	"github.com/nftmesh/nftmesh/redirect"
)

// List implements redirect.Backend: our table (empty without one), the
// policy routes and lo's extra addresses.
func (b *Backend) List(ctx context.Context, netnsPath string) (redirect.Plan, error) {
	var p redirect.Plan
	if err := ctx.Err(); err != nil {
		return p, err
	}
	n, err := hostns.Open(netnsPath)
	if err != nil {
		return p, err
	}
	ns := netns.NsHandle(n.Take())
	defer ns.Close()
	if err := b.listTable(ns, &p); err != nil {
		return redirect.Plan{}, fmt.Errorf("reading table inet %s in netns %s: %w", b.table, netnsPath, err)
	}
	if p.Routes, p.LoopbackAddrs, err = policyroute.List(ns); err != nil {
		return redirect.Plan{}, fmt.Errorf("reading routes in netns %s: %w", netnsPath, err)
	}
	return p, nil
}

func (b *Backend) listTable(ns netns.NsHandle, p *redirect.Plan) error {
	cc, err := nftables.New(nftables.WithNetNSFd(int(ns)), nftables.AsLasting())
	if err != nil {
		return err
	}
	defer cc.CloseLasting()
	table, err := b.ourTable(cc)
	if err != nil || table == nil {
		return err
	}
	// A dormant table keeps its chains but none is on its hook: every
	// rule is off though each reads back as written.
	p.TableFlags = tableFlags(table)
	if err := refuseObjects(cc, table); err != nil {
		return err
	}
	anon, kinds, err := listSets(cc, table, p)
	if err != nil {
		return err
	}
	idx, err := b.listChains(cc, p)
	if err != nil {
		return err
	}
	conn, err := dialRaw(ns)
	if err != nil {
		return fmt.Errorf("connecting to nftables: %w", err)
	}
	defer conn.Close()
	rules, err := dumpRules(conn, b.table)
	if err != nil {
		return err
	}
	for _, lr := range rules {
		at, ok := idx[lr.chain]
		if !ok {
			return redirect.Unreadable(fmt.Errorf("rule handle %d in unknown chain %s", lr.handle, lr.chain))
		}
		t := &p.Tables[at[0]]
		d := ruleDecoder{table: t.Name, es: lr.exprs, anon: anon, sets: kinds}
		r, err := d.decode()
		if err != nil {
			return redirect.Unreadable(fmt.Errorf("decoding chain %s rule handle %d: %w", lr.chain, lr.handle, err))
		}
		t.Chains[at[1]].Rules = append(t.Chains[at[1]].Rules, r)
	}
	return nil
}

// refuseObjects fails on any stateful object (a named counter someone
// added): nftmesh writes none.
func refuseObjects(cc *nftables.Conn, table *nftables.Table) error {
	objs, err := cc.GetNamedObjects(table)
	if err != nil {
		return fmt.Errorf("listing objects: %w", err)
	}
	if len(objs) == 0 {
		return nil
	}
	if no, ok := objs[0].(*nftables.NamedObj); ok {
		kind := map[nftables.ObjType]string{nftables.ObjTypeCounter: "counter", nftables.ObjTypeQuota: "quota", nftables.ObjTypeLimit: "limit"}[no.Type]
		if kind == "" {
			kind = fmt.Sprintf("of type %d", no.Type)
		}
		return redirect.Unreadable(fmt.Errorf("object %s %s: nftmesh writes no objects", kind, no.Name))
	}
	return redirect.Unreadable(fmt.Errorf("an object %T: nftmesh writes no objects", objs[0]))
}

// listSets adds the named sets to p and returns the anonymous port sets'
// ports and the named sets' kinds, by name.
func listSets(cc *nftables.Conn, table *nftables.Table, p *redirect.Plan) (map[string][]uint16, map[string]redirect.SetKind, error) {
	sets, err := cc.GetSets(table)
	if err != nil {
		return nil, nil, fmt.Errorf("listing sets: %w", err)
	}
	anon := map[string][]uint16{}
	kinds := map[string]redirect.SetKind{}
	for _, s := range sets {
		if s.HasTimeout {
			// Its elements (ours read as they are) may be gone
			// tomorrow.
			return nil, nil, redirect.Unreadable(fmt.Errorf("set %s: elements may expire (flag timeout): nftmesh writes no timeouts", s.Name))
		}
		elems, err := cc.GetSetElements(s)
		if err != nil {
			return nil, nil, fmt.Errorf("listing elements of set %s: %w", s.Name, err)
		}
		if s.Anonymous {
			if s.KeyType.Name != nftables.TypeInetService.Name {
				return nil, nil, redirect.Unreadable(fmt.Errorf("anonymous set %s of type %s is not ours", s.Name, s.KeyType.Name))
			}
			ports, err := decodePorts(elems)
			if err != nil {
				return nil, nil, redirect.Unreadable(fmt.Errorf("anonymous set %s: %w", s.Name, err))
			}
			anon[s.Name] = ports
			continue
		}
		ds, err := decodeSet(s, elems)
		if err != nil {
			return nil, nil, redirect.Unreadable(fmt.Errorf("set %s: %w", s.Name, err))
		}
		kinds[ds.Name] = ds.Kind
		p.Sets = append(p.Sets, ds)
	}
	return anon, kinds, nil
}

// listChains adds our table's chains to p and returns where each went
// (table index, chain index) by nft chain name.
func (b *Backend) listChains(cc *nftables.Conn, p *redirect.Plan) (map[string][2]int, error) {
	chains, err := cc.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		return nil, fmt.Errorf("listing chains: %w", err)
	}
	idx := map[string][2]int{}
	for _, c := range chains {
		if c.Table == nil || c.Table.Name != b.table {
			continue
		}
		tn, cn, err := splitChainName(c.Name)
		if err != nil {
			return nil, redirect.Unreadable(err)
		}
		rc, err := decodeChain(c, cn)
		if err != nil {
			return nil, redirect.Unreadable(err)
		}
		ti := slices.IndexFunc(p.Tables, func(t redirect.Table) bool { return t.Name == tn })
		if ti < 0 {
			p.Tables = append(p.Tables, redirect.Table{Name: tn})
			ti = len(p.Tables) - 1
		}
		p.Tables[ti].Chains = append(p.Tables[ti].Chains, rc)
		idx[c.Name] = [2]int{ti, len(p.Tables[ti].Chains) - 1}
	}
	return idx, nil
}

func decodeChain(c *nftables.Chain, name string) (redirect.Chain, error) {
	rc := redirect.Chain{Name: name}
	if c.Hooknum == nil {
		return rc, nil
	}
	var err error
	if rc.Hook, err = decodeHook(*c.Hooknum); err != nil {
		return rc, fmt.Errorf("chain %s: %w", c.Name, err)
	}
	if c.Priority != nil {
		rc.Priority = int32(*c.Priority)
	}
	rc.Type = redirect.ChainType(c.Type)
	if c.Policy != nil {
		switch *c.Policy {
		case nftables.ChainPolicyAccept:
		case nftables.ChainPolicyDrop:
			rc.Policy = redirect.PolicyDrop
		default:
			return rc, fmt.Errorf("chain %s: policy %d", c.Name, *c.Policy)
		}
	}
	return rc, nil
}

// decodeHook names every hook of the inet family, so that a chain of ours
// moved to one nftmesh never uses reads back as such and CHECK names it.
func decodeHook(h nftables.ChainHook) (redirect.Hook, error) {
	switch h {
	case unix.NF_INET_PRE_ROUTING:
		return redirect.HookPrerouting, nil
	case unix.NF_INET_LOCAL_OUT:
		return redirect.HookOutput, nil
	case unix.NF_INET_LOCAL_IN:
		return "input", nil
	case unix.NF_INET_FORWARD:
		return "forward", nil
	case unix.NF_INET_POST_ROUTING:
		return "postrouting", nil
	case unix.NF_INET_NUMHOOKS: // NF_INET_INGRESS, which x/sys does not name
		return "ingress", nil
	}
	return "", fmt.Errorf("unsupported hook %d", h)
}

func decodePorts(elems []nftables.SetElement) ([]uint16, error) {
	var ports []uint16
	for _, e := range elems {
		if len(e.Key) != 2 || e.IntervalEnd {
			return nil, fmt.Errorf("element %x is not a port", e.Key)
		}
		ports = append(ports, binary.BigEndian.Uint16(e.Key))
	}
	slices.Sort(ports)
	return ports, nil
}

func decodeSet(s *nftables.Set, elems []nftables.SetElement) (redirect.Set, error) {
	out := redirect.Set{Name: s.Name}
	switch s.KeyType.Name {
	case nftables.TypeInetService.Name:
		out.Kind = redirect.SetPort
		var err error
		if s.Interval {
			out.Ports, err = decodePortIntervals(elems)
		} else {
			// A plain set, as nftmesh wrote port sets before they became
			// interval sets (a pod started before an upgrade).
			out.Ports, err = decodePorts(elems)
		}
		return out, err
	case nftables.TypeIPAddr.Name:
		out.Kind = redirect.SetIPv4
	case nftables.TypeIP6Addr.Name:
		out.Kind = redirect.SetIPv6
	default:
		return out, fmt.Errorf("unsupported key type %s", s.KeyType.Name)
	}
	if !s.Interval {
		return out, fmt.Errorf("address set without the interval flag")
	}
	rs, err := decodeIntervals(elems, out.Kind == redirect.SetIPv6)
	if err != nil {
		return out, err
	}
	for _, r := range rs {
		out.Prefixes = append(out.Prefixes, rangePrefixes(r)...)
	}
	return out, nil
}

type boundary struct {
	addr netip.Addr
	end  bool
}

// decodeIntervals pairs start and end (end+1, IntervalEnd) elements back
// into ranges; a start with no end runs to the top of the address space.
func decodeIntervals(elems []nftables.SetElement, v6 bool) ([]redirect.AddrRange, error) {
	bs := make([]boundary, 0, len(elems))
	for _, e := range elems {
		a, ok := netip.AddrFromSlice(e.Key)
		if !ok || a.Is6() != v6 {
			return nil, fmt.Errorf("element %x has the wrong length", e.Key)
		}
		bs = append(bs, boundary{a, e.IntervalEnd})
	}
	slices.SortFunc(bs, func(x, y boundary) int { return x.addr.Compare(y.addr) })
	// nft -f opens an interval set with an end element at the zero address
	// when the first range does not start there; it bounds nothing.
	if len(bs) > 0 && bs[0].end && bs[0].addr.IsUnspecified() {
		bs = bs[1:]
	}
	var out []redirect.AddrRange
	for i := 0; i < len(bs); i++ {
		if bs[i].end {
			return nil, fmt.Errorf("interval end %s without a start", bs[i].addr)
		}
		r := redirect.AddrRange{From: bs[i].addr}
		if i+1 < len(bs) && bs[i+1].end {
			r.To = bs[i+1].addr.Prev()
			i++
		} else {
			r.To = redirect.LastAddr(netip.PrefixFrom(r.From, 0))
		}
		out = append(out, r)
	}
	return out, nil
}

// decodePortIntervals is decodeIntervals for a port interval set, each
// range expanded into its ports.
func decodePortIntervals(elems []nftables.SetElement) ([]uint16, error) {
	type bound struct {
		port uint16
		end  bool
	}
	bs := make([]bound, 0, len(elems))
	for _, e := range elems {
		if len(e.Key) != 2 {
			return nil, fmt.Errorf("element %x is not a port", e.Key)
		}
		bs = append(bs, bound{binary.BigEndian.Uint16(e.Key), e.IntervalEnd})
	}
	slices.SortFunc(bs, func(x, y bound) int { return int(x.port) - int(y.port) })
	if len(bs) > 0 && bs[0].end && bs[0].port == 0 {
		bs = bs[1:] // nft's opening end element (see decodeIntervals)
	}
	var ports []uint16
	for i := 0; i < len(bs); i++ {
		if bs[i].end {
			return nil, fmt.Errorf("interval end %d without a start", bs[i].port)
		}
		from, to := int(bs[i].port), 0xffff
		if i+1 < len(bs) && bs[i+1].end {
			to = int(bs[i+1].port) - 1
			i++
		}
		if from > to {
			return nil, fmt.Errorf("empty interval from %d", from)
		}
		for p := from; p <= to; p++ {
			ports = append(ports, uint16(p))
		}
	}
	return ports, nil
}

// rangePrefixes splits an inclusive range into the fewest prefixes.
func rangePrefixes(r redirect.AddrRange) []netip.Prefix {
	var out []netip.Prefix
	from := r.From
	for {
		bits := from.BitLen()
		// Widen the prefix while it stays aligned and inside the range.
		for bits > 0 {
			p := netip.PrefixFrom(from, bits-1)
			if p.Masked().Addr() != from || redirect.LastAddr(p).Compare(r.To) > 0 {
				break
			}
			bits--
		}
		p := netip.PrefixFrom(from, bits)
		out = append(out, p)
		last := redirect.LastAddr(p)
		if last.Compare(r.To) >= 0 {
			return out
		}
		from = last.Next()
	}
}
