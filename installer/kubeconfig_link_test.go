package installer

import (
	"os"
	"path/filepath"
	"testing"
)

// TestSyncKubeconfigReplacesSymlink: a symlink at the plugin's kubeconfig
// in the run dir, to a file elsewhere that holds the very bytes wanted
// (mode 0600), is replaced by a file of our own, the target untouched.
// Before, the sync saw the wanted bytes through the link and kept it: the
// plugin then read whatever the link's target would hold next.
func TestSyncKubeconfigReplacesSymlink(t *testing.T) {
	want := []byte(`{"apiVersion":"v1","kind":"Config"}`)
	target := filepath.Join(t.TempDir(), "elsewhere")
	if err := os.WriteFile(target, want, KubeconfigMode); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.Symlink(target, path); err != nil {
		t.Fatal(err)
	}
	wrote, err := syncKubeconfig(path, want)
	if err != nil || !wrote {
		t.Fatalf("syncKubeconfig over a symlink = %v, %v; want it written", wrote, err)
	}
	if st, err := os.Lstat(path); err != nil || !st.Mode().IsRegular() || st.Mode().Perm() != KubeconfigMode {
		t.Fatalf("kubeconfig after the sync: %v, %v; want a regular 0600 file", st, err)
	}
	if data, err := os.ReadFile(target); err != nil || string(data) != string(want) {
		t.Errorf("target: %q, %v", data, err)
	}
	if wrote, err := syncKubeconfig(path, want); err != nil || wrote {
		t.Errorf("second sync = %v, %v; want nothing written", wrote, err)
	}
}
