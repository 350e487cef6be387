package imagetest

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// Write, Read and ReadFile through the tooling module's command: what Write
// put in, Read and ReadFile give back; a bad spec is the command's error.
func TestWriteRead(t *testing.T) {
	if testing.Short() {
		t.Skip("builds tools/imagebuild's fileimage: not in -short")
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "pause")
	if err := os.WriteFile(src, []byte("#!pause"), 0o600); err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(dir, "pause.tar")
	spec := Spec{Tag: "localhost/pause:test", Files: []File{{"/pause", src}}, Entrypoint: []string{"/pause"},
		User: "65535:65535", Labels: map[string]string{"b": "2", "a": "1"}}
	if err := Write(archive, spec); err != nil {
		t.Fatal(err)
	}
	img, err := Read(archive)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte("#!pause"))
	want := &Image{OS: "linux", Architecture: img.Architecture, Entrypoint: spec.Entrypoint, User: spec.User, Labels: spec.Labels,
		Files: map[string]FileInfo{"/pause": {Mode: 0o755, Size: 7, SHA256: hex.EncodeToString(sum[:])}}}
	if !reflect.DeepEqual(img, want) {
		t.Errorf("Read: %+v\nwant %+v", img, want)
	}
	if b, err := ReadFile(archive, "/pause"); err != nil || string(b) != "#!pause" {
		t.Errorf("ReadFile: %q, %v", b, err)
	}
	if _, err := ReadFile(archive, "/nothing"); err == nil || !strings.Contains(err.Error(), `"/nothing" is not a regular file`) {
		t.Errorf("ReadFile of a missing file: %v", err)
	}
	err = Write(filepath.Join(dir, "x.tar"), Spec{Tag: "localhost/x:1", Files: []File{{"relative", src}}})
	if err == nil || !strings.Contains(err.Error(), "the path must be absolute") {
		t.Errorf("a relative path: %v", err)
	}
}
