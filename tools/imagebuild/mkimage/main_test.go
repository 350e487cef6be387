package main

import (
	"archive/tar"
	"bytes"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	spdxjson "github.com/spdx/tools-golang/json"
	"github.com/spdx/tools-golang/spdxlib"

	"github.com/nftmesh/nftmesh/tools/imagebuild"
)

func TestParseCreated(t *testing.T) {
	ok := []struct {
		in   string
		want time.Time
	}{
		{"", time.Unix(0, 0)},
		{"0", time.Unix(0, 0)},
		{"1700000000", time.Unix(1700000000, 0)},
		{"253402300799", time.Unix(253402300799, 0)},
	}
	for _, tc := range ok {
		got, err := parseCreated(tc.in)
		if err != nil || !got.Equal(tc.want) || got.Location() != time.UTC {
			t.Errorf("parseCreated(%q) = %v, %v; want %v UTC", tc.in, got, err, tc.want)
		}
	}
	for _, in := range []string{"-1", "1.5", "2023-11-14", " 1", "0x10", "253402300800", "99999999999999999999", strings.Repeat("9", 500), strings.Repeat("\x84", 500)} {
		_, err := parseCreated(in)
		if err == nil {
			t.Errorf("parseCreated(%q) accepted it", in)
			continue
		}
		if !strings.Contains(err.Error(), "--created (SOURCE_DATE_EPOCH)") || len(err.Error()) > 200 {
			t.Errorf("parseCreated(%q): %q, want a bounded error naming the flag", in, err)
		}
	}
}

func FuzzParseCreated(f *testing.F) {
	for _, s := range []string{"", "0", "1700000000", "-1", "1e9", "253402300800"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, err := parseCreated(s)
		if err != nil {
			if len(err.Error()) > 200 {
				t.Errorf("unbounded error: %d bytes", len(err.Error()))
			}
			return
		}
		if got.Year() > 9999 || got.Before(time.Unix(0, 0)) {
			t.Errorf("parseCreated(%q) = %v, outside what the config can hold", s, got)
		}
	})
}

func TestRunRequiresItsInputs(t *testing.T) {
	noenv := func(string) (string, bool) { return "", false }
	empty := t.TempDir()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--version", "v1", "--out", "x.tar"}, "--bin-dir is required"},
		{[]string{"--bin-dir", ".", "--out", "x.tar"}, "--version is required"},
		{[]string{"--bin-dir", ".", "--version", "v1"}, "nothing to write: give --oci-dir, --out or --sbom"},
		{[]string{"--bin-dir", ".", "--version", "v1", "--oci-dir", "x", "--arch", ""}, "--arch is empty"},
		{[]string{"--bin-dir", ".", "--version", "v1", "--out", "x.tar", "--arch", "arm64", "--archive-arch", "amd64"}, `--archive-arch "amd64" is not one of --arch [arm64]`},
		{[]string{"--bin-dir", empty, "--version", "v1", "--out", "x.tar"}, "reading the binary"},
		{[]string{"--bin-dir", empty, "--version", "v1", "--oci-dir", "x", "--arch", "amd64,amd64"}, `--arch lists "amd64" twice`},
		{[]string{"--bin-dir", ".", "--version", "v1", "--out", "x.tar", "--created", "yesterday"}, `--created (SOURCE_DATE_EPOCH) "yesterday"`},
		{[]string{"--bin-dir", ".", "--version", "v1", "--out", "x.tar", "--tag", "UPPER/" + strings.Repeat("x", 300)}, `--tag "UPPER/xxxx`},
	} {
		var stdout, stderr bytes.Buffer
		if code := run(tc.args, noenv, &stdout, &stderr); code != 1 || !strings.Contains(stderr.String(), tc.want) || len(stderr.String()) > 400 {
			t.Errorf("mkimage %.100q: exit %d, %q; want exit 1 and %q", tc.args, code, stderr.String(), tc.want)
		}
	}
}

// makeImage runs `make image` into bin with fixed inputs.
func makeImage(t *testing.T, root, bin, version, epoch string) time.Duration {
	t.Helper()
	start := time.Now()
	cmd := exec.Command("make", "-C", root, "image", "BIN="+bin, "VERSION="+version, "SOURCE_DATE_EPOCH="+epoch, "REVISION=0123456789abcdef", "ARCHES=amd64 arm64")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make image: %v\n%s", err, out)
	}
	return time.Since(start)
}

