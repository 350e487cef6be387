// Package podget reads one pod from the Kubernetes API server the way the
// CNI plugin needs it: a kubeconfig with a token or client certificate, one
// GET with bounded retries, failing closed, and only the pod fields the
// in-mesh decision reads (podinfo/meshpod.Pod) plus the UID.
//
// It is built on crypto/tls and encoding/json (h1.go makes the one HTTP/1.1
// GET) rather than client-go or even net/http: the plugin is a new process
// on every pod start, and Go initialises every linked package before main,
// so client-go, its API types and their schemes would cost milliseconds of
// every ADD, and net/http alone some tenths of one, even when the node agent
// answers and no GET is made. It also keeps the TLS session with the API
// server in a file (tlssession.go), so the next process resumes it.
//
// It does not decide anything (meshpod does) and does not log.
package podget

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nftmesh/nftmesh/podinfo/meshpod"
	"github.com/nftmesh/nftmesh/redirect/quote"
)

// Client reads pods from one API server.
type Client struct {
	server    string
	token     string
	userAgent string
	http      *transport
	sessions  *fileSessionCache // nil without a session dir or over plain HTTP
	// attemptTime bounds one GET inside GetPod's deadline, so a server
	// that accepted the connection but stalls is asked again.
	attemptTime time.Duration
}

// Options configure New.
type Options struct {
	// SessionDir keeps the TLS session with the API server in a file
	// there (the agent's run dir), so the next process resumes it instead
	// of a full handshake.
	SessionDir string
	// UserAgent is sent with each request; default "nftmesh-cni".
	UserAgent string
}

// NewFromFile loads a kubeconfig (see LoadKubeconfig) and builds a client.
func NewFromFile(path string, o Options) (*Client, error) {
	kc, err := LoadKubeconfig(path)
	if err != nil {
		return nil, err
	}
	return New(kc, o)
}

// New builds a client for kc.
func New(kc *Kubeconfig, o Options) (*Client, error) {
	c := &Client{server: kc.Server, token: kc.Token, userAgent: o.UserAgent, attemptTime: maxAttemptTime}
	if c.userAgent == "" {
		c.userAgent = "nftmesh-cni"
	}
	tr := &transport{proxy: envProxy()} // NO_PROXY may hold CIDRs, as for client-go
	if kc.ProxyURL != "" {
		u, err := url.Parse(kc.ProxyURL)
		if err != nil {
			return nil, fmt.Errorf("parsing proxy-url %s: %w", quote.Value(kc.ProxyURL), err)
		}
		if u.Scheme != "http" && u.Scheme != "https" {
			return nil, fmt.Errorf("proxy-url %s: only http and https proxies are supported", quote.Value(u.Redacted()))
		}
		tr.proxy = func(*url.URL) (*url.URL, error) { return u, nil }
	}
	if strings.HasPrefix(kc.Server, "https://") {
		tc := &tls.Config{ServerName: kc.ServerName, InsecureSkipVerify: kc.Insecure, NextProtos: []string{"http/1.1"}, MinVersion: tls.VersionTLS12}
		if len(kc.CAData) > 0 {
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(kc.CAData) {
				return nil, fmt.Errorf("reading the CA of %s from kubeconfig %s: no PEM certificate in it", kc.Server, kc.Path)
			}
			tc.RootCAs = pool
		}
		if len(kc.CertData) > 0 {
			cert, err := tls.X509KeyPair(kc.CertData, kc.KeyData)
			if err != nil {
				return nil, fmt.Errorf("reading the client certificate from kubeconfig %s: %w", kc.Path, err)
			}
			tc.Certificates = []tls.Certificate{cert}
		}
		if o.SessionDir != "" {
			host := strings.TrimPrefix(kc.Server, "https://")
			c.sessions = &fileSessionCache{path: sessionFileName(o.SessionDir, host, tc.ServerName, kc.CAData)}
			c.sessions.install(tc)
		}
		tr.tls = tc
	}
	c.http = tr
	return c, nil
}

