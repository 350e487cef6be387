package podget

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"
)

// rawServer answers every connection with the bytes of answer (after
// reading the request's head) and records the request heads.
func rawServer(t *testing.T, answer string) (addr string, heads func() []string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var mu sync.Mutex
	var got []string
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				var head strings.Builder
				for {
					l, err := br.ReadString('\n')
					head.WriteString(l)
					if err != nil || l == "\r\n" {
						break
					}
				}
				mu.Lock()
				got = append(got, head.String())
				mu.Unlock()
				_, _ = io.WriteString(c, answer)
			}()
		}
	}()
	return ln.Addr().String(), func() []string { mu.Lock(); defer mu.Unlock(); return append([]string(nil), got...) }
}

const podJSON = `{"kind":"Pod","apiVersion":"v1","metadata":{"name":"web-1","namespace":"shop","uid":"u-1"}}`

// TestTransportFraming: every way HTTP/1.1 frames an answer gives the same
// pod; the request is a plain GET with our headers and Connection: close.
func TestTransportFraming(t *testing.T) {
	chunked := func(parts ...string) string {
		var b strings.Builder
		for _, p := range parts {
			fmt.Fprintf(&b, "%x;ext=1\r\n%s\r\n", len(p), p)
		}
		b.WriteString("0\r\nX-Trailer: t\r\n\r\n")
		return b.String()
	}
	for name, answer := range map[string]string{
		"content-length": "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " + fmt.Sprint(len(podJSON)) + "\r\n\r\n" + podJSON,
		"chunked":        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked(podJSON[:10], podJSON[10:40], podJSON[40:]),
		"until close":    "HTTP/1.1 200 OK\r\nContent-Type: application/json; charset=utf-8\r\n\r\n" + podJSON,
		"after a 100":    "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: x\r\n\r\nHTTP/1.1 200 OK\r\nContent-Type: Application/JSON\r\nContent-Length: " + fmt.Sprint(len(podJSON)) + "\r\n\r\n" + podJSON,
		"bare LF":        "HTTP/1.0 200 OK\nContent-Type: application/json\n\n" + podJSON,
	} {
		t.Run(name, func(t *testing.T) {
			addr, heads := rawServer(t, answer)
			c, err := New(&Kubeconfig{Server: "http://" + addr, Token: "tok"}, Options{UserAgent: "ua/1"})
			if err != nil {
				t.Fatal(err)
			}
			p, err := c.GetPod(context.Background(), "shop", "web-1", "u-1", 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if p.UID != "u-1" || p.Name != "web-1" {
				t.Fatalf("got %+v", p)
			}
			h := heads()[0]
			for _, want := range []string{"GET /api/v1/namespaces/shop/pods/web-1?resourceVersion=0 HTTP/1.1\r\n", "Host: " + addr + "\r\n",
				"User-Agent: ua/1\r\n", "Accept: application/json\r\n", "Authorization: Bearer tok\r\n", "Connection: close\r\n"} {
				if !strings.Contains(h, want) {
					t.Errorf("request head lacks %q:\n%s", want, h)
				}
			}
		})
	}
}

// TestTransportBadAnswers: a malformed or oversized answer is an error
// naming it, never a pod; a truncated one may be asked again.
func TestTransportBadAnswers(t *testing.T) {
	for _, tc := range []struct {
		name, answer, want string
		retryable          bool
	}{
		{"not HTTP", "SSH-2.0-OpenSSH\r\n\r\n", "malformed HTTP response", false},
		{"bad header", "HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", "malformed response header", false},
		{"bad length", "HTTP/1.1 200 OK\r\nContent-Length: -3\r\n\r\n", "bad Content-Length", false},
		{"gzip", "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", "unsupported transfer encoding", false},
		{"bad chunk", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "bad chunk size", false},
		{"short body", "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 500\r\n\r\n{}", "unexpected EOF", true},
		{"closed before answering", "", "unexpected EOF", true},
		{"huge header line", "HTTP/1.1 200 OK\r\nX: " + strings.Repeat("a", 10000) + "\r\n\r\n", "line too long", false},
		{"endless headers", "HTTP/1.1 200 OK\r\n" + strings.Repeat("X: a\r\n", 300) + "\r\n", "malformed response header", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr, _ := rawServer(t, tc.answer)
			c, err := New(&Kubeconfig{Server: "http://" + addr}, Options{})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_, err = c.get(ctx, "shop", "web-1", false)
			if err == nil || !strings.Contains(err.Error(), tc.want) || Retryable(err) != tc.retryable {
				t.Fatalf("err = %v (retryable %t), want %q (retryable %t)", err, Retryable(err), tc.want, tc.retryable)
			}
		})
	}
	// An answer over the bound is refused, chunked or not.
	big := `{"kind":"Pod","x":"` + strings.Repeat("a", maxBody) + `"}`
	for name, answer := range map[string]string{
		"content-length": "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " + fmt.Sprint(len(big)) + "\r\n\r\n" + big,
		"chunked":        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n" + fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(big), big),
	} {
		addr, _ := rawServer(t, answer)
		c, _ := New(&Kubeconfig{Server: "http://" + addr}, Options{})
		if _, err := c.get(context.Background(), "shop", "web-1", false); err == nil || !strings.Contains(err.Error(), "over") {
			t.Errorf("%s: %d-byte answer: %v, want refused", name, len(big), err)
		}
	}
}

