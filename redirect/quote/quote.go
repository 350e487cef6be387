// Package quote bounds the user input that error messages and log lines
// echo back: quoted, so that its edges and control bytes show, and cut with
// a marker saying how much, so that a 1 MB annotation yields an error of a
// few hundred bytes. Callers name the field and pass the value.
//
// It sits under redirect/ because the model's validation errors use it and
// the model imports nothing from internal/; every layer above uses it too.
package quote

import (
	"fmt"
	"strconv"
	"unicode/utf8"
)

// MaxValue is how many bytes of a value Value shows: enough for any valid
// annotation a person types, a list of a dozen CIDRs, a path.
const MaxValue = 256

// MaxText is how many bytes of a free text (an error message that may
// itself hold values) Text keeps by default.
const MaxText = 4096

// Value quotes v as %q does. Beyond MaxValue bytes only the first MaxValue
// (cut at a rune boundary) are quoted, followed by the marker
// "... (N of M bytes cut)".
func Value(v string) string { return ValueN(v, MaxValue) }

// ValueN is Value with a bound of n bytes.
func ValueN(v string, n int) string {
	head, cut := clip(v, n)
	if cut == 0 {
		return strconv.Quote(v)
	}
	return strconv.Quote(head) + marker(cut, len(v))
}

// Text bounds free text, unquoted (it is already a message), to MaxText
// bytes with the same marker.
func Text(s string) string { return TextN(s, MaxText) }

// TextN is Text with a bound of n bytes.
func TextN(s string, n int) string {
	head, cut := clip(s, n)
	if cut == 0 {
		return s
	}
	return head + marker(cut, len(s))
}

func marker(cut, total int) string {
	return fmt.Sprintf("... (%d of %d bytes cut)", cut, total)
}

// clip returns at most n bytes of s, not splitting a UTF-8 sequence, and
// how many bytes were left out.
func clip(s string, n int) (string, int) {
	if n < 0 {
		n = 0
	}
	if len(s) <= n {
		return s, 0
	}
	end := n
	// If the bound falls inside a valid multi-byte rune, cut before that
	// rune, so the head never ends in half a rune (which %q would show as
	// \x escapes). Invalid bytes are cut where the bound falls.
	for i := end - 1; i >= 0 && i > end-utf8.UTFMax; i-- {
		if utf8.RuneStart(s[i]) {
			if r, size := utf8.DecodeRuneInString(s[i:]); !(r == utf8.RuneError && size == 1) && i+size > end {
				end = i
			}
			break
		}
	}
	return s[:end], len(s) - end
}
