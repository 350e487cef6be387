package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestNetnsPath(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "pod1"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	huge := strings.Repeat("n", 1<<20)
	for _, tc := range []struct {
		in, want string
		mention  []string // for errors
	}{
		{"pod1", filepath.Join(dir, "pod1"), nil},
		{"/proc/self/ns/net", "/proc/self/ns/net", nil},
		{"./pod1", "./pod1", nil},
		{"/run/netns/none", "/run/netns/none", nil}, // paths are opened (and judged) later
		{"pod2", "", []string{`"pod2"`, dir, "ip netns list", "./pod2"}},
		{"", "", []string{`""`, "not a namespace"}},
		{".", "", []string{`"."`, "not a namespace"}},
		{"..", "", []string{`".."`, "not a namespace"}},
		{"a\x00b", "", []string{`"a\x00b"`}},
		{huge, "", []string{"bytes cut", "not a namespace"}},
		{strings.Repeat("n", 256), "", []string{"not a namespace"}},
	} {
		got, err := netnsPath(tc.in, dir)
		if tc.mention == nil {
			if err != nil || got != tc.want {
				t.Errorf("netnsPath(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
			}
			continue
		}
		var ee *exitError
		if err == nil || !errors.As(err, &ee) || ee.code != exitUsage {
			t.Errorf("netnsPath(%.40q) = %q, %v; want a usage error", tc.in, got, err)
			continue
		}
		if len(err.Error()) > 1200 {
			t.Errorf("netnsPath(%.40q): error of %d bytes", tc.in, len(err.Error()))
		}
		for _, m := range tc.mention {
			if !strings.Contains(err.Error(), m) {
				t.Errorf("netnsPath(%.40q): %q does not mention %q", tc.in, err, m)
			}
		}
	}
}

// FuzzNetnsPath: a value with "/" is kept as it is; any other gives a path
// inside dir or an error, never a panic or a path elsewhere.
func FuzzNetnsPath(f *testing.F) {
	dir := f.TempDir()
	_ = os.WriteFile(filepath.Join(dir, "x"), nil, 0o600)
	f.Add("x")
	f.Add("..")
	f.Add("/proc/1/ns/net")
	f.Fuzz(func(t *testing.T, v string) {
		got, err := netnsPath(v, dir)
		switch {
		case strings.Contains(v, "/"):
			if err != nil || got != v {
				t.Fatalf("netnsPath(%q) = %q, %v", v, got, err)
			}
		case err == nil && filepath.Dir(got) != dir:
			t.Fatalf("netnsPath(%q) = %q, outside %s", v, got, dir)
		}
	})
}
