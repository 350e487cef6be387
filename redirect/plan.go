package redirect

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// Plan is the backend-neutral rule set for one pod network namespace. It is
// shaped after the iptables tables Istio programs (nat, mangle, raw), the
// behaviour we reproduce, but holds no iptables text: every match and verdict
// is a typed value from a closed vocabulary, so a backend switches over a
// known set and an unsupported case fails loudly. A Plan is a plain value:
// Equal (or reflect.DeepEqual) compares two meaningfully.
type Plan struct {
	// Tables in iptables-save's order (mangle, nat, raw), only those holding
	// a rule.
	Tables []Table
	// Sets referenced by MatchSet matches, names unique.
	Sets []Set
	// Routes is the TPROXY policy routing, empty in REDIRECT mode.
	Routes []PolicyRoute
	// LoopbackAddrs are added to lo (::6/128, the inbound passthrough source,
	// when IPv6 is on).
	LoopbackAddrs []netip.Prefix
	// TableFlags are the flags a backend's List found on the kernel table
	// holding the rules (nftables: dormant switches every chain of it off).
	// Build sets none and no backend writes one: any is drift.
	TableFlags TableFlags
}

// TableFlags are nftables table flags (NFT_TABLE_F_*).
type TableFlags uint32

// The flags the kernel knows (uapi nf_tables.h).
const (
	TableDormant TableFlags = 1 << iota // the table's base chains are off their hooks
	TableOwner                          // the table goes when the netlink socket that made it closes
	TablePersist                        // with TableOwner: the table stays when its owner goes
)

// String lists the flags as nft names them, unknown bits in hex.
func (f TableFlags) String() string {
	var out []string
	for _, fl := range []struct {
		bit  TableFlags
		name string
	}{{TableDormant, "dormant"}, {TableOwner, "owner"}, {TablePersist, "persist"}} {
		if f&fl.bit != 0 {
			out = append(out, fl.name)
			f &^= fl.bit
		}
	}
	if f != 0 || len(out) == 0 {
		out = append(out, fmt.Sprintf("0x%x", uint32(f)))
	}
	return strings.Join(out, ",")
}

// Table is one logical netfilter table.
type Table struct {
	Name   TableName
	Chains []Chain
}

// TableName names a logical table. Backends map it to their own objects
// (the nftables backend uses one inet table with prefixed chain names).
type TableName string

const (
	TableMangle TableName = "mangle"
	TableNat    TableName = "nat"
	TableRaw    TableName = "raw"
)

// Chain is a base chain (Hook set; iptables' builtin names: PREROUTING,
// OUTPUT) or a regular chain (Hook empty; Istio's names: ISTIO_INBOUND, ...).
type Chain struct {
	Name string
	Hook Hook
	// Type, Priority and Policy only mean something for base chains.
	Type     ChainType
	Priority int32
	// Policy is what happens to a packet that reaches the end of a base
	// chain: accept (the zero value) in every chain Build makes.
	Policy ChainPolicy
	Rules  []Rule
}

// ChainPolicy is a base chain's verdict for packets no rule ended.
type ChainPolicy uint8

const (
	PolicyAccept ChainPolicy = iota
	PolicyDrop
)

func (p ChainPolicy) String() string {
	switch p {
	case PolicyAccept:
		return "accept"
	case PolicyDrop:
		return "drop"
	}
	return fmt.Sprintf("policy(%d)", uint8(p))
}

// IsBase reports whether the chain is attached to a netfilter hook.
func (c Chain) IsBase() bool { return c.Hook != "" }

// Hook is a netfilter hook a base chain attaches to.
type Hook string

const (
	HookPrerouting Hook = "prerouting"
	HookOutput     Hook = "output"
)

// ChainType is the nftables base chain type. iptables mangle OUTPUT is a
// "route" chain (a changed mark re-routes the packet).
type ChainType string

const (
	ChainTypeNat    ChainType = "nat"
	ChainTypeFilter ChainType = "filter"
	ChainTypeRoute  ChainType = "route"
)

