package podget

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/client-go/rest"
)

// secretToken is the bearer token of the hostile-server tests: it must
// never be in an error.
const secretToken = "eyJhbGciOiJSUzI1NiJ9.c2VjcmV0LXBheWxvYWQ.c2lnbmF0dXJl"

// hostileAPI serves every request with answer over HTTP on loopback, and
// returns a client with secretToken.
func hostileAPI(t *testing.T, answer http.HandlerFunc) (*Client, *atomic.Int32) {
	t.Helper()
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		answer(w, r)
	}))
	t.Cleanup(srv.Close)
	c, err := New(&rest.Config{Host: srv.URL, BearerToken: secretToken})
	if err != nil {
		t.Fatal(err)
	}
	c.attemptTime = 300 * time.Millisecond
	return c, &n
}

// echo writes the request back, headers included, as a proxy's or a
// misconfigured server's error page does.
func echo(code int, ctype string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var b strings.Builder
		fmt.Fprintf(&b, "<html><pre>%s %s\n", r.Method, r.URL)
		for k, vs := range r.Header {
			for _, v := range vs {
				fmt.Fprintf(&b, "%s: %s\n", k, v)
			}
		}
		b.WriteString("</pre></html>")
		w.Header().Set("Content-Type", ctype)
		w.Header().Set("Warning", `299 - "echo: `+r.Header.Get("Authorization")+`"`)
		w.WriteHeader(code)
		fmt.Fprint(w, b.String())
	}
}

// TestGetPodNeverShowsTheToken: an answer that echoes the request (its
// Authorization header) in a non-JSON page, on an error code or a 2xx, or
// in a Status message, gives an error without the token. Before, the
// page, token included, was in the error, so in the CNI error (kubelet
// events, readable by the namespace's users) and the plugin's log.
func TestGetPodNeverShowsTheToken(t *testing.T) {
	statusEcho := func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(403)
		fmt.Fprintf(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Forbidden","code":403,"message":"denied for %s"}`, r.Header.Get("Authorization"))
	}
	for _, tc := range []struct {
		name   string
		answer http.HandlerFunc
		want   string
	}{
		{"500 HTML", echo(500, "text/html"), "API server still failing"},
		{"403 plain text", echo(403, "text/plain"), "Forbidden, HTTP 403"},
		{"401 plain text", echo(401, "text/plain"), "provide credentials"},
		{"400 JSON that is not a Status", echo(400, "application/json"), "BadRequest, HTTP 400"},
		{"200 HTML", echo(200, "text/html"), "not JSON"},
		{"403 Status", statusEcho, "denied for [redacted] (Forbidden, HTTP 403)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c, _ := hostileAPI(t, tc.answer)
			_, err := c.GetPod(context.Background(), "shop", "web-1", "", 700*time.Millisecond)
			if err == nil {
				t.Fatal("GetPod succeeded")
			}
			msg := err.Error()
			for _, part := range []string{secretToken, "c2VjcmV0LXBheWxvYWQ"} {
				if strings.Contains(msg, part) {
					t.Fatalf("the error holds the token: %s", msg)
				}
			}
			if !strings.Contains(msg, tc.want) {
				t.Errorf("error %q does not say %q", msg, tc.want)
			}
		})
	}
}

// TestGetPodRedirect: a 3xx is not followed (the token stays with the API
// server) and the error says what came, at once. Before, a 3xx gave an
// error with an empty message.
func TestGetPodRedirect(t *testing.T) {
	var elsewhere atomic.Int32
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { elsewhere.Add(1) }))
	t.Cleanup(other.Close)
	for _, code := range []int{301, 302, 307, 308} {
		t.Run(fmt.Sprint(code), func(t *testing.T) {
			c, n := hostileAPI(t, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Location", other.URL+"/steal?token=abc123secret")
				w.WriteHeader(code)
			})
			start := time.Now()
			_, err := c.GetPod(context.Background(), "shop", "web-1", "", 5*time.Second)
			if err == nil || Retryable(err) || time.Since(start) > 2*time.Second {
				t.Fatalf("err = %v (retryable %t) after %v, want a final error at once", err, Retryable(err), time.Since(start))
			}
			want := fmt.Sprintf("redirect (HTTP %d) to %q", code, other.URL+"/steal")
			if !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "abc123secret") {
				t.Errorf("error %q does not say %s, or holds the query", err, want)
			}
			if n.Load() != 1 {
				t.Errorf("%d requests, want 1", n.Load())
			}
		})
	}
	if elsewhere.Load() != 0 {
		t.Errorf("the redirect was followed %d times", elsewhere.Load())
	}
}

