package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/nftmesh/nftmesh/tools/imagebuild"
)

// build, then show and cat read back what build wrote: the files at their
// paths with mode 0755 whatever the host's, the config as given.
func TestBuildShowCat(t *testing.T) {
	dir := t.TempDir()
	srcA, srcB := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	if err := os.WriteFile(srcA, []byte("#!pause"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(srcB, []byte("proxy"), 0o644); err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(dir, "img.tar")
	var out, errb bytes.Buffer
	args := []string{"build", "--out", archive, "--tag", "localhost/pause:e2e", "--entrypoint", "/pause", "--entrypoint", "-v",
		"--user", "65535:65535", "--label", "a=b", "--file", "/pause=" + srcA, "--file", "/usr/local/bin/proxy=" + srcB}
	if rc := run(args, &out, &errb); rc != 0 {
		t.Fatalf("build: %d %s", rc, errb.String())
	}
	out.Reset()
	if rc := run([]string{"show", "--archive", archive}, &out, &errb); rc != 0 {
		t.Fatalf("show: %d %s", rc, errb.String())
	}
	var s Shown
	if err := json.Unmarshal(out.Bytes(), &s); err != nil {
		t.Fatal(err)
	}
	sum := func(b string) string { h := sha256.Sum256([]byte(b)); return hex.EncodeToString(h[:]) }
	want := Shown{OS: "linux", Architecture: s.Architecture, Entrypoint: []string{"/pause", "-v"}, User: "65535:65535",
		Labels: map[string]string{"a": "b"}, Files: map[string]File{
			"/pause":               {Mode: 0o755, Size: 7, SHA256: sum("#!pause")},
			"/usr/local/bin/proxy": {Mode: 0o755, Size: 5, SHA256: sum("proxy")},
		}}
	if !reflect.DeepEqual(s, want) || s.Architecture == "" {
		t.Errorf("show: %+v\nwant %+v", s, want)
	}
	got := filepath.Join(dir, "got")
	if rc := run([]string{"cat", "--archive", archive, "--path", "/usr/local/bin/proxy", "--out", got}, &out, &errb); rc != 0 {
		t.Fatalf("cat: %d %s", rc, errb.String())
	}
	if b, err := os.ReadFile(got); err != nil || string(b) != "proxy" {
		t.Errorf("cat wrote %q, %v", b, err)
	}
	errb.Reset()
	if rc := run([]string{"cat", "--archive", archive, "--path", "/usr/local/bin", "--out", got}, &out, &errb); rc != 1 ||
		!strings.Contains(errb.String(), `"/usr/local/bin" is not a regular file`) {
		t.Errorf("cat of a directory: %d %q", rc, errb.String())
	}
}

func TestBadInput(t *testing.T) {
	dir := t.TempDir()
	notTar := filepath.Join(dir, "x.tar")
	if err := os.WriteFile(notTar, []byte("not a tar"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		rc   int
		want string
	}{
		{nil, 2, "want a command"},
		{[]string{strings.Repeat("x", 500)}, 2, `unknown command "xxxx`},
		{[]string{"build", "--tag", "a:b", "--file", "/a=b"}, 1, "--out is required"},
		{[]string{"build", "--out", "x", "--file", "/a=b"}, 1, "--tag is required"},
		{[]string{"build", "--out", "x", "--tag", "a:b"}, 1, "--file is required"},
		{[]string{"build", "--out", "x", "--tag", "a:b", "--file", "/a"}, 1, `--file "/a": want /path/in/image=host/file`},
		{[]string{"build", "--out", "x", "--tag", "a:b", "--file", "/a=" + filepath.Join(dir, "missing")}, 1, "no such file"},
		{[]string{"build", "--out", filepath.Join(dir, "o.tar"), "--tag", "a:b", "--file", "a=" + notTar}, 1, `image file "a": the path must be absolute`},
		{[]string{"build", "--out", filepath.Join(dir, "o.tar"), "--tag", "UPPER:b", "--file", "/a=" + notTar}, 1, `parsing the image tag "UPPER:b"`},
		{[]string{"show"}, 1, "--archive is required"},
		{[]string{"show", "--archive", notTar}, 1, "reading the image archive"},
		{[]string{"cat", "--archive", notTar}, 1, "--path and --out are required"},
	} {
		var out, errb bytes.Buffer
		if rc := run(tc.args, &out, &errb); rc != tc.rc || !strings.Contains(errb.String(), tc.want) || len(errb.String()) > 400 {
			t.Errorf("fileimage %.80q: exit %d, %q; want exit %d and %q", tc.args, rc, errb.String(), tc.rc, tc.want)
		}
	}
}

// cat --ref and digest read what a registry holds: the tag's digest, and a
// file of the index's image for the platform asked for.
func TestCatAndDigestFromRegistry(t *testing.T) {
	srv := httptest.NewServer(registry.New())
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	img := func(data string) v1.Image {
		i, err := imagebuild.Build([]imagebuild.File{{Path: "/opt/cni/bin/nftmesh-cni", Mode: 0o755, Data: []byte(data)}}, imagebuild.Config{})
		if err != nil {
			t.Fatal(err)
		}
		return i
	}
	amd, arm := img("amd64 plugin"), img("arm64 plugin")
	idx := mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: amd, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "amd64"}}},
		mutate.IndexAddendum{Add: arm, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "arm64"}}})
	ref := host + "/mesh/nftmesh:v1"
	tag, err := name.NewTag(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.WriteIndex(tag, idx); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	if rc := run([]string{"digest", "--ref", ref}, &out, &errb); rc != 0 {
		t.Fatalf("digest: %d %s", rc, errb.String())
	}
	if d, _ := idx.Digest(); strings.TrimSpace(out.String()) != d.String() {
		t.Errorf("digest printed %q, want %s", out.String(), d)
	}
	got := filepath.Join(t.TempDir(), "got")
	for _, arch := range []string{"amd64", "arm64"} {
		if rc := run([]string{"cat", "--ref", ref, "--platform", "linux/" + arch, "--path", "/opt/cni/bin/nftmesh-cni", "--out", got}, &out, &errb); rc != 0 {
			t.Fatalf("cat --ref %s: %d %s", arch, rc, errb.String())
		}
		if b, _ := os.ReadFile(got); string(b) != arch+" plugin" {
			t.Errorf("cat --ref --platform linux/%s wrote %q", arch, b)
		}
	}
	errb.Reset()
	if rc := run([]string{"cat", "--ref", ref, "--archive", "x.tar", "--path", "/p", "--out", got}, &out, &errb); rc != 1 || !strings.Contains(errb.String(), "give one") {
		t.Errorf("cat with --ref and --archive: %d %q", rc, errb.String())
	}
	errb.Reset()
	if rc := run([]string{"digest", "--ref", host + "/mesh/none:v1"}, &out, &errb); rc != 1 || !strings.Contains(errb.String(), "mesh/none:v1") {
		t.Errorf("digest of a missing tag: %d %q", rc, errb.String())
	}
}
