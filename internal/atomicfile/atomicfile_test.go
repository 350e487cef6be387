package atomicfile

import (
	"os"
	"path/filepath"
	"testing"
)

func TestWriteReplacesWithModeAndLeavesNoTemp(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "f")
	for i, content := range []string{"one", "two"} {
		if err := Write(p, []byte(content), 0o640, Options{Sync: i == 0}); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(p)
		if err != nil || string(b) != content {
			t.Fatalf("content %q %v, want %q", b, err, content)
		}
		if fi, _ := os.Stat(p); fi.Mode().Perm() != 0o640 {
			t.Fatalf("mode %v, want 0640 (umask must not apply)", fi.Mode().Perm())
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Fatalf("dir holds %d entries, want only the file", len(entries))
	}
	if err := Write(filepath.Join(dir, "missing", "f"), []byte("x"), 0o600, Options{}); err == nil {
		t.Fatal("writing into a missing dir succeeded")
	}
}

func TestRemoveLeftovers(t *testing.T) {
	dir := t.TempDir()
	left := filepath.Join(dir, TempPrefix+"conf-123"+TempSuffix)
	keep := []string{"a.conflist", TempPrefix + "no-suffix", "x" + TempSuffix}
	for _, n := range append(keep, filepath.Base(left)) {
		if err := os.WriteFile(filepath.Join(dir, n), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if !IsTemp(left) || IsTemp("a.conflist") {
		t.Fatal("IsTemp misclassifies")
	}
	if err := RemoveLeftovers(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(left); !os.IsNotExist(err) {
		t.Errorf("leftover %s survived", left)
	}
	for _, n := range keep {
		if _, err := os.Stat(filepath.Join(dir, n)); err != nil {
			t.Errorf("%s removed: %v", n, err)
		}
	}
	if err := RemoveLeftovers(filepath.Join(dir, "absent")); err != nil {
		t.Errorf("absent dir: %v", err)
	}
}

func TestWriteTempLeavesOnlyTheTempFile(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "f")
	tmp, err := WriteTemp(p, []byte("new"), 0o640, Options{Sync: true})
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Dir(tmp) != dir || !IsTemp(tmp) {
		t.Fatalf("temp file %s: not a temp file of ours in %s", tmp, dir)
	}
	st, err := os.Stat(tmp)
	if err != nil || st.Mode().Perm() != 0o640 {
		t.Fatalf("temp file: %v, mode %v", err, st.Mode())
	}
	if data, _ := os.ReadFile(tmp); string(data) != "new" {
		t.Fatalf("temp file holds %q", data)
	}
	if _, err := os.Stat(p); !os.IsNotExist(err) {
		t.Fatalf("WriteTemp created %s itself: %v", p, err)
	}
	// A directory that is not there: an error, and nothing left anywhere.
	if _, err := WriteTemp(filepath.Join(dir, "gone", "f"), []byte("x"), 0o600, Options{}); err == nil {
		t.Fatal("WriteTemp into a missing directory succeeded")
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Fatalf("dir holds %d entries, want only the first temp file", len(entries))
	}
}
