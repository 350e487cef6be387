package kubeconf

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"sync"
)

// Guard wraps the innermost transport of a client-go client (rest.Config's
// WrapTransport), where requests already carry their credentials, so that
// whatever the client makes of an answer cannot hold them:
//
//   - An error answer (not 2xx) is read (up to MaxErrorBody) and every
//     credential of the request in it is replaced by Redacted: an API
//     server or a proxy may echo the request, Authorization header
//     included, in an error page, which client-go puts into its error, and
//     so into CNI errors (kubelet events) and logs. So are Warning headers,
//     which client-go logs.
//   - A redirect (3xx) is not followed: client-go would send the bearer
//     token to wherever it points. It is a RedirectError.
//   - With maxBody > 0, a 2xx answer longer than maxBody fails with
//     ErrAnswerTooLarge instead of growing the client's memory until the
//     deadline (client-go reads an answer whole); a watch, a long stream,
//     is bounded per event instead (see Limits).
func Guard(maxBody int64) func(http.RoundTripper) http.RoundTripper {
	return GuardLimits(Limits{Object: maxBody, List: maxBody, Event: maxBody})
}

// GuardLimits is Guard with a bound of its own for each kind of answer.
func GuardLimits(l Limits) func(http.RoundTripper) http.RoundTripper {
	return func(rt http.RoundTripper) http.RoundTripper { return &guard{next: rt, limits: l} }
}

// MaxErrorBody bounds what Guard reads of an error answer: client-go quotes
// at most 2 KiB of an unstructured one, and a Status is far smaller.
const MaxErrorBody = 1 << 20

// ErrAnswerTooLarge: an answer went over Guard's bound.
var ErrAnswerTooLarge = errors.New("the API server's answer is too large")

// RedirectError is a 3xx answer, which Guard does not follow.
type RedirectError struct {
	Code     int
	Location string // where it pointed, without credentials or query
}

func (e *RedirectError) Error() string {
	if e.Location == "" {
		return fmt.Sprintf("the API server answered with a redirect (HTTP %d) and no Location; redirects are not followed", e.Code)
	}
	return fmt.Sprintf("the API server answered with a redirect (HTTP %d) to %s; redirects are not followed (the credentials are for this server only)", e.Code, e.Location)
}

type guard struct {
	next   http.RoundTripper
	limits Limits
}

func (g *guard) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := g.next.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	secrets := RequestSecrets(req)
	w := resp.Header.Values("Warning") // the header's own slice, edited in place
	for i := range w {
		w[i] = Redact(w[i], secrets...)
	}
	switch {
	case resp.StatusCode >= 300 && resp.StatusCode < 400:
		resp.Body.Close()
		return nil, &RedirectError{Code: resp.StatusCode, Location: Redact(safeLocation(resp.Header.Get("Location")), secrets...)}
	case resp.StatusCode < 200 || resp.StatusCode > 299:
		body, rerr := io.ReadAll(io.LimitReader(resp.Body, MaxErrorBody))
		resp.Body.Close()
		if rerr != nil {
			return nil, fmt.Errorf("reading the API server's HTTP %d answer: %w", resp.StatusCode, rerr)
		}
		body = []byte(Redact(string(body), secrets...))
		resp.Body = io.NopCloser(bytes.NewReader(body))
		resp.ContentLength = int64(len(body))
		resp.Header.Del("Content-Length")
	default:
		resp.Body = g.limits.bound(req, resp)
	}
	return resp, nil
}

// capped is a body that fails once more than its bound has been read.
type capped struct {
	r    io.ReadCloser
	left int64
	max  int64
}

func (c *capped) Read(p []byte) (int, error) {
	if c.left <= 0 {
		// One more byte tells a body of exactly the bound from a longer one.
		var one [1]byte
		if n, err := c.r.Read(one[:]); n == 0 {
			return 0, err
		}
		return 0, fmt.Errorf("%w: over %d bytes", ErrAnswerTooLarge, c.max)
	}
	if int64(len(p)) > c.left {
		p = p[:c.left]
	}
	n, err := c.r.Read(p)
	c.left -= int64(n)
	return n, err
}

func (c *capped) Close() error { return c.r.Close() }

// safeLocation is a Location header without user info, query or fragment
// (which may carry tokens), bounded.
func safeLocation(loc string) string {
	u, err := url.Parse(loc)
	if err != nil {
		return "(an unparsable Location)"
	}
	u.User, u.RawQuery, u.Fragment, u.RawFragment, u.ForceQuery = nil, "", "", "", false
	s := u.String()
	if len(s) > 256 {
		s = s[:256] + "..."
	}
	return fmt.Sprintf("%q", s)
}

// RequestSecrets are the credentials req carries: its Authorization and
// Proxy-Authorization values whole, their credentials alone, and for basic
// auth the password.
func RequestSecrets(req *http.Request) []string {
	var out []string
	for _, h := range []string{"Authorization", "Proxy-Authorization"} {
		for _, v := range req.Header.Values(h) {
			out = append(out, v)
			scheme, cred, ok := strings.Cut(v, " ")
			if !ok {
				continue
			}
			cred = strings.TrimSpace(cred)
			out = append(out, cred)
			if strings.EqualFold(scheme, "Basic") {
				if dec, err := base64.StdEncoding.DecodeString(cred); err == nil {
					out = append(out, string(dec))
					if _, pass, ok := strings.Cut(string(dec), ":"); ok {
						out = append(out, pass)
					}
				}
			}
		}
	}
	return out
}

// Redacted replaces a credential.
const Redacted = "[redacted]"

// minSecret: shorter secrets are not replaced where they stand alone (a
// one-letter "token" would blank every such letter); after "Bearer " they
// still are.
const minSecret = 6

// Redact returns s with every secret (at least minSecret bytes long) and
// whatever follows "Bearer " or "Basic " (any case) replaced by Redacted.
func Redact(s string, secrets ...string) string {
	for _, sec := range secrets {
		if len(sec) >= minSecret {
			s = strings.ReplaceAll(s, sec, Redacted)
		}
	}
	return schemeCredential().ReplaceAllString(s, "${1}"+Redacted)
}

// schemeCredential is the credential after "bearer " or "basic " (any
// ASCII case; (?i) would also fold in "ſ"): a token of another request
// echoed in an answer. Its characters are RFC 6750's b64token, which also
// covers a basic credential. Compiled on first use: most plugin runs
// redact nothing.
var schemeCredential = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`([Bb][Ee][Aa][Rr][Ee][Rr] |[Bb][Aa][Ss][Ii][Cc] )[A-Za-z0-9._~+/=-]+`)
})
