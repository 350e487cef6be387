package main

import (
	"archive/tar"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

func TestParseBadInput(t *testing.T) {
	dir := t.TempDir()
	prog := filepath.Join(dir, "prog")
	if err := os.WriteFile(prog, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		args    []string
		wantErr string
	}{
		{"no out", []string{"--tag", "a:b", "--file", "/p=" + prog}, "--out is required"},
		{"no tag", []string{"--out", "x", "--file", "/p=" + prog}, "--tag is required"},
		{"nothing in it", []string{"--out", "x", "--tag", "a:b"}, "the image would be empty"},
		{"file without =", []string{"--out", "x", "--tag", "a:b", "--file", "/p"}, `--file "/p": want /path/in/image=host/file`},
		{"relative file path", []string{"--out", "x", "--tag", "a:b", "--file", "p=" + prog}, "want /path/in/image=host/file"},
		{"missing file", []string{"--out", "x", "--tag", "a:b", "--file", "/p=" + filepath.Join(dir, "nope")}, "no such file"},
		{"link without target", []string{"--out", "x", "--tag", "a:b", "--link", "/l="}, `--link "/l=": want /path/in/image=target`},
		{"long value cut", []string{"--out", "x", "--tag", "a:b", "--file", strings.Repeat("p", 500)}, "...\": want"},
		{"unknown flag", []string{"--nope"}, "unknown flag"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parse(tc.args)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("parse(%q) error %v, want one containing %q", tc.args, err, tc.wantErr)
			}
			if err != nil && len(err.Error()) > 300 {
				t.Errorf("error of %d bytes: the value is not bounded", len(err.Error()))
			}
		})
	}
	if err := run([]string{"--out", filepath.Join(dir, "o.tar"), "--tag", "Not A Tag", "--file", "/p=" + prog}); err == nil || !strings.Contains(err.Error(), "Not A Tag") {
		t.Errorf("a bad tag: %v", err)
	}
}

// TestRootImage builds an image of a root tarball, a file and a link under
// two names and reads it back with go-containerregistry: the root layer
// as it was, then the files layer; the config; both names.
func TestRootImage(t *testing.T) {
	dir := t.TempDir()
	root := filepath.Join(dir, "root.tar")
	f, err := os.Create(root)
	if err != nil {
		t.Fatal(err)
	}
	tw := tar.NewWriter(f)
	for _, h := range []*tar.Header{
		{Name: "bin/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "bin/sh", Typeflag: tar.TypeSymlink, Linkname: "dash"},
	} {
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	prog := filepath.Join(dir, "prog")
	if err := os.WriteFile(prog, []byte("program"), 0o600); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "img.tar")
	tags := []string{"registry.example/a/agnhost:2.59", "registry.example/b/busybox:1"}
	if err := run([]string{"--out", out, "--root", root, "--file", "/agnhost=" + prog, "--link", "/agnhost-2=agnhost",
		"--entrypoint", "/agnhost", "--cmd", "pause", "--env", "PATH=/bin", "--tag", tags[0], "--tag", tags[1]}); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(out); err != nil || st.Mode().Perm() != 0o644 {
		t.Fatalf("archive %v %v, want mode 0644", st, err)
	}
	for _, tag := range tags {
		ref, _ := name.NewTag(tag)
		img, err := tarball.ImageFromPath(out, &ref)
		if err != nil {
			t.Fatalf("%s: %v", tag, err)
		}
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if c := cf.Config; !slices.Equal(c.Entrypoint, []string{"/agnhost"}) || !slices.Equal(c.Cmd, []string{"pause"}) || !slices.Equal(c.Env, []string{"PATH=/bin"}) || cf.OS != "linux" {
			t.Errorf("%s: config %+v", tag, cf)
		}
		layers, err := img.Layers()
		if err != nil || len(layers) != 2 {
			t.Fatalf("%s: %d layers (%v), want the root's and the files'", tag, len(layers), err)
		}
		files := map[string]*tar.Header{}
		rc := mutate.Extract(img)
		tr := tar.NewReader(rc)
		for {
			h, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			files[strings.TrimPrefix(h.Name, "/")] = h
		}
		rc.Close()
		if h := files["bin/sh"]; h == nil || h.Linkname != "dash" {
			t.Errorf("%s: the root's bin/sh: %+v", tag, h)
		}
		if h := files["agnhost"]; h == nil || h.Mode&0o777 != 0o755 || h.Size != int64(len("program")) {
			t.Errorf("%s: /agnhost: %+v", tag, h)
		}
		if h := files["agnhost-2"]; h == nil || h.Typeflag != tar.TypeSymlink || h.Linkname != "agnhost" {
			t.Errorf("%s: /agnhost-2: %+v", tag, h)
		}
	}
}

// FuzzParse: any flags give a config or an error of bounded size, never a
// panic.
func FuzzParse(f *testing.F) {
	f.Add("--out\x00x\x00--tag\x00a:b\x00--link\x00/l=t")
	f.Add("--file\x00/p\x00--link\x00=")
	f.Fuzz(func(t *testing.T, s string) {
		if _, err := parse(strings.Split(s, "\x00")); err != nil && len(err.Error()) > 400 {
			t.Errorf("error of %d bytes", len(err.Error()))
		}
	})
}
