package imagebuild

import (
	"debug/elf"
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// fakeBins are static binaries of arch, told apart by tag.
func fakeBins(t *testing.T, m elf.Machine, tag string) Binaries {
	b := func(name string) []byte { return append(fakeELF(t, m, false), name+tag...) }
	return Binaries{Agent: b("agent"), Plugin: b("plugin"), Standalone: b("standalone"), Redirect: b("redirect")}
}

func releaseInput(t *testing.T) (map[string]Binaries, Meta) {
	return map[string]Binaries{"arm64": fakeBins(t, elf.EM_AARCH64, ""), "amd64": fakeBins(t, elf.EM_X86_64, "")},
		Meta{Version: "v0.3.0", Revision: "0123abcd", Created: time.Unix(1700000000, 0)}
}

// readDir is every file under dir by relative path.
func readDir(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		rel, _ := filepath.Rel(dir, p)
		out[rel] = string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// The index is as reproducible as its images: two builds of the same
// binaries give the same digest and the same layout, byte for byte; each
// platform's image is the one a build of that architecture alone gives
// (what `make image` gave before the index); a changed binary of one
// architecture changes its image and the index, not the other image.
func TestNftmeshIndexIsReproducible(t *testing.T) {
	bins, meta := releaseInput(t)
	layoutOf := func(p Platforms) (v1.Hash, map[string]string) {
		t.Helper()
		d, err := p.Index.Digest()
		if err != nil {
			t.Fatal(err)
		}
		dir := filepath.Join(t.TempDir(), "oci")
		if err := WriteOCIIndexLayout(dir, "ghcr.io/nftmesh/nftmesh:v0.3.0", p.Index); err != nil {
			t.Fatal(err)
		}
		return d, readDir(t, dir)
	}
	first, err := NftmeshIndex(bins, meta)
	if err != nil {
		t.Fatal(err)
	}
	second, err := NftmeshIndex(bins, meta)
	if err != nil {
		t.Fatal(err)
	}
	d1, l1 := layoutOf(first)
	d2, l2 := layoutOf(second)
	if d1 != d2 || !reflect.DeepEqual(l1, l2) {
		t.Fatalf("two builds of the same binaries: index %s and %s, layouts equal %v", d1, d2, reflect.DeepEqual(l1, l2))
	}
	for arch, b := range bins {
		m := meta
		m.Architecture = arch
		alone, err := Nftmesh(b, m)
		if err != nil {
			t.Fatal(err)
		}
		want, _ := alone.Digest()
		if got, _ := first.Images[arch].Digest(); got != want {
			t.Errorf("linux/%s in the index is %s, built alone %s", arch, got, want)
		}
	}
	changed := map[string]Binaries{"amd64": bins["amd64"], "arm64": fakeBins(t, elf.EM_AARCH64, "!")}
	third, err := NftmeshIndex(changed, meta)
	if err != nil {
		t.Fatal(err)
	}
	d3, _ := third.Index.Digest()
	a1, _ := first.Images["amd64"].Digest()
	a3, _ := third.Images["amd64"].Digest()
	r1, _ := first.Images["arm64"].Digest()
	r3, _ := third.Images["arm64"].Digest()
	if d3 == d1 || r3 == r1 || a3 != a1 {
		t.Errorf("one arm64 byte changed: index %s→%s, arm64 %s→%s, amd64 %s→%s", d1, d3, r1, r3, a1, a3)
	}
}

// The index lists each platform once, in GOARCH order, with the image
// labels as its annotations; the layout holds the index under the tag.
func TestNftmeshIndexLayout(t *testing.T) {
	bins, meta := releaseInput(t)
	p, err := NftmeshIndex(bins, meta)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := WriteOCIIndexLayout(dir, "ghcr.io/nftmesh/nftmesh:v0.3.0", p.Index); err != nil {
		t.Fatal(err)
	}
	top, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	tm, _ := top.IndexManifest()
	d, _ := p.Index.Digest()
	if len(tm.Manifests) != 1 || tm.Manifests[0].MediaType != types.OCIImageIndex || tm.Manifests[0].Digest != d ||
		tm.Manifests[0].Annotations["io.containerd.image.name"] != "ghcr.io/nftmesh/nftmesh:v0.3.0" ||
		tm.Manifests[0].Annotations["org.opencontainers.image.ref.name"] != "v0.3.0" {
		t.Fatalf("layout index.json %+v", tm)
	}
	idx, err := top.ImageIndex(d)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := idx.RawManifest()
	var m v1.IndexManifest
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	var platforms []string
	for _, e := range m.Manifests {
		platforms = append(platforms, e.Platform.String())
		img, err := idx.Image(e.Digest)
		if err != nil {
			t.Fatalf("%s: %v", e.Platform, err)
		}
		cf, _ := img.ConfigFile()
		if cf.OS+"/"+cf.Architecture != e.Platform.String() || e.MediaType != types.OCIManifestSchema1 {
			t.Errorf("%s points at a %s/%s image (%s)", e.Platform, cf.OS, cf.Architecture, e.MediaType)
		}
	}
	if strings.Join(platforms, " ") != "linux/amd64 linux/arm64" {
		t.Errorf("platforms %v", platforms)
	}
	if m.MediaType != types.OCIImageIndex || !reflect.DeepEqual(m.Annotations, Labels(meta)) {
		t.Errorf("index %s, annotations %v; want %v", m.MediaType, m.Annotations, Labels(meta))
	}
}

func TestIndexRefuses(t *testing.T) {
	bins, meta := releaseInput(t)
	if _, err := Index(nil, nil); err == nil || !strings.Contains(err.Error(), "no images") {
		t.Errorf("no images: %v", err)
	}
	m := meta
	m.Architecture = "amd64"
	img, err := Nftmesh(bins["amd64"], m)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Index([]v1.Image{img, img}, nil); err == nil || !strings.Contains(err.Error(), "two images for linux/amd64") {
		t.Errorf("one platform twice: %v", err)
	}
	swapped := map[string]Binaries{"amd64": bins["amd64"], "arm64": bins["amd64"]}
	if _, err := NftmeshIndex(swapped, meta); err == nil || !strings.Contains(err.Error(), "linux/arm64: building the nftmesh image: "+AgentPath+": built for EM_X86_64") {
		t.Errorf("amd64 binaries as arm64's: %v", err)
	}
	if _, err := NftmeshIndex(bins, Meta{}); err == nil || !strings.Contains(err.Error(), "the version is empty") {
		t.Errorf("no version: %v", err)
	}
}
