package podget

// One HTTP/1.1 GET per connection, over crypto/tls, as the plugin makes
// it: no connection pool, no HTTP/2, no compression, no redirects. net/http
// would do the same work, but linking it costs every plugin run its
// package initialisation and page faults (about 0.3-0.5 ms of each ADD on
// the benchmark machine, agent answering or not).

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/textproto"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/net/http/httpproxy"

	"github.com/nftmesh/nftmesh/redirect/quote"
)

// Transport bounds, as the net/http transport this replaced had them.
const (
	dialTimeout         = 30 * time.Second
	tlsHandshakeTimeout = 10 * time.Second
)

// errHTTPToHTTPS is the final error for a server that answered the TLS
// handshake in plain HTTP (a kubeconfig saying https for an http server).
var errHTTPToHTTPS = errors.New("server gave HTTP response to HTTPS client")

// response is what a GET got back.
type response struct {
	code   int
	header textproto.MIMEHeader
	body   []byte
}

// proxyFunc picks the proxy for a request URL (nil: none).
type proxyFunc func(*url.URL) (*url.URL, error)

// envProxy is the proxy the environment names (HTTPS_PROXY, HTTP_PROXY,
// NO_PROXY with the CIDRs and domains client-go accepts there), read once.
func envProxy() proxyFunc {
	f := httpproxy.FromEnvironment().ProxyFunc()
	return func(u *url.URL) (*url.URL, error) { return f(u) }
}

// transport makes the GETs of one client.
type transport struct {
	tls   *tls.Config // nil for an http:// server
	proxy proxyFunc
}

// get fetches target (an absolute http(s) URL) with headers, within ctx,
// reading at most maxBody+1 bytes of body.
func (t *transport) get(ctx context.Context, target *url.URL, headers [][2]string) (*response, error) {
	conn, viaProxy, err := t.connect(ctx, target)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	stop := watch(ctx, conn)
	defer stop()
	var req strings.Builder
	if viaProxy != nil {
		// A plain request through a proxy names the whole URL, and
		// carries the proxy's credentials.
		fmt.Fprintf(&req, "GET %s://%s%s HTTP/1.1\r\nHost: %s\r\n", target.Scheme, target.Host, target.RequestURI(), target.Host)
		if auth := proxyAuth(viaProxy); auth != "" {
			fmt.Fprintf(&req, "Proxy-Authorization: %s\r\n", auth)
		}
	} else {
		fmt.Fprintf(&req, "GET %s HTTP/1.1\r\nHost: %s\r\n", target.RequestURI(), target.Host)
	}
	for _, h := range headers {
		fmt.Fprintf(&req, "%s: %s\r\n", h[0], h[1])
	}
	req.WriteString("Connection: close\r\n\r\n")
	if _, err := io.WriteString(conn, req.String()); err != nil {
		return nil, ioErr(ctx, err)
	}
	r, err := readResponse(bufio.NewReader(conn), maxBody)
	if err != nil {
		return nil, ioErr(ctx, err)
	}
	return r, nil
}

// connect dials the server, or the proxy and through it, and does the TLS
// handshake for an https server. viaProxy is the proxy an http request must
// be sent to as such (nil for a direct connection or a tunnel).
func (t *transport) connect(ctx context.Context, target *url.URL) (conn net.Conn, viaProxy *url.URL, err error) {
	addr := hostPort(target)
	var proxy *url.URL
	if t.proxy != nil {
		p, err := t.proxy(target)
		if err != nil {
			return nil, nil, fmt.Errorf("choosing a proxy for %s: %w", target.Host, err)
		}
		proxy = p
	}
	d := net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second}
	if proxy == nil {
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, nil, ioErr(ctx, err)
		}
		c, err = t.handshake(ctx, c, target)
		return c, nil, err
	}
	if proxy.Scheme != "http" && proxy.Scheme != "https" {
		return nil, nil, fmt.Errorf("proxy %s: only http and https proxies are supported", quote.Value(proxy.Redacted()))
	}
	conn, err = d.DialContext(ctx, "tcp", hostPort(proxy))
	if err != nil {
		return nil, nil, fmt.Errorf("connecting to proxy %s: %w", quote.Value(proxy.Redacted()), err)
	}
	if proxy.Scheme == "https" {
		pc := tls.Client(conn, &tls.Config{ServerName: proxy.Hostname(), MinVersion: tls.VersionTLS12})
		if err := handshake(ctx, pc); err != nil {
			conn.Close()
			return nil, nil, fmt.Errorf("connecting to proxy %s: %w", quote.Value(proxy.Redacted()), err)
		}
		conn = pc
	}
	if target.Scheme == "http" {
		return conn, proxy, nil
	}
	if err := connectTunnel(ctx, conn, addr, proxyAuth(proxy)); err != nil {
		conn.Close()
		return nil, nil, fmt.Errorf("connecting through proxy %s: %w", quote.Value(proxy.Redacted()), err)
	}
	conn, err = t.handshake(ctx, conn, target)
	return conn, nil, err
}

