package installer

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// writeLikePrimary writes b to p in place or by renaming a new file over it.
func writeLikePrimary(t *testing.T, p string, b []byte, inPlace bool) {
	t.Helper()
	if inPlace {
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	tmp := p + ".primary-new"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, p); err != nil {
		t.Fatal(err)
	}
}

func assertOnly(t *testing.T, dir string, names ...string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range entries {
		got = append(got, e.Name())
	}
	if len(got) != len(names) {
		t.Fatalf("%s holds %v, want %v (a temp file left?)", dir, got, names)
	}
	for i := range names {
		if got[i] != names[i] {
			t.Fatalf("%s holds %v, want %v", dir, got, names)
		}
	}
}

func setBeforeSwap(t *testing.T, f func(string)) {
	t.Helper()
	beforeSwap = f
	t.Cleanup(func() { beforeSwap = nil })
}

func TestReplaceIfUnchanged(t *testing.T) {
	v1, v2, ours := []byte(`{"v":1}`), []byte(`{"v":2}`), []byte(`{"v":1,"ours":true}`)
	for _, inPlace := range []bool{true, false} {
		name := map[bool]string{true: "in-place", false: "rename"}[inPlace]
		setup := func(t *testing.T) (string, snapshot) {
			dir := t.TempDir()
			p := filepath.Join(dir, "10-x.conflist")
			if err := os.WriteFile(p, v1, 0o640); err != nil {
				t.Fatal(err)
			}
			base, err := readSnapshot(p)
			if err != nil {
				t.Fatal(err)
			}
			return p, base
		}
		t.Run(name+"/unchanged", func(t *testing.T) {
			p, base := setup(t)
			if err := replaceIfUnchanged(base, ours, 0o640, -1, -1); err != nil {
				t.Fatal(err)
			}
			if got, _ := os.ReadFile(p); !bytes.Equal(got, ours) {
				t.Errorf("file holds %s", got)
			}
			if m := modeOf(t, p); m != 0o640 {
				t.Errorf("mode %v", m)
			}
			assertOnly(t, filepath.Dir(p), "10-x.conflist")
		})
		// The primary writes after our read: the check sees it.
		t.Run(name+"/changed-before-check", func(t *testing.T) {
			p, base := setup(t)
			writeLikePrimary(t, p, v2, inPlace)
			if err := replaceIfUnchanged(base, ours, 0o640, -1, -1); !errors.Is(err, errChanged) {
				t.Fatalf("want errChanged, got %v", err)
			}
			if got, _ := os.ReadFile(p); !bytes.Equal(got, v2) {
				t.Errorf("the primary's write was lost: file holds %s", got)
			}
			assertOnly(t, filepath.Dir(p), "10-x.conflist")
		})
		// The primary writes in the instant between the check and the
		// rename: the exchange takes its version out, and it goes back.
		t.Run(name+"/changed-after-check", func(t *testing.T) {
			p, base := setup(t)
			setBeforeSwap(t, func(string) { writeLikePrimary(t, p, v2, inPlace) })
			if err := replaceIfUnchanged(base, ours, 0o640, -1, -1); !errors.Is(err, errChanged) {
				t.Fatalf("want errChanged, got %v", err)
			}
			if got, _ := os.ReadFile(p); !bytes.Equal(got, v2) {
				t.Errorf("the primary's last-instant write was lost: file holds %s", got)
			}
			assertOnly(t, filepath.Dir(p), "10-x.conflist")
		})
	}
	// Through a symlink: the target is replaced, the link stays.
	t.Run("symlink", func(t *testing.T) {
		dir := t.TempDir()
		target := filepath.Join(dir, "real", "x.conflist")
		_ = os.Mkdir(filepath.Dir(target), 0o755)
		if err := os.WriteFile(target, v1, 0o644); err != nil {
			t.Fatal(err)
		}
		link := filepath.Join(dir, "10-x.conflist")
		if err := os.Symlink("real/x.conflist", link); err != nil {
			t.Fatal(err)
		}
		base, err := readSnapshot(link)
		if err != nil {
			t.Fatal(err)
		}
		if base.path != target {
			t.Fatalf("resolved to %s, want %s", base.path, target)
		}
		if err := replaceIfUnchanged(base, ours, 0o644, -1, -1); err != nil {
			t.Fatal(err)
		}
		if d, err := os.Readlink(link); err != nil || d != "real/x.conflist" {
			t.Errorf("the link was replaced (%q, %v)", d, err)
		}
		if got, _ := os.ReadFile(target); !bytes.Equal(got, ours) {
			t.Errorf("target holds %s", got)
		}
		assertOnly(t, filepath.Dir(target), "x.conflist")
	})
	// Creating: never over a file that appeared meanwhile.
	t.Run("create", func(t *testing.T) {
		p := filepath.Join(t.TempDir(), "10-x.conflist")
		base, err := readSnapshot(p)
		if err != nil || base.exists {
			t.Fatalf("%+v %v", base, err)
		}
		setBeforeSwap(t, func(string) { writeLikePrimary(t, p, v2, true) })
		if err := replaceIfUnchanged(base, ours, 0o644, -1, -1); !errors.Is(err, errChanged) {
			t.Fatalf("want errChanged, got %v", err)
		}
		if got, _ := os.ReadFile(p); !bytes.Equal(got, v2) {
			t.Errorf("file holds %s", got)
		}
	})
}

func TestRemoveIfUnchanged(t *testing.T) {
	v1, v2 := []byte(`{"v":1}`), []byte(`{"v":2}`)
	for _, inPlace := range []bool{true, false} {
		for _, late := range []bool{false, true} {
			name := map[bool]string{true: "in-place", false: "rename"}[inPlace] + map[bool]string{true: "/after-check", false: "/before-check"}[late]
			t.Run(name, func(t *testing.T) {
				p := filepath.Join(t.TempDir(), "10-x.conf")
				if err := os.WriteFile(p, v1, 0o644); err != nil {
					t.Fatal(err)
				}
				base, err := readSnapshot(p)
				if err != nil {
					t.Fatal(err)
				}
				if late {
					setBeforeSwap(t, func(string) { writeLikePrimary(t, p, v2, inPlace) })
				} else {
					writeLikePrimary(t, p, v2, inPlace)
				}
				if err := removeIfUnchanged(base); !errors.Is(err, errChanged) {
					t.Fatalf("want errChanged, got %v", err)
				}
				if got, _ := os.ReadFile(p); !bytes.Equal(got, v2) {
					t.Errorf("the primary's new version was removed: %q", got)
				}
				assertOnly(t, filepath.Dir(p), "10-x.conf")
			})
		}
	}
	t.Run("unchanged-link", func(t *testing.T) {
		dir := t.TempDir()
		target := filepath.Join(dir, "real.conf")
		if err := os.WriteFile(target, v1, 0o644); err != nil {
			t.Fatal(err)
		}
		link := filepath.Join(dir, "10-x.conf")
		if err := os.Symlink("real.conf", link); err != nil {
			t.Fatal(err)
		}
		base, err := readSnapshot(link)
		if err != nil {
			t.Fatal(err)
		}
		if err := removeIfUnchanged(base); err != nil {
			t.Fatal(err)
		}
		assertOnly(t, dir, "real.conf") // the link goes, its target stays
	})
}
