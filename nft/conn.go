package nft

import (
	"fmt"

	"github.com/mdlayher/netlink"
	vnetlink "github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Conn is the backend's way into one network namespace for a caller that
// enters it once for everything it opens there (capture): a netfilter
// netlink socket created from inside the namespace (DialHere), over which
// the caller's look at the tables (Tables) and the backend's batch go.
type Conn struct {
	nf *netlink.Conn
	// dumped is the last Tables answer, until a batch through the Conn
	// changes what the namespace holds; dumpedOK says there is one.
	dumped   []TableRef
	dumpedOK bool
	// spoiled: an exchange failed and may have left replies unread (a
	// refused batch still acks its last command), which the next exchange
	// would take for its own; the backend then opens a socket of its own.
	spoiled bool
}

// TableRef names one nftables table of a namespace.
type TableRef struct {
	Family uint8 // unix.NFPROTO_INET, NFPROTO_IPV4, NFPROTO_IPV6, ...
	Name   string
}

// DialHere opens a netfilter netlink socket in the calling thread's
// network namespace. It must run on a thread inside the namespace
// (hostns.Netns.Do); the socket stays there when the thread leaves.
func DialHere() (*Conn, error) {
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, nil)
	if err != nil {
		return nil, fmt.Errorf("connecting to nftables: %w", err)
	}
	return &Conn{nf: c}, nil
}

// Close closes the socket.
func (c *Conn) Close() error { return c.nf.Close() }

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
	route *vnetlink.Handle
}

// Via returns a copy of b that works in the namespace whose descriptor is
// ns through sockets the caller opened inside it: c (DialHere) and route
// (policyroute.OpenHere). Apply and Remove then open nothing and name their
// netnsPath only in messages; List and Check still read by path. The write
// path still refuses ns when it is the host's. The caller keeps ownership
// of ns, c and route.
func (b *Backend) Via(ns int, c *Conn, route *vnetlink.Handle) *Backend {
	cp := *b
	cp.via = &via{ns: ns, conn: c, route: route}
	return &cp
}
