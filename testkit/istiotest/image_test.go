package istiotest

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"

	"github.com/nftmesh/nftmesh/testkit/imagetest"
)

// TestStandinImage: the image holds the three programs where Rewrite's
// commands point, executable by anyone, byte for byte.
func TestStandinImage(t *testing.T) {
	if testing.Short() {
		t.Skip("builds tools/imagebuild's fileimage: not in -short")
	}
	dir := t.TempDir()
	var srcs []string
	for _, n := range []string{"pilot-agent", "standin-proxy", "standin-app"} {
		p := filepath.Join(dir, n)
		if err := os.WriteFile(p, []byte("#!"+n), 0o700); err != nil {
			t.Fatal(err)
		}
		srcs = append(srcs, p)
	}
	archive := filepath.Join(dir, "standin.tar")
	if err := StandinImage(srcs[0], srcs[1], srcs[2], archive, "localhost/standin:test"); err != nil {
		t.Fatal(err)
	}
	img, err := imagetest.Read(archive)
	if err != nil {
		t.Fatal(err)
	}
	agent, proxy, app := Standin{}.paths()
	for path, want := range map[string]string{agent: "#!pilot-agent", proxy: "#!standin-proxy", app: "#!standin-app"} {
		sum := sha256.Sum256([]byte(want))
		if f, ok := img.Files[path]; !ok || f.SHA256 != hex.EncodeToString(sum[:]) || f.Mode != 0o755 {
			t.Errorf("%s = %+v (present %v), want %q with mode 0755 (image has %v)", path, f, ok, want, img.Files)
		}
	}
	if len(img.Files) != 3 {
		t.Errorf("the image holds %v, want the three programs", img.Files)
	}
	if len(img.Entrypoint) != 1 || img.Entrypoint[0] != agent {
		t.Errorf("entrypoint %v", img.Entrypoint)
	}
	if err := StandinImage(filepath.Join(dir, "missing"), srcs[1], srcs[2], filepath.Join(dir, "x.tar"), "localhost/standin:test"); err == nil {
		t.Error("a missing binary was not an error")
	}
}
