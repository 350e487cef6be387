package podget

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/client-go/rest"
)

// fakeAPI serves pod GETs with answer, given the 1-based number of the
// request, and counts the requests.
func fakeAPI(t *testing.T, answer func(n int, w http.ResponseWriter, r *http.Request)) (*Client, *atomic.Int32) {
	t.Helper()
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		answer(int(n.Add(1)), w, r)
	}))
	t.Cleanup(srv.Close)
	c, err := New(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	return c, &n
}

func reply(code int, contentType, body string) func(int, http.ResponseWriter, *http.Request) {
	return func(_ int, w http.ResponseWriter, _ *http.Request) {
		if contentType != "" {
			w.Header().Set("Content-Type", contentType)
		}
		w.WriteHeader(code)
		fmt.Fprint(w, body)
	}
}

func podAnswer(namespace, name string) string {
	return fmt.Sprintf(`{"kind":"Pod","apiVersion":"v1","metadata":{"name":%q,"namespace":%q,"uid":"u-1"}}`, name, namespace)
}

func statusJSON(code int, reason string) string {
	return fmt.Sprintf(`{"kind":"Status","apiVersion":"v1","status":"Failure","message":"the server says %s","reason":%q,"code":%d}`, reason, reason, code)
}

// TestGetPodFinalAnswers: an answer that waiting cannot change fails at
// once, with its own cause, after exactly the requests it needs. Before,
// anything that was not an API status (garbage, another kind, a request
// client-go would not build) was retried for the whole timeout and
// reported as "API server not reachable".
func TestGetPodFinalAnswers(t *testing.T) {
	const timeout = 20 * time.Second // a retry loop would take all of it
	const json = "application/json"
	for _, tc := range []struct {
		name      string
		ask       string // the pod name asked for; default web-1
		answer    func(int, http.ResponseWriter, *http.Request)
		want      []string
		requests  int32
		wrongPod  bool
		retryable bool
	}{
		{name: "garbage JSON", answer: reply(200, json, `{"kind":"Pod","metadata":`),
			want: []string{"getting pod shop/web-1", "unexpected end of JSON input"}, requests: 1},
		{name: "another kind", answer: reply(200, json, `{"kind":"Service","apiVersion":"v1","metadata":{"name":"web-1","namespace":"shop"}}`),
			want: []string{"getting pod shop/web-1", `"Service"`}, requests: 1},
		{name: "an HTML page", answer: reply(200, "text/html", "<html>login</html>"),
			want: []string{"getting pod shop/web-1", "text/html"}, requests: 1},
		{name: "an empty answer", answer: reply(200, json, ""),
			want: []string{"getting pod shop/web-1", "0-length"}, requests: 1},
		{name: "another pod", answer: reply(200, json, podAnswer("shop", "web-2")),
			want: []string{"shop/web-1", `"shop/web-2"`, "not the pod asked for"}, requests: 1, wrongPod: true},
		{name: "the same name in another namespace", answer: reply(200, json, podAnswer("bank", "web-1")),
			want: []string{"shop/web-1", `"bank/web-1"`}, requests: 1, wrongPod: true},
		{name: "a success status, not a pod", answer: reply(200, json, `{"kind":"Status","apiVersion":"v1","status":"Success"}`),
			want: []string{"shop/web-1", `"Status"`, "not a v1 Pod"}, requests: 1},
		{name: "a Pod of another version", answer: reply(200, json, `{"kind":"Pod","apiVersion":"v2","metadata":{"name":"web-1","namespace":"shop"}}`),
			want: []string{"shop/web-1", `"v2"`}, requests: 1},
		{name: "invalid name", ask: "web/1", answer: reply(200, json, podAnswer("shop", "web/1")),
			want: []string{"getting pod shop/web/1", "invalid resource name"}, requests: 0},
		{name: "dot-dot name", ask: "..", answer: reply(200, json, podAnswer("shop", "..")),
			want: []string{"getting pod shop/..", "invalid resource name"}, requests: 0},
		{name: "forbidden", answer: reply(403, json, statusJSON(403, "Forbidden")),
			want: []string{"getting pod shop/web-1", "Forbidden"}, requests: 1},
		{name: "bad request", answer: reply(400, json, statusJSON(400, "BadRequest")),
			want: []string{"getting pod shop/web-1", "BadRequest"}, requests: 1},
		{name: "unauthorized, not a status", answer: reply(401, "text/plain", "who are you"),
			want: []string{"getting pod shop/web-1", "provide credentials"}, requests: 1},
		// The cached read's miss is asked again with a consistent read.
		{name: "not found", answer: reply(404, json, statusJSON(404, "NotFound")),
			want: []string{"getting pod shop/web-1", "NotFound"}, requests: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c, n := fakeAPI(t, tc.answer)
			name := tc.ask
			if name == "" {
				name = "web-1"
			}
			start := time.Now()
			pod, err := c.GetPod(context.Background(), "shop", name, "", timeout)
			took := time.Since(start)
			if err == nil {
				t.Fatalf("GetPod = %+v, want an error", pod)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %s", err, w)
				}
			}
			if strings.Contains(err.Error(), "not reachable") || Retryable(err) {
				t.Errorf("error %q (retryable %t) blames the connection", err, Retryable(err))
			}
			if errors.Is(err, ErrWrongPod) != tc.wrongPod {
				t.Errorf("errors.Is(%v, ErrWrongPod) = %t", err, !tc.wrongPod)
			}
			if took > 3*time.Second {
				t.Errorf("GetPod took %v, want an answer at once (timeout %v)", took, timeout)
			}
			if got := n.Load(); got != tc.requests {
				t.Errorf("%d requests, want %d", got, tc.requests)
			}
		})
	}
}

