package imagebuild

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// base is the documented input every reproducibility case mutates.
func base() ([]File, Config) {
	files := []File{
		{Path: "/usr/local/bin/app", Mode: 0o755, Data: []byte("\x7fELF pretend binary")},
		{Path: "/etc/app/config.json", Mode: 0o644, Data: []byte(`{"a":1}`)},
		{Path: "/tmp", Mode: fs.ModeDir | fs.ModeSticky | 0o777},
		{Path: "/usr/bin/app", Mode: fs.ModeSymlink | 0o777, Target: "../local/bin/app"},
	}
	cfg := Config{
		Architecture: "amd64",
		Entrypoint:   []string{"/usr/local/bin/app"},
		Cmd:          []string{"--serve"},
		Env:          []string{"PATH=/usr/local/bin:/usr/bin"},
		User:         "0:0",
		Labels:       map[string]string{"org.opencontainers.image.version": "v1.0.0"},
		Created:      time.Unix(1700000000, 0),
	}
	return files, cfg
}

// artefacts is everything a build puts on disk or reports, for comparison.
type artefacts struct {
	id, digest v1.Hash
	archive    []byte
	layout     map[string]string
}

func build(t *testing.T, files []File, cfg Config) artefacts {
	t.Helper()
	img, err := Build(files, cfg)
	if err != nil {
		t.Fatalf("Build: %v", err)
	}
	var a artefacts
	if a.id, err = img.ConfigName(); err != nil {
		t.Fatal(err)
	}
	if a.digest, err = img.Digest(); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	archive := filepath.Join(dir, "image.tar")
	if err := WriteDockerArchive(archive, "localhost/app:test", img); err != nil {
		t.Fatal(err)
	}
	if a.archive, err = os.ReadFile(archive); err != nil {
		t.Fatal(err)
	}
	oci := filepath.Join(dir, "oci")
	if err := WriteOCILayout(oci, "localhost/app:test", img); err != nil {
		t.Fatal(err)
	}
	a.layout = map[string]string{}
	err = filepath.WalkDir(oci, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		rel, _ := filepath.Rel(oci, p)
		a.layout[rel] = string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func TestBuildIsReproducible(t *testing.T) {
	files, cfg := base()
	first := build(t, files, cfg)
	second := build(t, files, cfg)
	if first.id != second.id || first.digest != second.digest {
		t.Fatalf("two builds of the same input: id %v / %v, digest %v / %v", first.id, second.id, first.digest, second.digest)
	}
	if !bytes.Equal(first.archive, second.archive) {
		t.Errorf("two builds of the same input wrote different docker archives (%d and %d bytes)", len(first.archive), len(second.archive))
	}
	if !reflect.DeepEqual(first.layout, second.layout) {
		t.Errorf("two builds of the same input wrote different OCI layouts")
	}

	// The order callers list files in is not an input.
	rev := append([]File(nil), files...)
	for i, j := 0, len(rev)-1; i < j; i, j = i+1, j-1 {
		rev[i], rev[j] = rev[j], rev[i]
	}
	if got := build(t, rev, cfg); got.digest != first.digest {
		t.Errorf("listing the files in another order changed the digest: %v, want %v", got.digest, first.digest)
	}
	// Neither is the zone or the sub-second part of the time.
	c := cfg
	c.Created = cfg.Created.In(time.FixedZone("X", 3600)).Add(300 * time.Millisecond)
	if got := build(t, files, c); got.digest != first.digest {
		t.Errorf("the same second in another zone changed the digest: %v, want %v", got.digest, first.digest)
	}

	// Every real input does change the image.
	changes := []struct {
		name   string
		mutate func(f []File, c *Config) []File
	}{
		{"one byte of a file", func(f []File, c *Config) []File { f[0].Data = []byte("\x7fELF pretend binarY"); return f }},
		{"a file's mode", func(f []File, c *Config) []File { f[1].Mode = 0o600; return f }},
		{"a symlink's target", func(f []File, c *Config) []File { f[3].Target = "/usr/local/bin/app"; return f }},
		{"one more file", func(f []File, c *Config) []File { return append(f, File{Path: "/etc/app/extra", Mode: 0o644}) }},
		{"a file's path", func(f []File, c *Config) []File { f[1].Path = "/etc/app/config.jsom"; return f }},
		{"the creation time", func(f []File, c *Config) []File { c.Created = c.Created.Add(time.Second); return f }},
		{"a label", func(f []File, c *Config) []File {
			c.Labels = map[string]string{"org.opencontainers.image.version": "v1.0.1"}
			return f
		}},
		{"the entrypoint", func(f []File, c *Config) []File { c.Entrypoint = []string{"/usr/bin/app"}; return f }},
		{"the user", func(f []File, c *Config) []File { c.User = "65532:65532"; return f }},
		{"the architecture", func(f []File, c *Config) []File { c.Architecture = "arm64"; return f }},
	}
	seen := map[v1.Hash]string{first.digest: "base"}
	for _, tc := range changes {
		files, cfg := base()
		files = tc.mutate(files, &cfg)
		got := build(t, files, cfg)
		if prev, ok := seen[got.digest]; ok {
			t.Errorf("changing %s gave the digest of %q: %v", tc.name, prev, got.digest)
		}
		seen[got.digest] = tc.name
	}
}

func TestLayerEntries(t *testing.T) {
	files, cfg := base()
	tarBytes, err := Layer(files, cfg.Created)
	if err != nil {
		t.Fatal(err)
	}
	type entry struct {
		name, link string
		typ        byte
		mode       int64
	}
	var got []entry
	tr := tar.NewReader(bytes.NewReader(tarBytes))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Uid != 0 || h.Gid != 0 || h.Uname != "" || h.Gname != "" {
			t.Errorf("%s: owner %d:%d (%q:%q), want 0:0 and no names", h.Name, h.Uid, h.Gid, h.Uname, h.Gname)
		}
		if !h.ModTime.Equal(cfg.Created) {
			t.Errorf("%s: mtime %v, want %v", h.Name, h.ModTime, cfg.Created)
		}
		got = append(got, entry{h.Name, h.Linkname, h.Typeflag, h.Mode})
	}
	want := []entry{
		{"etc/", "", tar.TypeDir, 0o755},
		{"etc/app/", "", tar.TypeDir, 0o755},
		{"etc/app/config.json", "", tar.TypeReg, 0o644},
		{"tmp/", "", tar.TypeDir, 0o1777},
		{"usr/", "", tar.TypeDir, 0o755},
		{"usr/bin/", "", tar.TypeDir, 0o755},
		{"usr/bin/app", "../local/bin/app", tar.TypeSymlink, 0o777},
		{"usr/local/", "", tar.TypeDir, 0o755},
		{"usr/local/bin/", "", tar.TypeDir, 0o755},
		{"usr/local/bin/app", "", tar.TypeReg, 0o755},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("layer entries:\n got %v\nwant %v", got, want)
	}
}

func TestDockerArchiveReadsBack(t *testing.T) {
	files, cfg := base()
	img, err := Build(files, cfg)
	if err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(t.TempDir(), "image.tar")
	const tag = "localhost/app:v1.0.0-3-gabcdef0-dirty"
	if err := WriteDockerArchive(archive, tag, img); err != nil {
		t.Fatal(err)
	}

	// What `ctr images import` and `docker load` read first: the tag is
	// kept as written, not expanded to a registry default.
	manifest := readTarFile(t, archive, "manifest.json")
	var m []struct{ RepoTags []string }
	if err := json.Unmarshal(manifest, &m); err != nil {
		t.Fatalf("manifest.json: %v", err)
	}
	if len(m) != 1 || !reflect.DeepEqual(m[0].RepoTags, []string{tag}) {
		t.Errorf("manifest.json RepoTags: %s, want [%q]", manifest, tag)
	}

	ref, err := name.NewTag(tag)
	if err != nil {
		t.Fatal(err)
	}
	back, err := tarball.ImageFromPath(archive, &ref)
	if err != nil {
		t.Fatalf("reading the archive back: %v", err)
	}
	cf, err := back.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.OS != "linux" || cf.Architecture != "amd64" {
		t.Errorf("platform %s/%s, want linux/amd64", cf.OS, cf.Architecture)
	}
	if !reflect.DeepEqual(cf.Config.Entrypoint, cfg.Entrypoint) || !reflect.DeepEqual(cf.Config.Cmd, cfg.Cmd) ||
		cf.Config.User != cfg.User || !reflect.DeepEqual(cf.Config.Env, cfg.Env) || !reflect.DeepEqual(cf.Config.Labels, cfg.Labels) {
		t.Errorf("config read back: %+v, want entrypoint, cmd, user, env and labels of %+v", cf.Config, cfg)
	}
	if !cf.Created.Time.Equal(cfg.Created) || len(cf.History) != 1 || !cf.History[0].Created.Time.Equal(cfg.Created) {
		t.Errorf("created %v, history %+v: want every time %v", cf.Created, cf.History, cfg.Created)
	}
	wantID, _ := img.ConfigName()
	if gotID, _ := back.ConfigName(); gotID != wantID {
		t.Errorf("image id read back %v, want %v", gotID, wantID)
	}

	// The OCI layout names the image in its index.
	oci := filepath.Join(t.TempDir(), "oci")
	if err := WriteOCILayout(oci, tag, img); err != nil {
		t.Fatal(err)
	}
	idx, err := layout.ImageIndexFromPath(oci)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	wantDigest, _ := img.Digest()
	if len(im.Manifests) != 1 || im.Manifests[0].Digest != wantDigest ||
		im.Manifests[0].Annotations["io.containerd.image.name"] != tag ||
		im.Manifests[0].Annotations["org.opencontainers.image.ref.name"] != "v1.0.0-3-gabcdef0-dirty" {
		t.Errorf("OCI index: %+v, want the one image %v named %s", im.Manifests, wantDigest, tag)
	}
}

func readTarFile(t *testing.T, archive, want string) []byte {
	t.Helper()
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err != nil {
			t.Fatalf("%s in %s: %v", want, archive, err)
		}
		if h.Name == want {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			return b
		}
	}
}

