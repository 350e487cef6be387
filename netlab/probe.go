package netlab

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"syscall"
	"time"

	"github.com/nftmesh/nftmesh/redirect"
)

// From says where a probe is sent from.
type From uint8

const (
	// FromApp sends from inside the pod, as Probe.UID/GID (the app, or the
	// proxy when they are the proxy's IDs).
	FromApp From = iota
	// FromPassthrough sends from inside the pod with source 127.0.0.6 (or
	// ::6 for an IPv6 destination), as Envoy does to reach the app.
	FromPassthrough
	// FromPeer sends from the peer namespace over the veth: inbound traffic.
	FromPeer
)

var fromNames = [...]string{FromApp: "pod", FromPassthrough: "passthrough", FromPeer: "peer"}

func (f From) String() string {
	if int(f) < len(fromNames) {
		return fromNames[f]
	}
	return fmt.Sprintf("from(%d)", uint8(f))
}

// AppUID / AppGID are the identity of the "app" in probes.
const (
	AppUID uint32 = 1000
	AppGID uint32 = 1000
)

// Probe is one connection (TCP) or query (UDP) to send.
type Probe struct {
	From From
	// UID and GID the sending socket is created with (FromApp,
	// FromPassthrough), as seen inside the pod (see
	// TopologyOptions.PodUIDBase). The peer always sends as root.
	UID, GID uint32
	Proto    redirect.Proto // ProtoTCP or ProtoUDP
	Dst      netip.AddrPort
}

func (p Probe) String() string {
	who := p.From.String()
	if p.From != FromPeer {
		who = fmt.Sprintf("%s uid=%d gid=%d", who, p.UID, p.GID)
	}
	return fmt.Sprintf("%s → %s/%s", who, p.Dst, p.Proto)
}

// Outcomes of a probe that reached no listener.
const (
	LandedRefused = "refused"
	LandedTimeout = "timeout"
)

// Result is where a probe landed.
type Result struct {
	// Landed is the listener's name (see Reply.Listener), LandedRefused,
	// LandedTimeout, or "error: ..." when the probe could not be sent.
	Landed string
	// OrigDst is the original destination the listener saw.
	OrigDst netip.AddrPort
	// Local is the address the listener's socket had (after NAT).
	Local netip.AddrPort
}

func (r Result) String() string {
	if !r.OrigDst.IsValid() {
		return r.Landed
	}
	return fmt.Sprintf("%s (orig %s)", r.Landed, r.OrigDst)
}

// Probe sends p and reports where it landed. Every step has a 2 s deadline.
func (t *Topology) Probe(p Probe) Result {
	ns := t.PodNetnsPath()
	var c *creds
	var local netip.Addr
	switch p.From {
	case FromApp:
		c = t.hostCreds(p.UID, p.GID)
	case FromPassthrough:
		c, local = t.hostCreds(p.UID, p.GID), PassthroughV4
		if p.Dst.Addr().Is6() {
			local = PassthroughV6
		}
	case FromPeer:
		ns = t.PeerNetnsPath()
	default:
		return Result{Landed: fmt.Sprintf("error: unknown probe source %d", p.From)}
	}
	var line []byte
	err := inNetns(ns, c, func() error {
		var err error
		line, err = exchange(p.Proto, local, p.Dst)
		return err
	})
	if err != nil {
		return Result{Landed: classify(err)}
	}
	var r Reply
	if err := json.Unmarshal(line, &r); err != nil {
		return Result{Landed: fmt.Sprintf("error: bad reply %q: %v", line, err)}
	}
	orig, _ := netip.ParseAddrPort(r.Orig)
	loc, _ := netip.ParseAddrPort(r.Local)
	return Result{Landed: r.Listener, OrigDst: orig, Local: loc}
}

// exchange connects (creating the socket on the calling thread, so it gets
// that thread's namespace and identity), sends one line or datagram and
// reads the listener's answer.
func exchange(proto redirect.Proto, local netip.Addr, dst netip.AddrPort) ([]byte, error) {
	if proto != redirect.ProtoTCP && proto != redirect.ProtoUDP {
		return nil, fmt.Errorf("probing with protocol %s: unsupported", proto)
	}
	conn, err := dial(proto, local, dst)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(ioTimeout))
	if proto == redirect.ProtoUDP {
		if _, err := conn.Write([]byte("probe\n")); err != nil {
			return nil, err
		}
		buf := make([]byte, 1500)
		n, err := conn.Read(buf)
		if err != nil {
			return nil, err
		}
		return buf[:n], nil
	}
	return bufio.NewReader(conn).ReadBytes('\n')
}

func classify(err error) string {
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return LandedRefused
	case errors.Is(err, os.ErrDeadlineExceeded), errors.Is(err, context.DeadlineExceeded):
		return LandedTimeout
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return LandedTimeout
	}
	return "error: " + err.Error()
}
