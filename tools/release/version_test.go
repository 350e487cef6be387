package main

import (
	"regexp"
	"strings"
	"testing"
)

func TestParseRelease(t *testing.T) {
	for _, v := range []string{"v0.1.0", "v1.2.3", "v10.20.30", "v0.0.1"} {
		if got, err := parseRelease(v); err != nil || got != v {
			t.Errorf("parseRelease(%q) = %q, %v; want it accepted", v, got, err)
		}
	}
	long := "v" + strings.Repeat("9", 500)
	for _, tc := range []struct{ in, want string }{
		{"", "VERSION is not given"},
		{"0.1.0", `VERSION "0.1.0" is not SemVer with a leading v`},
		{"V0.1.0", `VERSION "V0.1.0" is not SemVer`},
		{"v01.2.3", `VERSION "v01.2.3" is not SemVer`},
		{"v1.2.3 ", `VERSION "v1.2.3 " is not SemVer`},
		{"v1.2.3\n", `VERSION "v1.2.3\n" is not SemVer`},
		{"release", `VERSION "release" is not SemVer`},
		{"v1.2", `VERSION "v1.2" leaves out part of MAJOR.MINOR.PATCH`},
		{"v1", `VERSION "v1" leaves out part`},
		{"v1.2.3-rc.1", `VERSION "v1.2.3-rc.1" is a pre-release ("-rc.1")`},
		{"v0.2.0-dev", `VERSION "v0.2.0-dev" is a pre-release`},
		{"v1.2.3+meta", `VERSION "v1.2.3+meta" has build metadata "+meta"`},
		{long, `(501 bytes)`},
	} {
		_, err := parseRelease(tc.in)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("parseRelease(%q) = %v, want an error containing %q", tc.in, err, tc.want)
			continue
		}
		if len(err.Error()) > 400 {
			t.Errorf("parseRelease(%q): a %d-byte error, want the value cut short", tc.in, len(err.Error()))
		}
	}
}

func TestNextDev(t *testing.T) {
	for in, want := range map[string]string{"v0.1.0": "0.2.0-dev", "v0.1.7": "0.2.0-dev", "v1.9.0": "1.10.0-dev", "v2.0.0": "2.1.0-dev"} {
		if got := nextDev(in); got != want {
			t.Errorf("nextDev(%s) = %s, want %s", in, got, want)
		}
	}
}

var releaseForm = regexp.MustCompile(`^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)$`)

// FuzzParseRelease: what parseRelease accepts is exactly vX.Y.Z without
// leading zeros, and what it refuses gets a bounded message naming it.
func FuzzParseRelease(f *testing.F) {
	for _, s := range []string{"v0.1.0", "0.1.0", "v1.2", "v1.2.3-rc.1", "v1.2.3+x", "", "v00.1.0", "v1.2.3.4"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, err := parseRelease(s)
		if ok := releaseForm.MatchString(s); ok != (err == nil) {
			t.Fatalf("parseRelease(%q) = %q, %v; the form says accepted=%v", s, v, err, ok)
		}
		if err != nil {
			if len(err.Error()) > 400 {
				t.Fatalf("parseRelease(%q): %d-byte error", s, len(err.Error()))
			}
			return
		}
		if dev := nextDev(v); !strings.HasSuffix(dev, ".0-dev") || strings.HasPrefix(dev, "0.0.") {
			t.Fatalf("nextDev(%s) = %s", v, dev)
		}
	})
}