// filesOf is every file under dir by relative path.
func filesOf(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		out[rel], err = os.ReadFile(p)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestMakeImage runs `make image` as a user does, twice from the same inputs
// into two directories, and proves: everything it wrote (the binaries of
// both architectures, the index's layout, the archive, the SBOM) is byte for
// byte the same; every binary reports the VERSION it was built with; the
// index holds linux/amd64 and linux/arm64, each the four binaries of its
// architecture at their paths; the archive is the host's image with the
// version's tag and labels; the SBOM names the index and lists the modules
// the binaries link at the root go.mod's versions; a changed input changes
// the image.
func TestMakeImage(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the four binaries of two architectures twice: not in -short")
	}
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make is not installed")
	}
	root, err := filepath.Abs(filepath.Join("..", "..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	const version = "v9.8.7-image-test"
	a, b := t.TempDir(), t.TempDir()
	t.Logf("make image (cold link): %v", makeImage(t, root, a, version, "1700000000"))
	t.Logf("make image (again): %v", makeImage(t, root, b, version, "1700000000"))
	fa, fb := filesOf(t, a), filesOf(t, b)
	for f, x := range fa {
		if !bytes.Equal(x, fb[f]) {
			t.Errorf("%s differs between two builds of the same inputs (%d and %d bytes)", f, len(x), len(fb[f]))
		}
	}
	for _, f := range []string{"nftmesh-image.tar", "nftmesh-image.spdx.json", "nftmesh-image.oci/index.json", "image/linux-arm64/nftmesh-agent"} {
		if _, ok := fa[f]; !ok || len(fa) != len(fb) {
			t.Fatalf("make image wrote no %s (%d and %d files)", f, len(fa), len(fb))
		}
	}
	checkVersions(t, filepath.Join(a, "image", "linux-"+runtime.GOARCH), version)
	tag := checkArchive(t, a, version)
	digest := checkIndex(t, a, tag)
	checkSBOM(t, root, a, digest)

	// A changed input (here the time) changes the image.
	other := filepath.Join(t.TempDir(), "other.oci")
	var stdout, stderr bytes.Buffer
	args := []string{"--bin-dir", filepath.Join(a, "image"), "--arch", "amd64,arm64", "--version", version, "--created", "1700000001", "--oci-dir", other}
	if code := run(args, func(string) (string, bool) { return "", false }, &stdout, &stderr); code != 0 {
		t.Fatalf("mkimage: exit %d\n%s", code, stderr.String())
	}
	if !strings.Contains(stdout.String(), "index   sha256:") || strings.Contains(stdout.String(), digest.String()) {
		t.Errorf("one second later the index is still %s:\n%s", digest, stdout.String())
	}
}

// checkVersions: every binary says which version it is.
func checkVersions(t *testing.T, dir, version string) {
	t.Helper()
	for _, bin := range []string{"nftmesh-agent", "nftmesh-cni", "redirect"} {
		cmd := exec.Command(filepath.Join(dir, bin), "--version")
		cmd.Env = []string{"PATH=/usr/bin:/bin"}
		out, err := cmd.CombinedOutput()
		want := bin + " " + version + " (go"
		if bin == "redirect" {
			want = "redirect version " + version + " (go" // cobra's own --version line
		}
		if err != nil || !strings.HasPrefix(string(out), want) {
			t.Errorf("%s --version: %v, %q; want it to start with %q", bin, err, out, want)
		}
	}
	// The companion is the whole plugin: it says it is nftmesh-cni (of
	// this version) whatever file name it runs under.
	cmd := exec.Command(filepath.Join(dir, "nftmesh-cni-standalone"), "--version")
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	if out, err := cmd.CombinedOutput(); err != nil || !strings.HasPrefix(string(out), "nftmesh-cni") || !strings.Contains(string(out), " "+version+" (go") {
		t.Errorf("nftmesh-cni-standalone --version: %v, %q; want nftmesh-cni's line with %s", err, out, version)
	}
	// The plugin's about line, printed when run without CNI_COMMAND.
	cmd = exec.Command(filepath.Join(dir, "nftmesh-cni"))
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	out, _ := cmd.CombinedOutput()
	if want := "nftmesh-cni " + version + ": "; !strings.HasPrefix(string(out), want) {
		t.Errorf("the plugin's about line is %q, want it to start with %q", out, want)
	}
}

// filesInImage are the image's regular files by absolute path.
func filesInImage(t *testing.T, img v1.Image) map[string][]byte {
	t.Helper()
	in := map[string][]byte{}
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return in
		}
		if err != nil {
			t.Fatalf("reading the image's files: %v", err)
		}
		if h.Typeflag == tar.TypeReg {
			in["/"+strings.TrimPrefix(h.Name, "/")], _ = io.ReadAll(tr)
		}
	}
}

// checkFiles: the image holds exactly the four binaries of binDir, at the
// paths the agent and the chart use.
func checkFiles(t *testing.T, what string, img v1.Image, binDir string) {
	t.Helper()
	inImage := filesInImage(t, img)
	for bin, p := range map[string]string{
		"nftmesh-agent": imagebuild.AgentPath, "nftmesh-cni": imagebuild.PluginPath,
		"nftmesh-cni-standalone": imagebuild.StandalonePath, "redirect": imagebuild.RedirectPath,
	} {
		built, _ := os.ReadFile(filepath.Join(binDir, bin))
		if got, ok := inImage[p]; !ok || !bytes.Equal(got, built) {
			t.Errorf("%s: %s (%d bytes, present %v) is not the built %s (%d bytes)", what, p, len(got), ok, bin, len(built))
		}
		delete(inImage, p)
	}
	for p := range inImage {
		t.Errorf("%s holds %s too", what, p)
	}
}