// connectProxy is an HTTP proxy that tunnels CONNECT and forwards plain
// absolute-URI requests, recording what it was asked and with which
// credentials.
type connectProxy struct {
	url   *url.URL
	mu    sync.Mutex
	asked []string
}

// startProxy starts a proxy that sends every connection to upstream,
// whatever host it is asked for (the test's API server stands for any).
func startProxy(t *testing.T, upstream string) *connectProxy {
	t.Helper()
	p := &connectProxy{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		p.asked = append(p.asked, r.Method+" "+r.RequestURI+" auth="+r.Header.Get("Proxy-Authorization"))
		p.mu.Unlock()
		if r.Method == http.MethodConnect {
			up, err := net.Dial("tcp", upstream)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadGateway)
				return
			}
			w.WriteHeader(http.StatusOK)
			hj, _ := w.(http.Hijacker)
			c, brw, err := hj.Hijack()
			if err != nil {
				up.Close()
				return
			}
			go func() { _, _ = io.Copy(up, brw); up.Close() }()
			_, _ = io.Copy(c, up)
			c.Close()
			return
		}
		out := r.Clone(r.Context())
		out.URL.Host, out.RequestURI = upstream, ""
		resp, err := http.DefaultTransport.RoundTrip(out)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		for k, v := range resp.Header {
			w.Header()[k] = v
		}
		w.WriteHeader(resp.StatusCode)
		_, _ = io.Copy(w, resp.Body)
	}))
	t.Cleanup(srv.Close)
	p.url, _ = url.Parse(srv.URL)
	return p
}

func (p *connectProxy) requests() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.asked...)
}

