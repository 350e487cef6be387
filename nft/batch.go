package nft

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// The write path: google/nftables builds and marshals the batch (tables,
// chains, sets, rules, expressions), and this file sends it.
//
// Why not Conn.Flush: it marks every rule NLM_F_ECHO, so the kernel builds a
// full notification of each new rule and unicasts it back, and Flush then
// reads every reply with two recvmsg calls. For the default pod plan that
// was about half of Apply (profiled: kernel nf_tables_rule_notify ~18% of
// the batch, the receive loop as much again). We send the same messages in
// one sendmsg without NLM_F_ECHO and count the acks.

// marshalBatch runs build against a google/nftables Conn that talks to no
// kernel and returns the netlink messages it would have sent, batch
// begin/end included.
func marshalBatch(build func(cc *nftables.Conn) error) ([]netlink.Message, error) {
	var msgs []netlink.Message
	cc, err := nftables.New(nftables.WithTestDial(func(req []netlink.Message) ([]netlink.Message, error) {
		msgs = append(msgs, req...)
		// Acknowledge everything so Flush returns; nothing was applied yet.
		acks := make([]netlink.Message, 0, len(req))
		for _, m := range req {
			acks = append(acks, netlink.Message{
				Header: netlink.Header{Type: netlink.Error, Sequence: m.Header.Sequence, PID: m.Header.PID},
				Data:   make([]byte, 4),
			})
		}
		return acks, nil
	}))
	if err != nil {
		return nil, err
	}
	if err := build(cc); err != nil {
		return nil, err
	}
	if err := cc.Flush(); err != nil {
		return nil, fmt.Errorf("marshalling batch: %w", err)
	}
	for i := range msgs {
		h := &msgs[i].Header
		h.Flags &^= unix.NLM_F_ECHO
		// Let the real connection number and size them.
		h.Sequence, h.PID, h.Length = 0, 0, 0
	}
	return msgs, nil
}

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

// tableExistsRaw asks for our table by name: one request, one reply.
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
