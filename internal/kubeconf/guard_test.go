package kubeconf

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestRedact(t *testing.T) {
	const tok = "eyJhbGciOi.payload.sig"
	for _, tc := range []struct{ in, want string }{
		{"Authorization: Bearer " + tok, "Authorization: Bearer [redacted]"},
		{"authorization: bearer other-token-of-someone", "authorization: bearer [redacted]"},
		{"token " + tok + " echoed", "token [redacted] echoed"},
		{"BASIC dXNlcjpwYXNz here", "BASIC [redacted] here"},
		{"Bearer ", "Bearer "},
		{"no credentials, a bearer of news", "no credentials, a bearer [redacted] news"},
		{"Bearer [redacted]", "Bearer [redacted]"},
		{"İ Bearer x", "İ Bearer [redacted]"},
		{"short tok stays", "short tok stays"},
	} {
		if got := Redact(tc.in, tok, "tok"); got != tc.want {
			t.Errorf("Redact(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// FuzzRedact: no secret of minSecret bytes or more survives, and nothing
// panics.
func FuzzRedact(f *testing.F) {
	f.Add("Authorization: Bearer abcdef123", "abcdef123")
	f.Add("x Basic Zm9vOmJhcg== y", "Zm9vOmJhcg==")
	f.Add("İİİ bearer ", "secret")
	f.Fuzz(func(t *testing.T, s, secret string) {
		got := Redact(s, secret)
		if len(secret) >= minSecret && !strings.Contains(Redacted, secret) && strings.Contains(got, secret) &&
			!strings.Contains(strings.ReplaceAll(s, secret, ""), secret) {
			t.Fatalf("Redact(%q, %q) = %q keeps the secret", s, secret, got)
		}
	})
}

// TestAnswerKinds: the kind of answer each request gets, from its URL as
// the API server parses it; a path it cannot place is an object (the
// smaller bound).
func TestAnswerKinds(t *testing.T) {
	for _, tc := range []struct {
		method, url string
		want        string
	}{
		{"GET", "/api/v1/pods?fieldSelector=spec.nodeName%3Dn&limit=500", "list"},
		{"GET", "/api/v1/pods?watch=true&resourceVersion=7", "watch"},
		{"GET", "/api/v1/pods?watch=1", "watch"},
		{"GET", "/api/v1/pods?watch=false", "list"},
		{"GET", "/api/v1/watch/pods", "watch"},
		{"GET", "/api/v1/namespaces/shop/pods", "list"},
		{"GET", "/api/v1/namespaces/shop/pods/web-1", "object"},
		{"GET", "/api/v1/namespaces/shop/pods/web-1/status", "object"},
		{"PATCH", "/api/v1/namespaces/shop/pods/web-1", "object"},
		{"POST", "/api/v1/namespaces/shop/events", "object"},
		{"GET", "/api/v1/namespaces", "list"},
		{"GET", "/api/v1/namespaces/shop", "object"},
		{"GET", "/api/v1/nodes/node-1", "object"},
		{"GET", "/apis/events.k8s.io/v1/namespaces/shop/events", "list"},
		{"GET", "/apis/apps/v1beta2/deployments", "list"},
		{"GET", "/k8s/clusters/c-1/api/v1/pods", "list"},
		{"GET", "/api/v1", "object"},
		{"GET", "/version", "object"},
		{"GET", "/api/x1/pods", "object"},
		{"GET", "/apis/g/v0/things", "object"},
		{"GET", "/apis/g/v1gamma1/things", "object"},
	} {
		req := httptest.NewRequest(tc.method, "https://api.example"+tc.url, nil)
		got := "object"
		switch {
		case isWatch(req):
			got = "watch"
		case req.Method == http.MethodGet && isCollection(req.URL.Path):
			got = "list"
		}
		if got != tc.want {
			t.Errorf("%s %s: %s, want %s", tc.method, tc.url, got, tc.want)
		}
	}
}

// TestEventCapped: a JSON watch stream passes while each line is within
// the bound, however long the stream and however its reads fall, and fails
// with ErrAnswerTooLarge once a line is over, whether it ends in the read
// or runs on.
func TestEventCapped(t *testing.T) {
	line := strings.Repeat("x", 99) + "\n" // 99 bytes and its newline
	for _, tc := range []struct {
		name   string
		stream string
		max    int64
		ok     bool
	}{
		{"many lines at the bound", strings.Repeat(line, 1000), 99, true},
		{"one byte over, ended", line + strings.Repeat("y", 100) + "\n" + line, 99, false},
		{"one byte over, running on", line + strings.Repeat("y", 100), 99, false},
		{"no newline at all", strings.Repeat("z", 1000), 99, false},
		{"empty lines", "\n\n\n", 0, true},
	} {
		for _, chunk := range []int{1, 7, 100, 4096} {
			r := &eventCapped{r: io.NopCloser(&chunked{s: tc.stream, n: chunk}), max: tc.max}
			_, err := io.ReadAll(r)
			if tc.ok != (err == nil) || err != nil && !errors.Is(err, ErrAnswerTooLarge) {
				t.Errorf("%s, reads of %d: %v", tc.name, chunk, err)
			}
		}
	}
}

// chunked reads s n bytes at a time.
type chunked struct {
	s string
	n int
}

func (c *chunked) Read(p []byte) (int, error) {
	if c.s == "" {
		return 0, io.EOF
	}
	k := copy(p[:min(len(p), c.n)], c.s)
	c.s = c.s[k:]
	return k, nil
}