// checkArchive: the docker-archive is the host's image, tagged with the
// version, with the labels.
func checkArchive(t *testing.T, bin, version string) name.Tag {
	t.Helper()
	tag, err := name.NewTag(imagebuild.DefaultRepository + ":" + version)
	if err != nil {
		t.Fatal(err)
	}
	img, err := tarball.ImageFromPath(filepath.Join(bin, "nftmesh-image.tar"), &tag)
	if err != nil {
		t.Fatalf("the archive has no image tagged %s: %v", tag, err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]string{
		"org.opencontainers.image.version":  version,
		"org.opencontainers.image.revision": "0123456789abcdef",
		"org.opencontainers.image.created":  "2023-11-14T22:13:20Z",
	} {
		if cf.Config.Labels[k] != v {
			t.Errorf("label %s = %q, want %q", k, cf.Config.Labels[k], v)
		}
	}
	if cf.OS != "linux" || cf.Architecture != runtime.GOARCH {
		t.Errorf("the archive's platform %q/%q, want the host's linux/%s", cf.OS, cf.Architecture, runtime.GOARCH)
	}
	checkFiles(t, "the archive", img, filepath.Join(bin, "image", "linux-"+runtime.GOARCH))
	return tag
}

// checkIndex: the layout holds the index under the tag, linux/amd64 and
// linux/arm64, each the binaries of its architecture; the host's is the
// archive's image. It returns the index digest.
func checkIndex(t *testing.T, bin string, tag name.Tag) v1.Hash {
	t.Helper()
	top, err := layout.ImageIndexFromPath(filepath.Join(bin, "nftmesh-image.oci"))
	if err != nil {
		t.Fatal(err)
	}
	tm, err := top.IndexManifest()
	if err != nil || len(tm.Manifests) != 1 || tm.Manifests[0].Annotations["io.containerd.image.name"] != tag.String() {
		t.Fatalf("OCI layout index %+v (%v): want the one index named %s", tm, err, tag)
	}
	idx, err := top.ImageIndex(tm.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	var platforms []string
	for _, e := range m.Manifests {
		platforms = append(platforms, e.Platform.String())
		img, err := idx.Image(e.Digest)
		if err != nil {
			t.Fatal(err)
		}
		checkFiles(t, e.Platform.String(), img, filepath.Join(bin, "image", "linux-"+e.Platform.Architecture))
		// A docker-archive keeps the config, not the manifest: the
		// image ID (the config's digest) is what the two share.
		if e.Platform.Architecture == runtime.GOARCH {
			archived, _ := tarball.ImageFromPath(filepath.Join(bin, "nftmesh-image.tar"), &tag)
			id, _ := archived.ConfigName()
			if want, _ := img.ConfigName(); id != want {
				t.Errorf("the archive's image ID is %s, the index's %s has %s", id, e.Platform, want)
			}
		}
	}
	if strings.Join(platforms, ",") != "linux/amd64,linux/arm64" {
		t.Errorf("the index's platforms are %v", platforms)
	}
	return tm.Manifests[0].Digest
}

// checkSBOM: the SBOM describes the index and lists the modules the
// binaries link, at the versions the root go.mod selects (go list -m).
func checkSBOM(t *testing.T, root, bin string, index v1.Hash) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(bin, "nftmesh-image.spdx.json"))
	if err != nil {
		t.Fatal(err)
	}
	doc, err := spdxjson.Read(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	if err := spdxlib.ValidateDocument(doc); err != nil {
		t.Errorf("not valid SPDX: %v", err)
	}
	got := map[string]string{}
	for _, p := range doc.Packages {
		got[p.PackageName] = p.PackageVersion
		if p.PrimaryPackagePurpose == "CONTAINER" && p.PackageChecksums[0].Value != index.Hex {
			t.Errorf("the SBOM's image is %v, the index %s", p.PackageChecksums, index)
		}
	}
	mods := []string{"github.com/google/nftables", "k8s.io/client-go", "github.com/vishvananda/netlink", "github.com/containernetworking/cni", "golang.org/x/sys"}
	out, err := exec.Command("go", append([]string{"-C", root, "list", "-m", "-f", "{{.Path}} {{.Version}}"}, mods...)...).Output()
	if err != nil {
		t.Fatalf("go list -m: %v", err)
	}
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		path, version, _ := strings.Cut(l, " ")
		if got[path] != version {
			t.Errorf("the SBOM lists %s at %q, go.mod selects %s", path, got[path], version)
		}
	}
	if got["stdlib"] != runtime.Version() {
		t.Errorf("the SBOM's standard library is %q, the toolchain %s", got["stdlib"], runtime.Version())
	}
}