// handshake starts TLS with an https server over conn (or returns conn for
// an http one).
func (t *transport) handshake(ctx context.Context, conn net.Conn, target *url.URL) (net.Conn, error) {
	if target.Scheme != "https" {
		return conn, nil
	}
	cfg := t.tls
	if cfg.ServerName == "" {
		cfg = cfg.Clone()
		cfg.ServerName = target.Hostname()
	}
	tc := tls.Client(conn, cfg)
	if err := handshake(ctx, tc); err != nil {
		conn.Close()
		var rh tls.RecordHeaderError
		if errors.As(err, &rh) && string(rh.RecordHeader[:]) == "HTTP/" {
			return nil, errHTTPToHTTPS
		}
		return nil, err
	}
	return tc, nil
}

func handshake(ctx context.Context, tc *tls.Conn) error {
	hctx, cancel := context.WithTimeout(ctx, tlsHandshakeTimeout)
	defer cancel()
	if err := tc.HandshakeContext(hctx); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return err
	}
	return nil
}

// connectTunnel asks an HTTP proxy on conn for a tunnel to addr.
func connectTunnel(ctx context.Context, conn net.Conn, addr, auth string) error {
	stop := watch(ctx, conn)
	defer stop()
	req := "CONNECT " + addr + " HTTP/1.1\r\nHost: " + addr + "\r\n"
	if auth != "" {
		req += "Proxy-Authorization: " + auth + "\r\n"
	}
	if _, err := io.WriteString(conn, req+"\r\n"); err != nil {
		return ioErr(ctx, err)
	}
	// The proxy's answer has no body on success; read it byte by byte up
	// to its end so nothing of the tunnel is consumed with it.
	r, err := readResponse(bufio.NewReaderSize(&oneByte{conn}, 16), -1)
	if err != nil {
		return ioErr(ctx, err)
	}
	if r.code != 200 {
		return fmt.Errorf("the proxy answered CONNECT with HTTP %d", r.code)
	}
	return nil
}

// oneByte reads one byte at a time, so a bufio.Reader over it never reads
// past what it is asked to parse.
type oneByte struct{ r io.Reader }

func (o *oneByte) Read(p []byte) (int, error) {
	if len(p) > 1 {
		p = p[:1]
	}
	return o.r.Read(p)
}

// proxyAuth is the Proxy-Authorization value for a proxy URL's user info.
func proxyAuth(p *url.URL) string {
	if p.User == nil {
		return ""
	}
	pw, _ := p.User.Password()
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(p.User.Username()+":"+pw))
}

func hostPort(u *url.URL) string {
	if u.Port() != "" {
		return u.Host
	}
	port := "80"
	if u.Scheme == "https" {
		port = "443"
	}
	return net.JoinHostPort(u.Hostname(), port)
}

// watch ends conn's reads and writes when ctx is done, and bounds them by
// its deadline.
func watch(ctx context.Context, conn net.Conn) (stop func() bool) {
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	return context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
}

// ioErr is the error of a read or write on a connection ctx watches: the
// context's own when it ended the exchange.
func ioErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	// The connection's deadline is the context's: it may pass a moment
	// before the context's own timer says so.
	var ne net.Error
	if dl, ok := ctx.Deadline(); ok && (errors.Is(err, os.ErrDeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()) && !time.Now().Before(dl) {
		return context.DeadlineExceeded
	}
	return err
}

// maxHeaderLines bounds a response's header lines (each at most 4 KiB).
const maxHeaderLines = 256