// TestGetPodRetriesWhatCanGetBetter: 429, 5xx, a connection closed
// mid-answer and a stalled attempt are asked again until the pod comes.
func TestGetPodRetriesWhatCanGetBetter(t *testing.T) {
	const json = "application/json"
	pod := reply(200, json, podAnswer("shop", "web-1"))
	thenPod := func(fails int, bad func(int, http.ResponseWriter, *http.Request)) func(int, http.ResponseWriter, *http.Request) {
		return func(n int, w http.ResponseWriter, r *http.Request) {
			if n <= fails {
				bad(n, w, r)
				return
			}
			pod(n, w, r)
		}
	}
	closeMidAnswer := func(_ int, w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", json)
		w.Header().Set("Content-Length", "1000")
		w.WriteHeader(200)
		fmt.Fprint(w, `{"kind":"Pod",`)
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			conn.Close()
		}
	}
	stall := func(_ int, _ http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-time.After(5 * time.Second):
		}
	}
	for _, tc := range []struct {
		name   string
		answer func(int, http.ResponseWriter, *http.Request)
	}{
		{"429", thenPod(2, reply(429, json, statusJSON(429, "TooManyRequests")))},
		{"503", thenPod(2, reply(503, json, statusJSON(503, "ServiceUnavailable")))},
		{"500 not a status", thenPod(2, reply(500, "text/plain", "oops"))},
		{"504 timeout", thenPod(1, reply(504, json, statusJSON(504, "Timeout")))},
		{"closed mid-answer", thenPod(2, closeMidAnswer)},
		{"a stalled attempt", thenPod(1, stall)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c, n := fakeAPI(t, tc.answer)
			c.attemptTime = 300 * time.Millisecond
			got, err := c.GetPod(context.Background(), "shop", "web-1", "", 20*time.Second)
			if err != nil {
				t.Fatalf("GetPod: %v after %d requests", err, n.Load())
			}
			if got.Name != "web-1" || n.Load() < 2 {
				t.Fatalf("got %s after %d requests", got.Name, n.Load())
			}
		})
	}
}

// TestGetPodHonoursRetryAfter: a 429 with Retry-After: 1 is asked again
// no sooner than a second later, not after the 50 ms backoff.
func TestGetPodHonoursRetryAfter(t *testing.T) {
	var first, second atomic.Int64 // UnixNano of each request
	c, n := fakeAPI(t, func(i int, w http.ResponseWriter, r *http.Request) {
		if i == 1 {
			first.Store(time.Now().UnixNano())
			w.Header().Set("Retry-After", "1")
			reply(429, "text/plain", "slow down")(i, w, r)
			return
		}
		second.Store(time.Now().UnixNano())
		reply(200, "application/json", podAnswer("shop", "web-1"))(i, w, r)
	})
	if _, err := c.GetPod(context.Background(), "shop", "web-1", "", 20*time.Second); err != nil {
		t.Fatal(err)
	}
	if gap := time.Duration(second.Load() - first.Load()); n.Load() != 2 || gap < 900*time.Millisecond {
		t.Errorf("%d requests, the second %v after the first; want 2, at least 1s apart", n.Load(), gap)
	}
}

// TestGetPodGivesUp: what keeps failing is reported by what it was, after
// the timeout.
func TestGetPodGivesUp(t *testing.T) {
	for _, tc := range []struct {
		name   string
		answer func(int, http.ResponseWriter, *http.Request)
		want   string
	}{
		{"503", reply(503, "application/json", statusJSON(503, "ServiceUnavailable")), "API server still failing"},
		{"429", reply(429, "application/json", statusJSON(429, "TooManyRequests")), "API server still throttling"},
		{"stalled", func(_ int, _ http.ResponseWriter, r *http.Request) { <-r.Context().Done() }, "no answer from the API server"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c, n := fakeAPI(t, tc.answer)
			const timeout = 700 * time.Millisecond
			start := time.Now()
			_, err := c.GetPod(context.Background(), "shop", "web-1", "", timeout)
			took := time.Since(start)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !Retryable(err) {
				t.Fatalf("err = %v, want %q (retryable)", err, tc.want)
			}
			if took < timeout || took > timeout+2*time.Second {
				t.Errorf("gave up after %v, want about %v", took, timeout)
			}
			if tc.name != "stalled" && n.Load() < 3 {
				t.Errorf("%d requests in %v, want retries", n.Load(), took)
			}
		})
	}
}

// TestGetPodPlainHTTPServer: a kubeconfig saying https for a server that
// speaks plain HTTP is a final answer, not a connection to wait for.
func TestGetPodPlainHTTPServer(t *testing.T) {
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { n.Add(1) }))
	t.Cleanup(srv.Close)
	c, err := New(&rest.Config{Host: "https://" + srv.Listener.Addr().String(), TLSClientConfig: rest.TLSClientConfig{Insecure: true}})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = c.GetPod(context.Background(), "shop", "web-1", "", 20*time.Second)
	if err == nil || Retryable(err) || !strings.Contains(err.Error(), "HTTP response to HTTPS client") || time.Since(start) > 3*time.Second {
		t.Fatalf("err = %v (retryable %t) after %v, want a final error at once", err, Retryable(err), time.Since(start))
	}
}

func TestRetryable(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{context.Canceled, false},
		{fmt.Errorf("attempt: %w", context.DeadlineExceeded), true},
		{errors.New("resource name may not be empty"), false},
	} {
		if got := Retryable(tc.err); got != tc.want {
			t.Errorf("Retryable(%v) = %t, want %t", tc.err, got, tc.want)
		}
	}
}