func TestBuildRejectsBadFiles(t *testing.T) {
	reg := func(p string) File { return File{Path: p, Mode: 0o644} }
	cases := []struct {
		name  string
		files []File
		want  string
	}{
		{"relative path", []File{reg("usr/bin/app")}, `"usr/bin/app": the path must be absolute`},
		{"empty path", []File{reg("")}, `"": the path must be absolute`},
		{"root", []File{{Path: "/", Mode: fs.ModeDir | 0o755}}, `"/": the root is not an entry`},
		{"dot-dot", []File{reg("/usr/../etc/x")}, `"/usr/../etc/x": the path must be clean ("/etc/x")`},
		{"trailing slash", []File{reg("/etc/x/")}, `the path must be clean`},
		{"NUL in path", []File{reg("/etc/x\x00y")}, `contains a NUL byte`},
		{"twice", []File{reg("/etc/x"), reg("/etc/x")}, `"/etc/x": listed twice`},
		{"dir listed twice", []File{{Path: "/etc", Mode: fs.ModeDir | 0o755}, {Path: "/etc", Mode: fs.ModeDir | 0o700}}, `"/etc": listed twice`},
		{"under a file", []File{reg("/etc/x"), reg("/etc/x/y")}, `"/etc/x/y": its parent "/etc/x" is not a directory`},
		{"under a symlink", []File{{Path: "/lib", Mode: fs.ModeSymlink, Target: "usr/lib"}, reg("/lib/x")}, `its parent "/lib" is not a directory`},
		{"symlink without target", []File{{Path: "/lib", Mode: fs.ModeSymlink}}, `a symlink needs a target`},
		{"symlink with data", []File{{Path: "/lib", Mode: fs.ModeSymlink, Target: "x", Data: []byte("y")}}, `a symlink has no data`},
		{"dir with data", []File{{Path: "/d", Mode: fs.ModeDir, Data: []byte("x")}}, `a directory has no data`},
		{"file with target", []File{{Path: "/f", Target: "x"}}, `a regular file has no symlink target`},
		{"device", []File{{Path: "/dev/null", Mode: fs.ModeDevice | fs.ModeCharDevice | 0o666}}, `is not a regular file, directory or symlink`},
		{"long path is bounded", []File{reg(strings.Repeat("x", 5000))}, `xxx"...: the path must be absolute`},
		{"long binary path is bounded", []File{reg(strings.Repeat("\x84", 5000))}, `\x84"...: the path must be absolute`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Build(tc.files, Config{})
			if err == nil {
				t.Fatalf("Build accepted %.200q", fmt.Sprint(tc.files))
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q, want it to contain %q", err, tc.want)
			}
			if len(err.Error()) > 400 {
				t.Errorf("error is %d bytes long: the path must be bounded", len(err.Error()))
			}
		})
	}
}

