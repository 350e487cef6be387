package standin

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/nftmesh/nftmesh/internal/sockopt"
	"github.com/nftmesh/nftmesh/redirect/quote"
)

// maxTargetEcho bounds how much of a bad target an error quotes: %q may
// spell a byte as four characters, and a flag error must stay one short line.
const maxTargetEcho = 40

// Target is something a dialer connects to periodically.
type Target struct {
	Proto string // "tcp" or "udp"
	Addr  string // host:port
}

func (t Target) String() string { return t.Proto + "://" + t.Addr }

// ParseTarget reads "host:port" (TCP) or "tcp://host:port" /
// "udp://host:port".
func ParseTarget(s string) (Target, error) {
	t := Target{Proto: "tcp", Addr: s}
	if p, rest, ok := strings.Cut(s, "://"); ok {
		t.Proto, t.Addr = p, rest
	}
	if t.Proto != "tcp" && t.Proto != "udp" {
		return Target{}, fmt.Errorf("target %s: protocol %s is not tcp or udp", quote.ValueN(s, maxTargetEcho), quote.ValueN(t.Proto, 8))
	}
	host, port, err := net.SplitHostPort(t.Addr)
	if err != nil || host == "" || port == "" {
		return Target{}, fmt.Errorf("target %s is not host:port", quote.ValueN(s, maxTargetEcho))
	}
	return t, nil
}

// Dial connects to t once, reads the Reply of whoever answers, and returns
// the event that describes it (EventDialed or EventDialFailed).
func Dial(ctx context.Context, t Target) Event {
	start := time.Now()
	r, local, err := dial(ctx, t)
	uid, gid := Identity()
	e := Event{Event: EventDialed, Proto: t.Proto, Target: t.Addr, Local: local, UID: uid, GID: gid,
		TookMS: float64(time.Since(start).Microseconds()) / 1000}
	if err != nil {
		e.Event = EventDialFailed
		e.Error = err.Error()
		return e
	}
	e.Reply = &r
	return e
}

// dial returns the Reply and the local address the connection left from.
func dial(ctx context.Context, t Target) (Reply, string, error) {
	ctx, cancel := context.WithTimeout(ctx, ioTimeout)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, t.Proto, t.Addr)
	if err != nil {
		return Reply{}, "", fmt.Errorf("connecting to %s: %w", t, err)
	}
	defer c.Close()
	local := sockopt.AddrPort(c.LocalAddr()).String()
	_ = c.SetDeadline(time.Now().Add(ioTimeout))
	var b []byte
	if t.Proto == "udp" {
		if _, err := c.Write([]byte("standin\n")); err != nil {
			return Reply{}, local, fmt.Errorf("sending to %s: %w", t, err)
		}
		buf := make([]byte, 1500)
		n, err := c.Read(buf)
		if err != nil {
			return Reply{}, local, fmt.Errorf("reading the reply of %s: %w", t, err)
		}
		b = buf[:n]
	} else {
		line, err := bufio.NewReader(c).ReadBytes('\n')
		if err != nil {
			return Reply{}, local, fmt.Errorf("reading the reply of %s: %w", t, err)
		}
		b = line
	}
	var r Reply
	if err := json.Unmarshal(b, &r); err != nil {
		return Reply{}, local, fmt.Errorf("reading the reply of %s: %s is not a stand-in reply: %w", t, quote.ValueN(string(b), 100), err)
	}
	return r, local, nil
}

// DialLoop dials every target once per period until ctx ends, logging one
// event per attempt. The first round starts at once.
func DialLoop(ctx context.Context, log *Log, targets []Target, every time.Duration) {
	if len(targets) == 0 {
		return
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		for _, t := range targets {
			e := Dial(ctx, t)
			if ctx.Err() != nil {
				return
			}
			log.Emit(e)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}
