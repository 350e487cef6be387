package main

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

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
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--version", "v1", "--out", "x.tar"}, "--bin-dir is required"},
		{[]string{"--bin-dir", ".", "--out", "x.tar"}, "--version is required"},
		{[]string{"--bin-dir", ".", "--version", "v1"}, "--out is required"},
		{[]string{"--bin-dir", t.TempDir(), "--version", "v1", "--out", "x.tar"}, "reading the binary"},
		{[]string{"--bin-dir", ".", "--version", "v1", "--out", "x.tar", "--created", "yesterday"}, `--created (SOURCE_DATE_EPOCH) "yesterday"`},
	} {
		var stdout, stderr bytes.Buffer
		if code := run(tc.args, noenv, &stdout, &stderr); code != 1 || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("mkimage %v: exit %d, %q; want exit 1 and %q", tc.args, code, stderr.String(), tc.want)
		}
	}
}

// TestMakeImage runs `make image` as a user does, twice from the same inputs
// into two directories, and proves: the two archives are byte for byte the
// same (the binaries too: -trimpath, no build ID); every binary reports the
// VERSION it was built with (the plugin's about line too); the image holds
// the four at their paths; the image's version label and tag carry the
// version; a changed input changes the image.
func TestMakeImage(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the four binaries twice: not in -short")
	}
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make is not installed")
	}
	root, err := filepath.Abs(filepath.Join("..", "..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	const version = "v9.8.7-image-test"
	const epoch = "1700000000"
	makeImage := func(bin string) time.Duration {
		t.Helper()
		start := time.Now()
		cmd := exec.Command("make", "-C", root, "image", "BIN="+bin, "VERSION="+version, "SOURCE_DATE_EPOCH="+epoch, "REVISION=0123456789abcdef")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("make image: %v\n%s", err, out)
		}
		return time.Since(start)
	}
	a, b := t.TempDir(), t.TempDir()
	t.Logf("make image (cold link): %v", makeImage(a))
	t.Logf("make image (again): %v", makeImage(b))

	for _, f := range []string{"image/nftmesh-agent", "image/nftmesh-cni", "image/nftmesh-cni-standalone", "image/redirect", "nftmesh-image.tar", "nftmesh-image.oci/index.json"} {
		x, err1 := os.ReadFile(filepath.Join(a, f))
		y, err2 := os.ReadFile(filepath.Join(b, f))
		if err1 != nil || err2 != nil {
			t.Fatalf("%s: %v, %v", f, err1, err2)
		}
		if !bytes.Equal(x, y) {
			t.Errorf("%s differs between two builds of the same inputs (%d and %d bytes)", f, len(x), len(y))
		}
	}
	if fi, err := os.Stat(filepath.Join(a, "nftmesh-image.tar")); err == nil {
		t.Logf("archive: %.1f MiB", float64(fi.Size())/(1<<20))
	}

	// Every binary says which version it is.
	for _, bin := range []string{"nftmesh-agent", "nftmesh-cni", "redirect"} {
		cmd := exec.Command(filepath.Join(a, "image", bin), "--version")
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
	cmd := exec.Command(filepath.Join(a, "image", "nftmesh-cni-standalone"), "--version")
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	if out, err := cmd.CombinedOutput(); err != nil || !strings.HasPrefix(string(out), "nftmesh-cni") || !strings.Contains(string(out), " "+version+" (go") {
		t.Errorf("nftmesh-cni-standalone --version: %v, %q; want nftmesh-cni's line with %s", err, out, version)
	}
	// The plugin's about line, printed when run without CNI_COMMAND.
	cmd = exec.Command(filepath.Join(a, "image", "nftmesh-cni"))
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	out, _ := cmd.CombinedOutput()
	if want := "nftmesh-cni " + version + ": "; !strings.HasPrefix(string(out), want) {
		t.Errorf("the plugin's about line is %q, want it to start with %q", out, want)
	}

	// The image's tag and labels.
	archive := filepath.Join(a, "nftmesh-image.tar")
	tag, err := name.NewTag(imagebuild.DefaultRepository + ":" + version)
	if err != nil {
		t.Fatal(err)
	}
	img, err := tarball.ImageFromPath(archive, &tag)
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
	if cf.OS != "linux" || cf.Architecture == "" {
		t.Errorf("platform %q/%q", cf.OS, cf.Architecture)
	}
	// The image's files are the built binaries, at the paths the agent and
	// the chart use.
	inImage := map[string][]byte{}
	rc := mutate.Extract(img)
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("reading the image's files: %v", err)
		}
		if h.Typeflag == tar.TypeReg {
			inImage["/"+strings.TrimPrefix(h.Name, "/")], _ = io.ReadAll(tr)
		}
	}
	rc.Close()
	for bin, p := range map[string]string{
		"nftmesh-agent": imagebuild.AgentPath, "nftmesh-cni": imagebuild.PluginPath,
		"nftmesh-cni-standalone": imagebuild.StandalonePath, "redirect": imagebuild.RedirectPath,
	} {
		built, _ := os.ReadFile(filepath.Join(a, "image", bin))
		if got, ok := inImage[p]; !ok || !bytes.Equal(got, built) {
			t.Errorf("the image's %s (%d bytes, present %v) is not the built %s (%d bytes)", p, len(got), ok, bin, len(built))
		}
		delete(inImage, p)
	}
	for p := range inImage {
		t.Errorf("the image holds %s too", p)
	}
	var index struct {
		Manifests []struct{ Annotations map[string]string }
	}
	raw, _ := os.ReadFile(filepath.Join(a, "nftmesh-image.oci", "index.json"))
	if err := json.Unmarshal(raw, &index); err != nil || len(index.Manifests) != 1 ||
		index.Manifests[0].Annotations["io.containerd.image.name"] != tag.String() {
		t.Errorf("OCI layout index %s (%v): want the one image named %s", raw, err, tag)
	}

	// A changed input (here the time) changes the image.
	id, _ := img.ConfigName()
	digest, _ := img.Digest()
	other := filepath.Join(t.TempDir(), "other.tar")
	var stdout, stderr bytes.Buffer
	args := []string{"--bin-dir", filepath.Join(a, "image"), "--version", version, "--revision", "0123456789abcdef", "--created", "1700000001", "--out", other}
	if code := run(args, func(string) (string, bool) { return "", false }, &stdout, &stderr); code != 0 {
		t.Fatalf("mkimage: exit %d\n%s", code, stderr.String())
	}
	img2, err := tarball.ImageFromPath(other, &tag)
	if err != nil {
		t.Fatal(err)
	}
	id2, _ := img2.ConfigName()
	digest2, _ := img2.Digest()
	if id2 == id || digest2 == digest {
		t.Errorf("one second later: id %v, digest %v; the same as before", id2, digest2)
	}
}