// TestTransportProxies: proxy-url and HTTPS_PROXY/HTTP_PROXY reach the API
// server through an HTTP proxy (a CONNECT tunnel for https, the absolute
// URI for http), with the proxy's credentials; NO_PROXY bypasses it; a
// proxy's refusal is an error naming it, and a proxy scheme the client
// cannot speak is an error, not a direct connection. The API server is
// named example.com (its test certificate's name; loopback addresses are
// never proxied), and the proxy sends every connection to it.
func TestTransportProxies(t *testing.T) {
	api := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, podJSON)
	}))
	t.Cleanup(api.Close)
	plain := httptest.NewServer(api.Config.Handler)
	t.Cleanup(plain.Close)
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: api.Certificate().Raw})
	get := func(t *testing.T, kc *Kubeconfig) error {
		t.Helper()
		c, err := New(kc, Options{})
		if err != nil {
			return err
		}
		_, err = c.GetPod(context.Background(), "shop", "web-1", "u-1", 2*time.Second)
		return err
	}
	auth := "Basic " + base64.StdEncoding.EncodeToString([]byte("u:p w"))
	const server = "https://example.com:6443"

	t.Run("proxy-url https", func(t *testing.T) {
		p := startProxy(t, api.Listener.Addr().String())
		pu := *p.url
		pu.User = url.UserPassword("u", "p w")
		if err := get(t, &Kubeconfig{Server: server, CAData: caPEM, ProxyURL: pu.String()}); err != nil {
			t.Fatal(err)
		}
		if r := p.requests(); len(r) != 1 || r[0] != "CONNECT example.com:6443 auth="+auth {
			t.Fatalf("proxy saw %q", r)
		}
	})
	t.Run("env http", func(t *testing.T) {
		p := startProxy(t, plain.Listener.Addr().String())
		t.Setenv("HTTP_PROXY", p.url.String())
		t.Setenv("NO_PROXY", "")
		if err := get(t, &Kubeconfig{Server: "http://example.com:8080"}); err != nil {
			t.Fatal(err)
		}
		if r := p.requests(); len(r) != 1 || !strings.HasPrefix(r[0], "GET http://example.com:8080/api/v1/namespaces/shop/pods/web-1") {
			t.Fatalf("proxy saw %q", r)
		}
	})
	t.Run("proxy-url http", func(t *testing.T) {
		p := startProxy(t, plain.Listener.Addr().String())
		pu := *p.url
		pu.User = url.UserPassword("u", "p w")
		if err := get(t, &Kubeconfig{Server: "http://example.com:8080", ProxyURL: pu.String()}); err != nil {
			t.Fatal(err)
		}
		if r := p.requests(); len(r) != 1 || !strings.HasPrefix(r[0], "GET http://example.com:8080/api/v1/namespaces/shop/pods/web-1") || !strings.HasSuffix(r[0], "auth="+auth) {
			t.Fatalf("proxy saw %q", r)
		}
	})
	t.Run("env https", func(t *testing.T) {
		p := startProxy(t, api.Listener.Addr().String())
		t.Setenv("HTTPS_PROXY", p.url.String())
		t.Setenv("NO_PROXY", "")
		if err := get(t, &Kubeconfig{Server: server, CAData: caPEM}); err != nil {
			t.Fatal(err)
		}
		if r := p.requests(); len(r) != 1 || r[0] != "CONNECT example.com:6443 auth=" {
			t.Fatalf("proxy saw %q", r)
		}
	})
	t.Run("NO_PROXY", func(t *testing.T) {
		p := startProxy(t, api.Listener.Addr().String())
		t.Setenv("HTTPS_PROXY", p.url.String())
		t.Setenv("NO_PROXY", "example.com")
		// Bypassing the proxy, the client dials example.com itself.
		err := get(t, &Kubeconfig{Server: "https://example.com:1", CAData: caPEM})
		if r := p.requests(); len(r) != 0 || err == nil {
			t.Fatalf("proxy saw %q, err %v: want a direct connection despite HTTPS_PROXY", r, err)
		}
	})
	t.Run("proxy refuses", func(t *testing.T) {
		addr, _ := rawServer(t, "HTTP/1.1 407 Proxy Authentication Required\r\nContent-Length: 0\r\n\r\n")
		err := get(t, &Kubeconfig{Server: server, CAData: caPEM, ProxyURL: "http://" + addr})
		if err == nil || !strings.Contains(err.Error(), "407") {
			t.Fatalf("err = %v, want the proxy's 407", err)
		}
	})
	t.Run("socks", func(t *testing.T) {
		err := get(t, &Kubeconfig{Server: server, CAData: caPEM, ProxyURL: "socks5://127.0.0.1:1080"})
		if err == nil || !strings.Contains(err.Error(), "only http and https proxies") {
			t.Fatalf("err = %v, want socks refused", err)
		}
	})
}

// FuzzReadResponse: any bytes from the server give a response within the
// bounds or an error, never a panic.
func FuzzReadResponse(f *testing.F) {
	f.Add([]byte("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"))
	f.Add([]byte("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n"))
	f.Add([]byte("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.0 404 NF\n\nbody"))
	f.Add([]byte("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffff\r\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		const max = 64
		r, err := readResponse(bufio.NewReader(bytes.NewReader(data)), max)
		if err != nil {
			return
		}
		if len(r.body) > max+1 || r.code < 100 || r.code > 999 {
			t.Fatalf("code %d, %d-byte body", r.code, len(r.body))
		}
	})
}
