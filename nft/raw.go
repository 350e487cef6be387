package nft

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/nftmesh/nftmesh/redirect"
)

// This file is where the backend goes beneath google/nftables' public Conn
// API, each time for a reason given below; everything else (the read path's
// tables, chains and sets, expression types, marshalling) uses the library
// as documented. Keeping the three reaches here means one file to re-check
// when google/nftables is upgraded:
//  1. the batch is written by us (wire.go) and sent by us (sendBatch):
//     Conn.Flush asks for an echo of every rule;
//  2. GETTABLE requests sent by hand on that same raw socket: one table
//     by name (tableExistsRaw), every table in one dump (Conn.Tables);
//  3. the rule dump decoded by us (dumpRules): Conn.GetRules drops
//     expressions it does not know and misreads tproxy and ct set.

// 1. The write path: the program is made of google/nftables' objects
// (tables, chains, sets, expressions), wire.go writes the batch those
// objects marshal to, byte for byte (checked against google/nftables in
// TestWireMatchesGoogle), and sendBatch sends it over a raw netlink
// socket. Why not Conn.Flush: it marks every rule NLM_F_ECHO,
// so the kernel builds a full notification of each new rule and unicasts it
// back, and Flush then reads every reply with two recvmsg calls. For the default pod plan that
// was about half of Apply (profiled: kernel nf_tables_rule_notify ~18% of
// the batch, the receive loop as much again). We send the same messages in
// one sendmsg without NLM_F_ECHO and count the acks.

// batchTimeout bounds the wait for acks; the kernel processes a batch
// inside sendmsg, so they are normally queued before we read.
const batchTimeout = 10 * time.Second

// sendBatch sends msgs in one sendmsg. Only the last command asks for an
// ack: the kernel reports a failing command whether asked or not, in order,
// and answers the acked last command after all others, so its ack (or the
// first error before it) ends the wait. One reply instead of one per
// command saves a receive per rule. The kernel commits the batch whole or
// not at all.
func sendBatch(conn *netlink.Conn, msgs []netlink.Message) error {
	last := -1
	for i := range msgs {
		msgs[i].Header.Flags &^= netlink.Acknowledge
		if t := msgs[i].Header.Type; t != unix.NFNL_MSG_BATCH_BEGIN && t != unix.NFNL_MSG_BATCH_END {
			last = i
		}
	}
	if last < 0 {
		return nil
	}
	msgs[last].Header.Flags |= netlink.Acknowledge
	if err := conn.SetReadDeadline(time.Now().Add(batchTimeout)); err != nil {
		return err
	}
	defer conn.SetReadDeadline(time.Time{})
	if _, err := conn.SendMessages(msgs); err != nil {
		return fmt.Errorf("sending batch: %w", err)
	}
	seq := msgs[last].Header.Sequence
	for {
		replies, err := conn.Receive()
		if err != nil {
			if isTransport(err) {
				return fmt.Errorf("reading batch acks: %w", err)
			}
			// The kernel refused a command; the batch was rolled back.
			return err
		}
		for _, r := range replies {
			if r.Header.Type == netlink.Error && r.Header.Sequence == seq {
				return nil
			}
		}
	}
}

// isTransport tells socket-level failures (timeout, buffer overrun) from
// errors the kernel reported for a message.
func isTransport(err error) bool {
	return errors.Is(err, unix.ENOBUFS) || errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) ||
		errors.Is(err, os.ErrDeadlineExceeded)
}

// dialRaw opens a netfilter netlink socket in the namespace.
func dialRaw(ns netns.NsHandle) (*netlink.Conn, error) {
	return netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: int(ns)})
}

func batchSize(msgs []netlink.Message) int {
	n := 0
	for _, m := range msgs {
		n += 16 + len(m.Data) + 4
	}
	return n
}

// 2. Requests sent by hand on the raw socket the batch goes over, so the
// write path needs no second (google/nftables) connection: tableExistsRaw
// asks for our table by name, one request, one reply; Conn.Tables dumps
// every table's family and name for backend selection, and the batch's
// choice between create and replace is read from the same answer.
func tableExistsRaw(conn *netlink.Conn, table string) (bool, error) {
	attrs, err := netlink.MarshalAttributes([]netlink.Attribute{{Type: unix.NFTA_TABLE_NAME, Data: []byte(table + "\x00")}})
	if err != nil {
		return false, err
	}
	_, err = conn.Execute(netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETTABLE), Flags: netlink.Request},
		Data:   append([]byte{unix.NFPROTO_INET, unix.NFNETLINK_V0, 0, 0}, attrs...),
	})
	switch {
	case err == nil:
		return true, nil
	case isNotExist(err):
		return false, nil
	}
	return false, fmt.Errorf("querying table inet %s: %w", table, err)
}

