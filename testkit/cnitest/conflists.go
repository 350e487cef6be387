package cnitest

import (
	"path/filepath"
	"runtime"
	"testing"
)

// ConfDir is testdata/conflists of this repository: the primary CNI
// configs of real clusters (one per CNI) and invalid ones, found from this
// file's own place so that any package's tests can read it.
func ConfDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "testdata", "conflists")
}

// RealWorld lists the primary configs in ConfDir, failing the test when
// fewer than the 8 real-world ones are there.
func RealWorld(t testing.TB) []string {
	t.Helper()
	dir := ConfDir()
	var out []string
	for _, pat := range []string{"*.conflist", "*.conf"} {
		m, err := filepath.Glob(filepath.Join(dir, pat))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, m...)
	}
	if len(out) < 8 {
		t.Fatalf("want the 8 real-world configs in %s, found %v", dir, out)
	}
	return out
}
