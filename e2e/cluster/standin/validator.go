package standin

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/nftmesh/nftmesh/redirect/quote"
)

// ValidatorFailed is the exit code of a failed validation. It is Linkerd's
// (linkerd-network-validator exits 95, EOPNOTSUPP, on any failure, timeout
// or signal), which Linkerd's repair controller and nftmesh's look for.
const ValidatorFailed = 95

// ListenerValidator names the validator's own server in its events.
const ListenerValidator = "validator"

// Validator is linkerd-network-validator's check, done as its source
// (linkerd2-proxy-init validator/) does: serve a random token on the
// proxy's outbound port (Listen), connect to an address nothing answers
// at (Connect) and succeed only when the connection reads that token back,
// which only a redirect to Listen can make happen.
type Validator struct {
	Listen, Connect netip.AddrPort
	Timeout         time.Duration
}

// tokenLen is the token's length with its newline, as Linkerd's.
const tokenLen = 64

// Run validates once within v.Timeout, reporting to log; nil means the
// connection was redirected to the listener.
func (v Validator) Run(ctx context.Context, log *Log) error {
	ctx, cancel := context.WithTimeout(ctx, v.Timeout)
	defer cancel()
	token, err := newToken()
	if err != nil {
		return err
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", v.Listen.String())
	if err != nil {
		return fmt.Errorf("listening on %s: %w", v.Listen, err)
	}
	defer ln.Close()
	log.Emit(Event{Event: EventListening, Listener: ListenerValidator, Local: ln.Addr().String(), Proto: "tcp"})
	go serveToken(ln, token)

	got, err := readFrom(ctx, v.Connect, len(token))
	if err != nil {
		log.Emit(Event{Event: EventDialFailed, Target: v.Connect.String(), Error: err.Error()})
		return fmt.Errorf("connecting to %s: %w", v.Connect, err)
	}
	if string(got) != string(token) {
		err := fmt.Errorf("connecting to %s: read %s, not this validator's token: the connection was not redirected to %s",
			v.Connect, quote.ValueN(string(got), 80), v.Listen)
		log.Emit(Event{Event: EventDialFailed, Target: v.Connect.String(), Error: err.Error()})
		return err
	}
	log.Emit(Event{Event: EventDialed, Target: v.Connect.String()})
	return nil
}

// newToken is 63 random alphanumerics and a newline.
func newToken() ([]byte, error) {
	const alnum = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, tokenLen)
	if _, err := rand.Read(b); err != nil {
		return nil, fmt.Errorf("making the validation token: %w", err)
	}
	for i := range b {
		b[i] = alnum[int(b[i])%len(alnum)]
	}
	b[tokenLen-1] = '\n'
	return b, nil
}

// serveToken writes token to every connection until ln is closed.
func serveToken(ln net.Listener, token []byte) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			_ = c.SetWriteDeadline(time.Now().Add(5 * time.Second))
			_, _ = c.Write(token)
		}()
	}
}

// readFrom connects to addr and reads n bytes (fewer when the peer closes).
func readFrom(ctx context.Context, addr netip.AddrPort, n int) ([]byte, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr.String())
	if err != nil {
		return nil, err
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Now()) })
	defer stop()
	buf := make([]byte, n)
	got, err := io.ReadFull(c, buf)
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		err = nil
	}
	if err != nil && ctx.Err() != nil {
		err = ctx.Err()
	}
	return buf[:got], err
}

// ParseValidatorTimeout reads a --timeout as linkerd-network-validator
// does: digits and a unit of ms, s, m, h or d ("0" alone is zero).
func ParseValidatorTimeout(s string) (time.Duration, error) {
	t := strings.TrimSpace(s)
	i := strings.LastIndexFunc(t, func(r rune) bool { return r >= '0' && r <= '9' })
	if i < 0 {
		return 0, fmt.Errorf("--timeout %s has no number", quote.ValueN(s, 40))
	}
	digits, unit := t[:i+1], t[i+1:]
	n, err := strconv.ParseUint(digits, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("--timeout %s: %s is not a whole number", quote.ValueN(s, 40), quote.ValueN(digits, 40))
	}
	mul := map[string]time.Duration{"ms": time.Millisecond, "s": time.Second, "m": time.Minute, "h": time.Hour, "d": 24 * time.Hour}[unit]
	switch {
	case unit == "" && n == 0:
		return 0, nil
	case mul == 0:
		return 0, fmt.Errorf("--timeout %s: unit %s is not one of ms, s, m, h, d", quote.ValueN(s, 40), quote.ValueN(unit, 20))
	case n > uint64(1<<63-1)/uint64(mul):
		return 0, fmt.Errorf("--timeout %s is too long", quote.ValueN(s, 40))
	}
	return time.Duration(n) * mul, nil
}