// TestGetPodTLSVersionRefused: a server that speaks only TLS 1.1 (the
// client asks for 1.2 at least) is a final error at once that says so.
// Before, it was retried for the whole timeout and reported as "API server
// not reachable".
func TestGetPodTLSVersionRefused(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	srv.TLS = &tls.Config{MaxVersion: tls.VersionTLS11}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	c, err := New(&rest.Config{Host: srv.URL, BearerToken: secretToken, TLSClientConfig: rest.TLSClientConfig{Insecure: true}})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = c.GetPod(context.Background(), "shop", "web-1", "", 5*time.Second)
	if err == nil || Retryable(err) || time.Since(start) > 2*time.Second {
		t.Fatalf("err = %v (retryable %t) after %v, want a final error at once", err, Retryable(err), time.Since(start))
	}
	for _, want := range []string{"TLS handshake", "protocol version"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "not reachable") {
		t.Errorf("error %q blames reachability", err)
	}
}

// rawAPI answers every connection with raw bytes after reading the request
// head: for answers net/http's server would not write.
func rawAPI(t *testing.T, answer func(w *bufio.Writer)) *Client {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				r := bufio.NewReader(conn)
				for {
					line, err := r.ReadString('\n')
					if err != nil || line == "\r\n" {
						break
					}
				}
				w := bufio.NewWriter(conn)
				answer(w)
				w.Flush()
			}()
		}
	}()
	c, err := New(&rest.Config{Host: "http://" + ln.Addr().String(), BearerToken: secretToken})
	if err != nil {
		t.Fatal(err)
	}
	c.attemptTime = 2 * time.Second
	return c
}

// TestGetPodHostileBodies: a chunk size near 2^63, and an answer without
// end, give a bounded error, never a panic or a client that reads until
// memory runs out. (The hand-written HTTP/1.1 reader this client replaced
// overflowed on the chunk size and panicked.)
func TestGetPodHostileBodies(t *testing.T) {
	head := "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
	for _, tc := range []struct {
		name   string
		answer func(w *bufio.Writer)
		want   string
	}{
		// Go reads this size, then the connection ends mid-chunk.
		{"chunk size 2^63-1", func(w *bufio.Writer) { w.WriteString(head + "7fffffffffffffff\r\n{\"kind\":") }, "unexpected EOF"},
		{"chunk size over 2^64", func(w *bufio.Writer) { w.WriteString(head + "1ffffffffffffffff\r\n{") }, "chunk"},
		{"an endless answer", func(w *bufio.Writer) {
			w.WriteString(head)
			chunk := strings.Repeat(" ", 1<<16)
			for range 1 << 12 { // 256 MiB, far past the bound
				if _, err := fmt.Fprintf(w, "%x\r\n%s\r\n", len(chunk), chunk); err != nil {
					return
				}
			}
		}, "too large"},
		{"an endless 500", func(w *bufio.Writer) {
			w.WriteString("HTTP/1.1 500 Oops\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n")
			chunk := strings.Repeat("x", 1<<16)
			for range 1 << 12 {
				if _, err := fmt.Fprintf(w, "%x\r\n%s\r\n", len(chunk), chunk); err != nil {
					return
				}
			}
		}, "getting pod shop/web-1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := rawAPI(t, tc.answer)
			start := time.Now()
			_, err := c.GetPod(context.Background(), "shop", "web-1", "", 8*time.Second) // the size bound, not the deadline, must end it, also on a loaded machine
			if err == nil || !strings.Contains(err.Error(), tc.want) || len(err.Error()) > 8192 {
				t.Fatalf("err = %.300v (%d bytes), want a bounded error saying %q", err, len(fmt.Sprint(err)), tc.want)
			}
			if took := time.Since(start); took > 15*time.Second {
				t.Errorf("took %v", took)
			}
		})
	}
}
