package istiotest

import (
	"archive/tar"
	"io"
	"os"
	"path/filepath"
	"testing"
)

// TestStandinImage: the image holds the three programs where Rewrite's
// commands point, executable by anyone, byte for byte.
func TestStandinImage(t *testing.T) {
	dir := t.TempDir()
	var srcs []string
	for _, n := range []string{"pilot-agent", "standin-proxy", "standin-app"} {
		p := filepath.Join(dir, n)
		if err := os.WriteFile(p, []byte("#!"+n), 0o755); err != nil {
			t.Fatal(err)
		}
		srcs = append(srcs, p)
	}
	img, err := StandinImage(srcs[0], srcs[1], srcs[2])
	if err != nil {
		t.Fatal(err)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers: %v, %v", layers, err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	got := map[string]string{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			b, _ := io.ReadAll(tr)
			if h.Mode&0o755 != 0o755 {
				t.Errorf("%s has mode %o", h.Name, h.Mode)
			}
			got["/"+h.Name] = string(b)
		}
	}
	agent, proxy, app := Standin{}.paths()
	for path, want := range map[string]string{agent: "#!pilot-agent", proxy: "#!standin-proxy", app: "#!standin-app"} {
		if got[path] != want {
			t.Errorf("%s = %q, want %q (image has %v)", path, got[path], want, got)
		}
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if len(cf.Config.Entrypoint) != 1 || cf.Config.Entrypoint[0] != agent {
		t.Errorf("entrypoint %v", cf.Config.Entrypoint)
	}
	if _, err := StandinImage(filepath.Join(dir, "missing"), srcs[1], srcs[2]); err == nil {
		t.Error("a missing binary was not an error")
	}
}