// TLSResumed reports whether the last TLS handshake resumed a kept session.
func (c *Client) TLSResumed() bool {
	if c.sessions == nil {
		return false
	}
	c.sessions.mu.Lock()
	defer c.sessions.mu.Unlock()
	return c.sessions.resumed
}

// SessionWriteErr is the last error keeping the TLS session for the next
// run (nil when there was none or no session cache is used).
func (c *Client) SessionWriteErr() error {
	if c.sessions == nil {
		return nil
	}
	return c.sessions.WriteErr()
}

// Pod is what GetPod returns: the decision fields and the UID.
type Pod struct {
	UID string
	*meshpod.Pod
}

// Retry bounds for GetPod.
const (
	firstRetryDelay = 50 * time.Millisecond
	maxRetryDelay   = time.Second
	maxAttemptTime  = 5 * time.Second
	// maxServerDelay bounds the pause a server's Retry-After imposes
	// between attempts (the deadline bounds the whole).
	maxServerDelay = 5 * time.Second
	// maxBody bounds an answer: the API server caps an object at about
	// 1.5 MiB in etcd.
	maxBody = 16 << 20
)

// GetPod fetches a pod, retrying what may get better by waiting (an
// unreachable or slow server, 429, 5xx) with backoff until timeout has
// passed. Every other answer comes back at once with its own cause: not
// found, forbidden (RBAC), unauthorized, bad request, an answer that is not
// a Pod, a name no request can carry. kubelet retries the whole sandbox
// creation, so the caller fails closed on any error.
//
// The first read is served from the API server's watch cache (the same
// cache kubelet learned about the pod from), which saves an etcd round
// trip; wantUID, when set, guards against a stale copy of an earlier pod
// with the same name. A cached miss or a UID mismatch is re-read with a
// consistent read, so staleness can cost time but never a wrong answer
// about which pod this is.
//
// The answer must be the pod asked for: a Pod with another namespace or
// name (a misrouted or forged answer) is an error naming both, whether or
// not wantUID is known.
func (c *Client) GetPod(ctx context.Context, namespace, name, wantUID string, timeout time.Duration) (*Pod, error) {
	if err := checkSegment("namespace", namespace); err != nil {
		return nil, fmt.Errorf("getting pod %s/%s: %w", namespace, name, err)
	}
	if err := checkSegment("resource name", name); err != nil {
		return nil, fmt.Errorf("getting pod %s/%s: %w", namespace, name, err)
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	delay := firstRetryDelay
	cached := true
	// prev is the last attempt's error that was the server's doing: an
	// attempt cut short only by the overall deadline says less.
	var prev error
	for attempt := 1; ; attempt++ {
		actx, acancel := context.WithTimeout(ctx, c.attemptTime)
		pod, err := c.get(actx, namespace, name, cached)
		acancel()
		if err == nil && (pod.Namespace != namespace || pod.Name != name) {
			return nil, fmt.Errorf("getting pod %s/%s: the API server answered with pod %s: %w",
				namespace, name, quote.Value(pod.Namespace+"/"+pod.Name), ErrWrongPod)
		}
		if err == nil && cached && wantUID != "" && pod.UID != wantUID {
			cached = false
			continue
		}
		if err == nil {
			return pod, nil
		}
		var se *StatusError
		if cached && errors.As(err, &se) && se.Code == statusNotFound {
			cached = false
			continue
		}
		if !Retryable(err) {
			return nil, fmt.Errorf("getting pod %s/%s: %w", namespace, name, err)
		}
		wait := delay
		if errors.As(err, &se) && se.RetryAfter > 0 {
			// The server asked for a pause (Retry-After on a 429 or a
			// server timeout): asking sooner only adds to its load.
			wait = max(wait, min(time.Duration(se.RetryAfter)*time.Second, maxServerDelay))
		}
		if ctx.Err() != nil && prev != nil && errors.Is(err, context.DeadlineExceeded) {
			err = prev
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("getting pod %s/%s: %s within %s (%d attempts): %w",
				namespace, name, transientWhat(err), time.Since(start).Round(time.Millisecond), attempt, err)
		case <-time.After(wait):
		}
		prev = err
		delay = min(2*delay, maxRetryDelay)
	}
}

// checkSegment refuses a name that cannot be one path segment of a request
// URL (as client-go's request builder does): the request would name
// another object.
func checkSegment(what, v string) error {
	switch {
	case v == "":
		return fmt.Errorf("invalid %s %s: may not be empty", what, quote.Value(v))
	case v == "." || v == "..":
		return fmt.Errorf("invalid %s %s: may not be '.' or '..'", what, quote.Value(v))
	case strings.ContainsAny(v, "/%"):
		return fmt.Errorf("invalid %s %s: may not contain '/' or '%%'", what, quote.Value(v))
	}
	return nil
}

// get makes one GET of the pod. cached reads with resourceVersion=0, which
// the API server answers from its watch cache without an etcd round trip.
func (c *Client) get(ctx context.Context, namespace, name string, cached bool) (*Pod, error) {
	u := c.server + "/api/v1/namespaces/" + namespace + "/pods/" + name
	if cached {
		u += "?resourceVersion=0"
	}
	target, err := url.Parse(u)
	if err != nil {
		return nil, err
	}
	headers := [][2]string{{"User-Agent", c.userAgent}, {"Accept", "application/json"}}
	if c.token != "" {
		headers = append(headers, [2]string{"Authorization", "Bearer " + c.token})
	}
	resp, err := c.http.get(ctx, target, headers)
	if err != nil {
		return nil, err
	}
	body := resp.body
	if len(body) > maxBody {
		return nil, fmt.Errorf("the API server's answer is over %d bytes", maxBody)
	}
	ctype := resp.header.Get("Content-Type")
	if resp.code < 200 || resp.code > 299 {
		return nil, statusError(resp, ctype, body)
	}
	if len(body) == 0 {
		return nil, fmt.Errorf("0-length response with status code: %d and content type: %s", resp.code, quote.Value(ctype))
	}
	if !isJSON(ctype) {
		return nil, fmt.Errorf("the API server answered with content type %s, not JSON: %s", quote.Value(ctype), quote.Value(string(body)))
	}
	return decodePod(body)
}

// isJSON reports whether a Content-Type is application/json (parameters
// such as charset aside; media types are case-insensitive).
func isJSON(ctype string) bool {
	mt, _, _ := strings.Cut(ctype, ";")
	return strings.EqualFold(strings.TrimSpace(mt), "application/json")
}

// decodePod decodes a Pod answer; anything else (another kind, another
// version) is an error naming what came.
func decodePod(body []byte) (*Pod, error) {
	p, uid, err := meshpod.DecodeAPIPod(body)
	if err != nil {
		return nil, err
	}
	return &Pod{UID: uid, Pod: p}, nil
}

// StatusError is an API server's answer other than 2xx: its HTTP code and,
// when the body is a Status, its reason and message.
type StatusError struct {
	Code    int
	Reason  string // e.g. NotFound, Forbidden, TooManyRequests
	Message string
	// RetryAfter is the pause the server asked for, in seconds (0: none).
	RetryAfter int
}

func (e *StatusError) Error() string {
	msg := e.Message
	if msg == "" {
		msg = statusText[e.Code]
	}
	if e.Reason != "" {
		return fmt.Sprintf("%s (%s, HTTP %d)", msg, e.Reason, e.Code)
	}
	return fmt.Sprintf("%s (HTTP %d)", msg, e.Code)
}

// IsNotFound reports whether err is the API server's 404 for the pod.
func IsNotFound(err error) bool {
	var se *StatusError
	return errors.As(err, &se) && se.Code == statusNotFound
}

// statusError reads a non-2xx answer: a Status object when the server
// sent one, else what the code means with the body's start.
func statusError(resp *response, ctype string, body []byte) error {
	se := &StatusError{Code: resp.code}
	if s, err := strconv.Atoi(resp.header.Get("Retry-After")); err == nil && s > 0 {
		se.RetryAfter = s
	}
	var st struct {
		Kind    string `json:"kind"`
		Reason  string `json:"reason"`
		Message string `json:"message"`
		Details *struct {
			RetryAfterSeconds int `json:"retryAfterSeconds"`
		} `json:"details"`
	}
	if isJSON(ctype) && json.Unmarshal(body, &st) == nil && st.Kind == "Status" {
		se.Reason, se.Message = st.Reason, quote.Text(st.Message)
		if st.Details != nil && st.Details.RetryAfterSeconds > 0 && se.RetryAfter == 0 {
			se.RetryAfter = st.Details.RetryAfterSeconds
		}
		return se
	}
	switch resp.code {
	case statusUnauthorized:
		se.Message = "the server has asked for the client to provide credentials"
	case statusForbidden:
		se.Message = "the server does not allow access to the requested resource"
	}
	if b := bytes.TrimSpace(body); len(b) > 0 {
		se.Message = strings.TrimSpace(se.Message + " " + quote.Value(string(b)))
	}
	return se
}

// ErrWrongPod: the API server's answer is a Pod, but not the one asked for.
var ErrWrongPod = errors.New("not the pod asked for")

// Retryable reports whether a failed pod GET may succeed when repeated:
// the server was not reached or did not answer in time, or it answered
// 429, 408 or 5xx. Anything else is final: a 4xx answer, an answer that
// does not decode as a Pod, a name no request can carry, a certificate the
// server presented that does not verify, or a cancelled caller.
func Retryable(err error) bool {
	if err == nil {
		return false
	}
	var se *StatusError
	if errors.As(err, &se) {
		switch {
		case se.Code == statusTooManyRequests, se.Code == statusRequestTimeout, se.Code >= 500:
			return true
		case se.Reason == "Timeout", se.Reason == "ServerTimeout", se.Reason == "TooManyRequests":
			return true
		}
		return false
	}
	if errors.Is(err, context.Canceled) {
		return false
	}
	// An attempt that ran out of its own time; GetPod's overall deadline
	// still ends the retries.
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	// Certificate problems are transport errors too, but waiting does not
	// change the certificate the server presents or the CA we trust.
	var (
		unknownCA  x509.UnknownAuthorityError
		invalid    x509.CertificateInvalidError
		hostname   x509.HostnameError
		verifyFail *tls.CertificateVerificationError
	)
	if errors.As(err, &unknownCA) || errors.As(err, &invalid) || errors.As(err, &hostname) || errors.As(err, &verifyFail) {
		return false
	}
	// Refused, reset, unreachable, DNS, dial and TLS handshake timeouts, a
	// connection closed mid-answer. Every error of the HTTP client is a
	// *url.Error, itself a net.Error: what it wraps decides ("server gave
	// HTTP response to HTTPS client" is final).
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	var ne net.Error
	if errors.As(err, &ne) {
		return true
	}
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// transientWhat names, for the give-up message, what kept going wrong.
func transientWhat(err error) string {
	var se *StatusError
	if errors.As(err, &se) {
		if se.Code == statusTooManyRequests {
			return "API server still throttling"
		}
		return "API server still failing"
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return "no answer from the API server"
	}
	return "API server not reachable"
}

// HTTP status codes the client tells apart.
const (
	statusUnauthorized    = 401
	statusForbidden       = 403
	statusNotFound        = 404
	statusRequestTimeout  = 408
	statusTooManyRequests = 429
)

// statusText names the codes an API server answers with, for a
// StatusError without a message.
var statusText = map[int]string{
	400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
	405: "Method Not Allowed", 406: "Not Acceptable", 408: "Request Timeout",
	409: "Conflict", 410: "Gone", 413: "Request Entity Too Large",
	415: "Unsupported Media Type", 422: "Unprocessable Entity", 429: "Too Many Requests",
	500: "Internal Server Error", 501: "Not Implemented", 502: "Bad Gateway",
	503: "Service Unavailable", 504: "Gateway Timeout",
}