// readResponse reads one HTTP/1.x response (skipping 1xx ones): status,
// headers and, with maxBody >= 0, the body (at most maxBody+1 bytes, so a
// longer one shows as such); with maxBody < 0 no body is read.
func readResponse(br *bufio.Reader, maxBody int) (*response, error) {
	for {
		line, err := readLine(br)
		if err != nil {
			return nil, fmt.Errorf("reading the response: %w", err)
		}
		proto, status, _ := strings.Cut(line, " ")
		codeText, _, _ := strings.Cut(status, " ")
		code, cerr := strconv.Atoi(codeText)
		if !strings.HasPrefix(proto, "HTTP/1.") || cerr != nil || code < 100 || code > 999 {
			return nil, fmt.Errorf("malformed HTTP response %s", quote.Value(line))
		}
		h := textproto.MIMEHeader{}
		for n := 0; ; n++ {
			hl, err := readLine(br)
			if err != nil {
				return nil, fmt.Errorf("reading the response's headers: %w", err)
			}
			if hl == "" {
				break
			}
			k, v, ok := strings.Cut(hl, ":")
			if !ok || n >= maxHeaderLines || k == "" || strings.ContainsAny(k, " \t") {
				return nil, fmt.Errorf("malformed response header %s", quote.Value(hl))
			}
			k = textproto.CanonicalMIMEHeaderKey(k)
			h[k] = append(h[k], strings.TrimSpace(v))
		}
		if code >= 100 && code < 200 && code != 101 {
			continue // informational: the answer follows
		}
		r := &response{code: code, header: h}
		if maxBody < 0 {
			return r, nil
		}
		r.body, err = readBody(br, h, maxBody)
		if err != nil {
			return nil, err
		}
		return r, nil
	}
}

// readBody reads a response body framed as its headers say: chunked, a
// Content-Length, or up to the connection's end.
func readBody(br *bufio.Reader, h textproto.MIMEHeader, maxBody int) ([]byte, error) {
	limit := int64(maxBody) + 1
	if te := h.Values("Transfer-Encoding"); len(te) > 0 {
		if !strings.EqualFold(strings.TrimSpace(te[len(te)-1]), "chunked") {
			return nil, fmt.Errorf("unsupported transfer encoding %s", quote.Value(strings.Join(te, ", ")))
		}
		return readChunked(br, limit)
	}
	if cl := h.Get("Content-Length"); cl != "" {
		n, err := strconv.ParseInt(strings.TrimSpace(cl), 10, 64)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("bad Content-Length %s", quote.Value(cl))
		}
		if n > limit {
			n = limit
		}
		b := make([]byte, n)
		if _, err := io.ReadFull(br, b); err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return nil, fmt.Errorf("reading the response body: %w", err)
		}
		return b, nil
	}
	b, err := io.ReadAll(io.LimitReader(br, limit))
	if err != nil {
		return nil, fmt.Errorf("reading the response body: %w", err)
	}
	return b, nil
}

// readChunked decodes a chunked body, keeping at most limit bytes.
func readChunked(br *bufio.Reader, limit int64) ([]byte, error) {
	var out []byte
	for {
		line, err := readLine(br)
		if err != nil {
			return nil, fmt.Errorf("reading a chunk: %w", err)
		}
		sizeText, _, _ := strings.Cut(line, ";")
		size, err := strconv.ParseInt(strings.TrimSpace(sizeText), 16, 64)
		if err != nil || size < 0 {
			return nil, fmt.Errorf("bad chunk size %s", quote.Value(line))
		}
		if size == 0 {
			// Trailers, up to the empty line.
			for {
				t, err := readLine(br)
				if err != nil {
					return nil, fmt.Errorf("reading the trailers: %w", err)
				}
				if t == "" {
					return out, nil
				}
			}
		}
		if int64(len(out))+size > limit {
			size = limit - int64(len(out))
			buf := make([]byte, size)
			if _, err := io.ReadFull(br, buf); err != nil {
				return nil, fmt.Errorf("reading a chunk: %w", unexpected(err))
			}
			return append(out, buf...), nil
		}
		start := len(out)
		out = append(out, make([]byte, size)...)
		if _, err := io.ReadFull(br, out[start:]); err != nil {
			return nil, fmt.Errorf("reading a chunk: %w", unexpected(err))
		}
		if end, err := readLine(br); err != nil || end != "" {
			return nil, fmt.Errorf("chunk not followed by CRLF")
		}
	}
}

// readLine reads one CRLF- (or LF-) terminated line of at most 4 KiB.
func readLine(br *bufio.Reader) (string, error) {
	var b []byte
	for {
		frag, err := br.ReadSlice('\n')
		b = append(b, frag...)
		if len(b) > 4096 {
			return "", errors.New("line too long")
		}
		if err == bufio.ErrBufferFull {
			continue
		}
		if err != nil {
			return "", unexpected(err)
		}
		return strings.TrimRight(string(b), "\r\n"), nil
	}
}

func unexpected(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}