// Priorities of our base chains, the same as iptables' tables, so we order
// against kube-proxy and the primary CNI the way Istio's rules do.
const (
	PriorityRaw    int32 = -300
	PriorityMangle int32 = -150
	PriorityNat    int32 = -100
)

// Family restricts a rule to one address family. FamilyAny rules apply to
// both (in iptables terms: they appear in both iptables and ip6tables).
type Family uint8

const (
	FamilyAny Family = iota
	FamilyIPv4
	FamilyIPv6
)

func (f Family) String() string {
	switch f {
	case FamilyAny:
		return "any"
	case FamilyIPv4:
		return "ipv4"
	case FamilyIPv6:
		return "ipv6"
	}
	return fmt.Sprintf("family(%d)", uint8(f))
}

// Includes reports whether a rule of family f applies to packets of family g
// (g is FamilyIPv4 or FamilyIPv6).
func (f Family) Includes(g Family) bool { return f == FamilyAny || f == g }

// Rule is a conjunction of matches followed by one verdict.
type Rule struct {
	Family  Family
	Matches []Match
	Verdict Verdict
}

// Set is a named set of addresses or ports, referenced by MatchSet. Elements
// keep the spec's order (deduplicated); backends sort or merge as they need.
type Set struct {
	Name     string
	Kind     SetKind
	Prefixes []netip.Prefix // SetIPv4 / SetIPv6
	Ports    []uint16       // SetPort
}

// SetKind is the element type of a Set.
type SetKind uint8

const (
	SetIPv4 SetKind = iota + 1
	SetIPv6
	SetPort
)

func (k SetKind) String() string {
	switch k {
	case SetIPv4:
		return "ipv4_addr"
	case SetIPv6:
		return "ipv6_addr"
	case SetPort:
		return "inet_service"
	}
	return fmt.Sprintf("setkind(%d)", uint8(k))
}

// PolicyRoute is "ip rule fwmark Mark lookup Table" plus a local default
// route on lo in that table, for one family.
type PolicyRoute struct {
	Family Family // FamilyIPv4 or FamilyIPv6
	Mark   uint32
	Table  int
}

// Proto is a layer-4 protocol.
type Proto uint8

const (
	ProtoTCP Proto = 6
	ProtoUDP Proto = 17
)

func (p Proto) String() string {
	switch p {
	case ProtoTCP:
		return "tcp"
	case ProtoUDP:
		return "udp"
	}
	return fmt.Sprintf("proto(%d)", uint8(p))
}

// Match is one condition of a rule. The set of matches is closed: only types
// in this package implement it.
type Match interface{ isMatch() }

// MatchProto matches the layer-4 protocol. Port matches need one before them.
type MatchProto struct{ Proto Proto }

// MatchPort matches the destination (or source) port against one or more
// literal ports. Negated with several ports means "none of them".
type MatchPort struct {
	Source bool // match the source port instead of the destination port
	Ports  []uint16
	Negate bool
}

// MatchAddr matches the destination (or source) address against a prefix.
// The prefix's family must equal the rule's Family.
type MatchAddr struct {
	Source bool
	Prefix netip.Prefix
	Negate bool
}

// MatchSet matches the destination address or port against a named Set.
type MatchSet struct {
	Set    string
	Kind   SetKind
	Negate bool
}

// MatchIface matches the input (or output) interface name. A trailing "+"
// matches any name with that prefix, as in iptables.
type MatchIface struct {
	Out    bool
	Name   string
	Negate bool
}

// MatchOwner matches the UID or GID of the local socket that sent the packet.
type MatchOwner struct {
	GID    bool // match the GID instead of the UID
	ID     uint32
	Negate bool
}

// MatchMark matches the packet mark (or, with Conn, the conntrack mark).
// A zero Mask means 0xffffffff.
type MatchMark struct {
	Conn   bool
	Value  uint32
	Mask   uint32
	Negate bool
}

