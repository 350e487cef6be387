// Package golden compares test output with files under testdata/, and
// rewrites them when UPDATE_GOLDEN=1 (make update-golden). Goldens are
// reviewed as diffs in commits.
package golden

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"
)

// Root is the repository's top-level testdata directory.
func Root() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "testdata")
}

// Check compares got with testdata/<rel>, or rewrites it under UPDATE_GOLDEN=1.
func Check(t testing.TB, rel, got string) {
	t.Helper()
	path := filepath.Join(Root(), rel)
	if os.Getenv("UPDATE_GOLDEN") == "1" {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("reading golden %s: %v (run `make update-golden` to create it)", rel, err)
	}
	if string(want) != got {
		t.Errorf("output differs from golden %s (run `make update-golden` and review the diff):\n--- want\n%s\n--- got\n%s", rel, want, got)
	}
}