func TestWriteDockerArchiveRejectsBadTag(t *testing.T) {
	files, cfg := base()
	img, err := Build(files, cfg)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	err = WriteDockerArchive(filepath.Join(dir, "x.tar"), "localhost/app:v1+meta", img)
	if err == nil || !strings.Contains(err.Error(), `"localhost/app:v1+meta"`) {
		t.Errorf("a tag with '+' gave %v, want an error naming it", err)
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Errorf("a refused write left %v behind", left)
	}
}

// FuzzLayer: any file list either is refused with an error or gives a tar
// holding every listed regular file, with its content, once.
func FuzzLayer(f *testing.F) {
	f.Add("/usr/local/bin/app", "/etc/x", []byte("data"), uint32(0o755))
	f.Add("/a/b", "/a", []byte{}, uint32(fs.ModeDir|0o755))
	f.Add("/a", "/a/../b", []byte("x"), uint32(fs.ModeSymlink))
	f.Fuzz(func(t *testing.T, p1, p2 string, data []byte, mode uint32) {
		m := fs.FileMode(mode)
		second := File{Path: p2, Mode: m}
		switch m.Type() {
		case fs.ModeSymlink:
			second.Target = "target"
		case 0:
			second.Data = data
		}
		files := []File{{Path: p1, Mode: 0o644, Data: data}, second}
		tarBytes, err := Layer(files, time.Unix(1, 0))
		if err != nil {
			// Two paths at most, each bounded.
			if len(err.Error()) > 700 {
				t.Errorf("unbounded error: %d bytes", len(err.Error()))
			}
			return
		}
		found := map[string]int{}
		tr := tar.NewReader(bytes.NewReader(tarBytes))
		for {
			h, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("the layer does not read back: %v", err)
			}
			found["/"+strings.TrimSuffix(h.Name, "/")]++
			if h.Typeflag == tar.TypeReg {
				b, _ := io.ReadAll(tr)
				if !bytes.Equal(b, data) {
					t.Errorf("%s: content %q, want %q", h.Name, b, data)
				}
			}
		}
		for _, f := range files {
			if found[f.Path] != 1 {
				t.Errorf("%q appears %d times in the layer, want once (%v)", f.Path, found[f.Path], found)
			}
		}
	})
}