// FullMask is the mask a Mask field stands for: zero means all 32 bits.
func FullMask(m uint32) uint32 {
	if m == 0 {
		return 0xffffffff
	}
	return m
}

// SortedPorts is ports sorted and without repeats: a port list or port
// set as the kernel keeps it, where order and repeats do not count.
func SortedPorts(ports []uint16) []uint16 {
	out := slices.Clone(ports)
	slices.Sort(out)
	return slices.Compact(out)
}

// MatchCTState matches conntrack states.
type MatchCTState struct {
	States CTState
	Negate bool
}

// CTState is a bitmask of conntrack states (the kernel's NF_CT_STATE bits).
type CTState uint32

const (
	CTStateInvalid     CTState = 1 << 0
	CTStateEstablished CTState = 1 << 1
	CTStateRelated     CTState = 1 << 2
	CTStateNew         CTState = 1 << 3
)

func (MatchProto) isMatch()   {}
func (MatchPort) isMatch()    {}
func (MatchAddr) isMatch()    {}
func (MatchSet) isMatch()     {}
func (MatchIface) isMatch()   {}
func (MatchOwner) isMatch()   {}
func (MatchMark) isMatch()    {}
func (MatchCTState) isMatch() {}

// Verdict is what a rule does when it matches: Accept, Drop, Return, Jump,
// Redirect and TProxy are terminal; SetMark, SaveMark, RestoreMark and
// SetCTZone let evaluation continue, as their iptables targets do.
type Verdict interface{ isVerdict() }

type (
	// Accept ends evaluation of the current base chain's table with accept.
	Accept struct{}
	// Drop drops the packet.
	Drop struct{}
	// Return returns to the calling chain (in a base chain: its policy, accept).
	Return struct{}
	// Jump calls a regular chain of the same table.
	Jump struct{ Chain string }
	// Redirect is a nat REDIRECT to a local port (needs MatchProto first).
	Redirect struct{ Port uint16 }
	// TProxy assigns the packet to a local transparent socket on Port and sets
	// Mark/Mask; the rule's Family must be IPv4 or IPv6.
	TProxy struct {
		Port uint16
		Mark uint32
		Mask uint32
	}
	// SetMark sets the packet mark (non-terminal).
	SetMark struct{ Mark uint32 }
	// SaveMark copies the packet mark to the conntrack mark (CONNMARK --save-mark).
	SaveMark struct{}
	// RestoreMark copies the conntrack mark to the packet mark (CONNMARK --restore-mark).
	RestoreMark struct{}
	// SetCTZone puts the packet's connection in a conntrack zone (raw table;
	// the first zone assigned wins).
	SetCTZone struct{ Zone uint16 }
)

func (Accept) isVerdict()      {}
func (Drop) isVerdict()        {}
func (Return) isVerdict()      {}
func (Jump) isVerdict()        {}
func (Redirect) isVerdict()    {}
func (TProxy) isVerdict()      {}
func (SetMark) isVerdict()     {}
func (SaveMark) isVerdict()    {}
func (RestoreMark) isVerdict() {}
func (SetCTZone) isVerdict()   {}

// Table returns the table with the given name, or nil.
func (p *Plan) Table(name TableName) *Table {
	return find(p.Tables, func(t Table) bool { return t.Name == name })
}

// Set returns the set with the given name, or nil.
func (p *Plan) Set(name string) *Set {
	return find(p.Sets, func(s Set) bool { return s.Name == name })
}

// Chain returns the chain with the given name, or nil.
func (t *Table) Chain(name string) *Chain {
	return find(t.Chains, func(c Chain) bool { return c.Name == name })
}

// find returns the first element of s for which f holds, or nil.
func find[T any](s []T, f func(T) bool) *T {
	if i := slices.IndexFunc(s, f); i >= 0 {
		return &s[i]
	}
	return nil
}

// Empty reports whether the plan installs nothing.
func (p *Plan) Empty() bool {
	return len(p.Tables) == 0 && len(p.Routes) == 0 && len(p.LoopbackAddrs) == 0
}