// Tables lists every nftables table of the namespace, of every family, in
// one dump. A Backend working through c (Via) takes whether its table exists
// from this answer instead of asking again; the caller's lock on the
// namespace keeps the answer true until the backend's batch.
func (c *Conn) Tables() ([]TableRef, error) {
	msgs, err := c.nf.Execute(netlink.Message{
		Header: netlink.Header{
			Type:  netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETTABLE),
			Flags: netlink.Request | netlink.Dump,
		},
		Data: []byte{unix.NFPROTO_UNSPEC, unix.NFNETLINK_V0, 0, 0},
	})
	if err != nil {
		return nil, fmt.Errorf("dumping tables: %w", err)
	}
	out := make([]TableRef, 0, len(msgs))
	for _, m := range msgs {
		t, err := parseTable(m.Data)
		if err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	c.dumped, c.dumpedOK = out, true
	return out, nil
}

// parseTable reads one NFT_MSG_NEWTABLE message of a dump: the family from
// its nfgenmsg, the name from NFTA_TABLE_NAME.
func parseTable(b []byte) (TableRef, error) {
	if len(b) < 4 {
		return TableRef{}, fmt.Errorf("short table message (%d bytes)", len(b))
	}
	t := TableRef{Family: b[0]}
	err := walkAttrs(b[4:], func(ad *netlink.AttributeDecoder) error {
		if ad.Type() == unix.NFTA_TABLE_NAME {
			t.Name = ad.String()
		}
		return nil
	})
	if err != nil {
		return TableRef{}, fmt.Errorf("parsing table message: %w", err)
	}
	if t.Name == "" {
		return TableRef{}, fmt.Errorf("table message of family %d without a name", t.Family)
	}
	return t, nil
}

// forceSendBuffer makes the raw socket's send buffer hold a whole batch,
// which goes out in one sendmsg.
func forceSendBuffer(c *netlink.Conn, n int) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		// SO_SNDBUFFORCE ignores net.core.wmem_max (we run as root);
		// fall back to SO_SNDBUF when not permitted.
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, n)
		if serr != nil {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUF, n)
		}
	}); err != nil {
		return err
	}
	return serr
}

// 3. The rule dump, read and decoded here (google/nftables' expr types,
// our attribute walk): see dumpRules for why not Conn.GetRules.

// liveRule is one rule as dumped by the kernel, its expressions parsed.
type liveRule struct {
	chain  string
	handle uint64
	exprs  []any
}

// tproxyExpr is the kernel's tproxy expression. google/nftables v0.3.0 can
// marshal it but not parse it back (it skips unknown names silently and
// reads the 4-byte family as one byte), so the dump decodes it here.
type tproxyExpr struct {
	family  uint32
	regAddr uint32
	regPort uint32
}

// dumpRules reads every rule of the inet table in one dump. It decodes the
// expressions itself instead of using Conn.GetRules so that an expression
// type we do not know is an error rather than silently dropped.
func dumpRules(conn *netlink.Conn, table string) ([]liveRule, error) {
	attrs, err := netlink.MarshalAttributes([]netlink.Attribute{
		{Type: unix.NFTA_RULE_TABLE, Data: []byte(table + "\x00")},
	})
	if err != nil {
		return nil, err
	}
	msgs, err := conn.Execute(netlink.Message{
		Header: netlink.Header{
			Type:  netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETRULE),
			Flags: netlink.Request | netlink.Dump,
		},
		Data: append([]byte{unix.NFPROTO_INET, unix.NFNETLINK_V0, 0, 0}, attrs...),
	})
	if err != nil {
		return nil, fmt.Errorf("dumping rules of table %s: %w", table, err)
	}
	// What the kernel answered but we cannot parse (an expression nftmesh
	// does not write) is content, not a failure to read: see
	// redirect.UnreadableError.
	out := make([]liveRule, 0, len(msgs))
	for _, m := range msgs {
		if len(m.Data) < 4 {
			return nil, redirect.Unreadable(fmt.Errorf("short rule message (%d bytes)", len(m.Data)))
		}
		r, err := parseRule(m.Data[4:])
		if err != nil {
			return nil, redirect.Unreadable(err)
		}
		out = append(out, r)
	}
	return out, nil
}

