package quote

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestValue(t *testing.T) {
	long := strings.Repeat("a", 1<<20)
	for _, tc := range []struct {
		name, in string
		n        int
		want     string
	}{
		{"empty", "", 8, `""`},
		{"short", "10.0.0.0/33", 8 << 10, `"10.0.0.0/33"`},
		{"exactly the bound", "abcd", 4, `"abcd"`},
		{"one over", "abcde", 4, `"abcd"... (1 of 5 bytes cut)`},
		{"control bytes stay visible", "a\x00\n", 8, `"a\x00\n"`},
		{"rune not split", "ab€", 3, `"ab"... (3 of 5 bytes cut)`},
		{"rune fits whole", "ab€d", 5, `"ab€"... (1 of 6 bytes cut)`},
		{"invalid UTF-8 is cut at the bound", "ab" + strings.Repeat("\x80", 10), 6, `"ab\x80\x80\x80\x80"... (6 of 12 bytes cut)`},
		{"a stray byte after a whole rune", "0\U00036e36\xb8", 5, `"0\U00036e36"... (1 of 6 bytes cut)`},
		{"zero bound", "abc", 0, `""... (3 of 3 bytes cut)`},
		{"1 MiB", long, MaxValue, `"` + long[:MaxValue] + `"... (1048320 of 1048576 bytes cut)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := ValueN(tc.in, tc.n); got != tc.want {
				t.Errorf("ValueN(%.20q, %d) = %.80s, want %.80s", tc.in, tc.n, got, tc.want)
			}
		})
	}
	if got := Value(long); len(got) > MaxValue+64 {
		t.Errorf("Value of 1 MiB is %d bytes", len(got))
	}
}

func TestText(t *testing.T) {
	if got := TextN("annotation x: bad", 100); got != "annotation x: bad" {
		t.Errorf("short text changed: %q", got)
	}
	if got, want := TextN("annotation x: bad", 10), "annotation... (7 of 17 bytes cut)"; got != want {
		t.Errorf("TextN = %q, want %q", got, want)
	}
	if got := Text(strings.Repeat("é", 1<<19)); len(got) > MaxText+64 || !utf8.ValidString(got) {
		t.Errorf("Text of 1 MiB: %d bytes, valid UTF-8 %t", len(got), utf8.ValidString(got))
	}
}

// FuzzValue: the result is bounded, says it was cut exactly when the input
// is longer than the bound, and keeps a prefix of the input.
func FuzzValue(f *testing.F) {
	f.Add("10.0.0.0/33", 4)
	f.Add("ab€", 3)
	f.Add("\x80\x80\x80\x80\x80", 2)
	f.Fuzz(func(t *testing.T, s string, n int) {
		n = n & 0x3ff
		got := TextN(s, n)
		if len(s) <= n {
			if got != s {
				t.Fatalf("TextN(%q, %d) = %q, want it unchanged", s, n, got)
			}
			return
		}
		head, _, ok := strings.Cut(got, "... (")
		if !ok || !strings.HasPrefix(s, head) || len(head) > n || len(head) < n-utf8.UTFMax+1 {
			t.Fatalf("TextN(%q, %d) = %q", s, n, got)
		}
		if utf8.ValidString(s[:n]) && !utf8.ValidString(head) {
			t.Fatalf("TextN(%q, %d) split a rune: %q", s, n, got)
		}
	})
}
