package kubeconf

import (
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