// walkAttrs calls fn for each netlink attribute in b, read big-endian as
// nf_tables writes its attributes, and returns the decoder's error.
func walkAttrs(b []byte, fn func(ad *netlink.AttributeDecoder) error) error {
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return err
	}
	ad.ByteOrder = binary.BigEndian
	for ad.Next() {
		if err := fn(ad); err != nil {
			return err
		}
	}
	return ad.Err()
}

func parseRule(b []byte) (liveRule, error) {
	var r liveRule
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return r, err
	}
	ad.ByteOrder = binary.BigEndian
	var exprData []byte
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_RULE_CHAIN:
			r.chain = ad.String()
		case unix.NFTA_RULE_HANDLE:
			r.handle = ad.Uint64()
		case unix.NFTA_RULE_EXPRESSIONS:
			exprData = ad.Bytes()
		}
	}
	if err := ad.Err(); err != nil {
		return r, fmt.Errorf("parsing rule: %w", err)
	}
	r.exprs, err = parseExprs(exprData)
	if err != nil {
		return r, fmt.Errorf("chain %s rule handle %d: %w", r.chain, r.handle, err)
	}
	return r, nil
}

func parseExprs(b []byte) ([]any, error) {
	list, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return nil, err
	}
	var out []any
	for list.Next() {
		ad, err := netlink.NewAttributeDecoder(list.Bytes())
		if err != nil {
			return nil, err
		}
		ad.ByteOrder = binary.BigEndian
		var name string
		var data []byte
		for ad.Next() {
			switch ad.Type() {
			case unix.NFTA_EXPR_NAME:
				name = ad.String()
			case unix.NFTA_EXPR_DATA:
				data = ad.Bytes()
			}
		}
		if err := ad.Err(); err != nil {
			return nil, err
		}
		e, err := parseExpr(name, data)
		if err != nil {
			return nil, fmt.Errorf("expression %q: %w", name, err)
		}
		out = append(out, e)
	}
	return out, list.Err()
}

var errUnknownExpr = errors.New("unknown expression type")

func parseExpr(name string, data []byte) (any, error) {
	const fam = unix.NFPROTO_INET
	var e expr.Any
	switch name {
	case "meta":
		e = &expr.Meta{}
	case "cmp":
		e = &expr.Cmp{}
	case "payload":
		e = &expr.Payload{}
	case "bitwise":
		e = &expr.Bitwise{}
	case "lookup":
		e = &expr.Lookup{}
	case "ct":
		// Parsed here: google/nftables drops NFTA_CT_SREG, which is what
		// tells "ct mark set" from "ct mark".
		c := &expr.Ct{}
		err := walkAttrs(data, func(ad *netlink.AttributeDecoder) error {
			switch ad.Type() {
			case unix.NFTA_CT_KEY:
				c.Key = expr.CtKey(ad.Uint32())
			case unix.NFTA_CT_DREG:
				c.Register = ad.Uint32()
			case unix.NFTA_CT_SREG:
				c.Register, c.SourceRegister = ad.Uint32(), true
			case unix.NFTA_CT_DIRECTION:
				return fmt.Errorf("ct with a direction is not ours")
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		return c, nil
	case "redir":
		e = &expr.Redir{}
	case "immediate":
		imm := &expr.Immediate{}
		if err := unmarshalExpr(fam, data, imm); err != nil {
			return nil, err
		}
		if imm.Register != unix.NFT_REG_VERDICT {
			return imm, nil
		}
		v := &expr.Verdict{}
		if err := unmarshalExpr(fam, data, v); err != nil {
			return nil, err
		}
		return v, nil
	case "tproxy":
		t := &tproxyExpr{}
		err := walkAttrs(data, func(ad *netlink.AttributeDecoder) error {
			switch ad.Type() {
			case expr.NFTA_TPROXY_FAMILY:
				t.family = ad.Uint32()
			case expr.NFTA_TPROXY_REG_ADDR:
				t.regAddr = ad.Uint32()
			case expr.NFTA_TPROXY_REG_PORT:
				t.regPort = ad.Uint32()
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		return t, nil
	default:
		return nil, errUnknownExpr
	}
	if err := unmarshalExpr(fam, data, e); err != nil {
		return nil, err
	}
	return e, nil
}

// unmarshalExpr is expr.Unmarshal that reports malformed attributes as an
// error: google/nftables v0.3.0 indexes some of them without a length check
// (a short verdict panics), and what we decode comes from a netlink dump we
// must never crash on.
func unmarshalExpr(fam byte, data []byte, e expr.Any) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("malformed expression attributes: %v", r)
		}
	}()
	return expr.Unmarshal(fam, data, e)
}
