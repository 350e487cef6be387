package nft

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/nftmesh/nftmesh/redirect"
)

// This file is where the backend goes beneath google/nftables' public API,
// for what the library (v0.3.0, the newest release the module proxy serves)
// does not do, or (1) what costs the agent's ADD a measured price or fails
// a large plan; all else (marshalling every batch, reading back tables,
// chains, sets and elements, deleting the table) uses the library as
// documented. Re-check
// this file on upgrade: TestUpstreamStillMisreads fails once a release no
// longer needs a piece of 2.
//
//  1. The ADD's creating batch is marshalled by google/nftables (batch.go's
//     marshal), kept per plan (created) and sent here (sendBatch) on a raw
//     socket: Conn.Flush asks the kernel to echo every new rule (upstream
//     still does at 1db35da, Nov 2025, to learn rule handles) and reads each
//     message's replies one by one; docs/dependencies.md has the figures and
//     what would let it go. A replacing batch goes the same way (marshalled
//     when needed, not kept): with Flush, the echoes of ~170 rules
//     overflowed the socket's receive buffer (ENOBUFS). forceSendBuffer,
//     also passed to the library as a SockOption, grows a send buffer for a
//     large batch, which v0.3.0 does not (upstream does since #312,
//     unreleased). (batch.go's fits guards
//     the write path too: v0.3.0 cuts an element list's length over 64 KiB
//     to 16 bits.)
//  2. The rule dump, read on our own socket and decoded here with the
//     library's expression types (dumpRules), not by Conn.GetRules, which in
//     v0.3.0 (a) drops NFTA_CT_SREG, so "ct mark set" reads as "ct mark"
//     (fixed upstream by #301, unreleased); (b) skips tproxy and any unknown
//     expression instead of failing, so a rule we did not write could read as
//     ours (upstream at 1db35da has no "tproxy" case where it reads rules
//     either, and its TProxy reads the 4-byte family as one byte); (c)
//     panics on a short verdict (still so at 1db35da), which unmarshalExpr
//     turns into an error.
//  3. A table's flags: v0.3.0 reads the big-endian NFTA_TABLE_FLAGS in host
//     order (dormant reads as 0x1000000 on amd64) and writes none (#332
//     reads and writes them right, unreleased); tableFlags reads them right.

// batchTimeout bounds the wait for acks, normally queued by the time
// sendmsg returns.
const batchTimeout = 10 * time.Second

// sendBatch sends msgs in one sendmsg. Only the last command asks for an
// ack: the kernel reports a failing command whether asked or not, in order,
// so the last one's ack (or the first error before it) ends the wait, one
// receive instead of one per rule.
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

// msgsSize is the size of msgs on the wire.
func msgsSize(msgs []netlink.Message) int {
	n := 0
	for _, m := range msgs {
		n += 16 + len(m.Data) + 4
	}
	return n
}

func dialRaw(ns netns.NsHandle) (*netlink.Conn, error) {
	return netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: int(ns)})
}

// forceSendBuffer makes a socket's send buffer hold n bytes.
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

// tableFlags is t's NFTA_TABLE_FLAGS as the kernel sent them (3 above).
func tableFlags(t *nftables.Table) redirect.TableFlags {
	var b [4]byte
	binary.NativeEndian.PutUint32(b[:], t.Flags)
	return redirect.TableFlags(binary.BigEndian.Uint32(b[:]))
}

// liveRule is one rule as dumped by the kernel, its expressions parsed.
type liveRule struct {
	chain  string
	handle uint64
	exprs  []any
}

// tproxyExpr is the kernel's tproxy expression, which google/nftables
// cannot parse back (2b above).
type tproxyExpr struct {
	family  uint32
	regAddr uint32
	regPort uint32
}

// dumpRules reads every rule of the inet table in one dump (2 above).
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
	// What we cannot parse is content, not a failure to read (see
	// redirect.UnreadableError).
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
	var exprData []byte
	err := walkAttrs(b, func(ad *netlink.AttributeDecoder) error {
		switch ad.Type() {
		case unix.NFTA_RULE_CHAIN:
			r.chain = ad.String()
		case unix.NFTA_RULE_HANDLE:
			r.handle = ad.Uint64()
		case unix.NFTA_RULE_EXPRESSIONS:
			exprData = ad.Bytes()
		}
		return nil
	})
	if err != nil {
		return r, fmt.Errorf("parsing rule: %w", err)
	}
	if r.exprs, err = parseExprs(exprData); err != nil {
		return r, fmt.Errorf("chain %s rule handle %d: %w", r.chain, r.handle, err)
	}
	return r, nil
}

func parseExprs(b []byte) ([]any, error) {
	var out []any
	err := walkAttrs(b, func(list *netlink.AttributeDecoder) error {
		var name string
		var data []byte
		err := walkAttrs(list.Bytes(), func(ad *netlink.AttributeDecoder) error {
			switch ad.Type() {
			case unix.NFTA_EXPR_NAME:
				name = ad.String()
			case unix.NFTA_EXPR_DATA:
				data = ad.Bytes()
			}
			return nil
		})
		if err != nil {
			return err
		}
		e, err := parseExpr(name, data)
		if err != nil {
			return fmt.Errorf("expression %q: %w", name, err)
		}
		out = append(out, e)
		return nil
	})
	return out, err
}

var errUnknownExpr = errors.New("unknown expression type")

// parseExpr parses one expression; with an error, the value is not to be used.
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
		// Parsed here for NFTA_CT_SREG (2a above).
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
		return c, err
	case "redir":
		e = &expr.Redir{}
	case "immediate":
		imm := &expr.Immediate{}
		if err := unmarshalExpr(fam, data, imm); err != nil || imm.Register != unix.NFT_REG_VERDICT {
			return imm, err
		}
		v := &expr.Verdict{}
		return v, unmarshalExpr(fam, data, v)
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
		return t, err
	default:
		return nil, errUnknownExpr
	}
	return e, unmarshalExpr(fam, data, e)
}

// unmarshalExpr is expr.Unmarshal with its panics on malformed attributes
// (2c above) turned into errors: a netlink dump must never crash us.
func unmarshalExpr(fam byte, data []byte, e expr.Any) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("malformed expression attributes: %v", r)
		}
	}()
	return expr.Unmarshal(fam, data, e)
}
