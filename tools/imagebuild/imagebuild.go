// Package imagebuild builds single-layer container images from in-memory
// files, without Docker, a daemon or a registry, reproducibly: the same
// files and config give the same image, byte for byte. It owns the layer
// (a tar with sorted entries, fixed owner 0:0, fixed modes and one fixed
// mtime), the image config and the two on-disk forms containerd and Docker
// import: a docker-archive tarball (`ctr -n k8s.io images import`,
// `docker load`) and an OCI image layout directory.
//
// It does not compile anything and execs nothing: callers hand it the bytes
// of their (static) binaries. Nftmesh puts the nftmesh image together,
// NftmeshIndex one per architecture under an OCI image index, SBOM the
// index's SPDX document from the binaries' build info; NewChartArtifact
// lays a chart package out as Helm stores it in a registry. The fileimage
// command builds the test kit's stand-in images with Build and
// WriteDockerArchive. Pushing and signing are the push command's.
//
// This is a Go module of its own (tools/imagebuild): no nftmesh binary
// links it, and it links nothing of the product module; it reads the
// binaries as files.
//
// The image ID (the config's digest) depends only on the files and the
// Config. The manifest digest also covers the gzip-compressed layer, so it
// is stable for a given Go toolchain but may change with another one.
package imagebuild

import (
	"archive/tar"
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"path"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/google/renameio/v2"
)

// File is one entry of the image's filesystem.
type File struct {
	// Path is absolute and clean, e.g. /usr/local/bin/app. Missing parent
	// directories are added with mode 0755.
	Path string
	// Mode holds the permission bits, optionally fs.ModeSetuid, ModeSetgid,
	// ModeSticky, and the type: none (regular file), fs.ModeDir or
	// fs.ModeSymlink.
	Mode fs.FileMode
	// Data is a regular file's content.
	Data []byte
	// Target is a symlink's target.
	Target string
}

// Config is the image config a runtime reads to start the container.
type Config struct {
	OS           string // default "linux"
	Architecture string // default runtime.GOARCH
	Entrypoint   []string
	Cmd          []string
	Env          []string // KEY=value
	User         string   // "uid:gid" needs no /etc/passwd in the image
	WorkingDir   string
	Labels       map[string]string
	// Created is the image's creation time and every entry's mtime. The
	// zero value stands for the Unix epoch, so an unset time is still
	// reproducible; pass SOURCE_DATE_EPOCH or the commit time to mean
	// something.
	Created time.Time
	// CreatedBy is the history entry's description of the layer.
	CreatedBy string
}

// Build returns the image with one layer holding files, on an empty base,
// with OCI media types.
func Build(files []File, cfg Config) (v1.Image, error) {
	created := fixedTime(cfg.Created)
	tarBytes, err := Layer(files, created)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(tarBytes)), nil
	}, tarball.WithMediaType(types.OCILayer), tarball.WithCompressedCaching)
	if err != nil {
		return nil, fmt.Errorf("making the image layer: %w", err)
	}

	cf := &v1.ConfigFile{
		Created:      v1.Time{Time: created},
		OS:           cmp.Or(cfg.OS, "linux"),
		Architecture: cmp.Or(cfg.Architecture, runtime.GOARCH),
		RootFS:       v1.RootFS{Type: "layers"},
		Config: v1.Config{
			Entrypoint: cfg.Entrypoint,
			Cmd:        cfg.Cmd,
			Env:        cfg.Env,
			User:       cfg.User,
			WorkingDir: cfg.WorkingDir,
			Labels:     cfg.Labels,
		},
	}
	base := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	base = mutate.ConfigMediaType(base, types.OCIConfigJSON)
	base, err = mutate.ConfigFile(base, cf)
	if err != nil {
		return nil, fmt.Errorf("setting the image config: %w", err)
	}
	img, err := mutate.Append(base, mutate.Addendum{
		Layer:     layer,
		MediaType: types.OCILayer,
		History: v1.History{
			Created:   v1.Time{Time: created},
			CreatedBy: cmp.Or(cfg.CreatedBy, "imagebuild"),
		},
	})
	if err != nil {
		return nil, fmt.Errorf("appending the layer to the empty base: %w", err)
	}
	return img, nil
}

// Layer returns the uncompressed tar of files: entries sorted by path with
// each parent directory before its children, owned by 0:0, all with mtime.
func Layer(files []File, mtime time.Time) ([]byte, error) {
	entries, err := tree(files)
	if err != nil {
		return nil, err
	}
	mtime = fixedTime(mtime)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, p := range slices.Sorted(maps.Keys(entries)) {
		f := entries[p]
		hdr := &tar.Header{
			Name:    strings.TrimPrefix(p, "/"),
			Mode:    tarMode(f.Mode),
			ModTime: mtime,
		}
		switch f.Mode.Type() {
		case fs.ModeDir:
			hdr.Typeflag = tar.TypeDir
			hdr.Name += "/"
		case fs.ModeSymlink:
			hdr.Typeflag = tar.TypeSymlink
			hdr.Linkname = f.Target
		default:
			hdr.Typeflag = tar.TypeReg
			hdr.Size = int64(len(f.Data))
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, fmt.Errorf("writing the layer entry %s: %w", p, err)
		}
		if _, err := tw.Write(f.Data); err != nil {
			return nil, fmt.Errorf("writing the layer entry %s: %w", p, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("closing the layer tar: %w", err)
	}
	return buf.Bytes(), nil
}

// tree validates files and adds their missing parent directories.
func tree(files []File) (map[string]File, error) {
	entries := make(map[string]File, len(files))
	for _, f := range files {
		if err := validFile(f); err != nil {
			return nil, err
		}
		if _, ok := entries[f.Path]; ok {
			return nil, fmt.Errorf("image file %s: listed twice", quote(f.Path))
		}
		entries[f.Path] = f
	}
	for _, f := range files {
		for dir := path.Dir(f.Path); dir != "/"; dir = path.Dir(dir) {
			parent, ok := entries[dir]
			if !ok {
				entries[dir] = File{Path: dir, Mode: fs.ModeDir | 0o755}
				continue
			}
			// The runtime could not unpack an entry below a regular file
			// or a symlink.
			if !parent.Mode.IsDir() {
				return nil, fmt.Errorf("image file %s: its parent %s is not a directory", quote(f.Path), quote(dir))
			}
		}
	}
	return entries, nil
}

// maxQuoted bounds the bytes of a user-supplied path that quote puts in an
// error message; %q may write 4 bytes for each.
const maxQuoted = 64

func quote(s string) string {
	if len(s) > maxQuoted {
		return strconv.Quote(s[:maxQuoted]) + "..."
	}
	return strconv.Quote(s)
}

// RefError is the error for a bad image reference ref, given as what (a
// flag, "the image tag"), bounded in size: go-containerregistry's own
// messages repeat the whole input.
func RefError(what, ref string, err error) error {
	msg, _, _ := strings.Cut(err.Error(), ": "+ref)
	if len(msg) > 120 {
		msg = msg[:120] + "..."
	}
	return fmt.Errorf("%s %s: %s", what, quote(ref), msg)
}

func validFile(f File) error {
	switch {
	case f.Path == "" || f.Path[0] != '/':
		return fmt.Errorf("image file %s: the path must be absolute", quote(f.Path))
	case f.Path == "/":
		return errors.New(`image file "/": the root is not an entry`)
	case path.Clean(f.Path) != f.Path:
		return fmt.Errorf("image file %s: the path must be clean (%s)", quote(f.Path), quote(path.Clean(f.Path)))
	case strings.ContainsRune(f.Path, 0):
		return fmt.Errorf("image file %s: the path contains a NUL byte", quote(f.Path))
	}
	switch f.Mode.Type() {
	case 0:
		if f.Target != "" {
			return fmt.Errorf("image file %s: a regular file has no symlink target", quote(f.Path))
		}
	case fs.ModeDir:
		if len(f.Data) > 0 || f.Target != "" {
			return fmt.Errorf("image file %s: a directory has no data and no target", quote(f.Path))
		}
	case fs.ModeSymlink:
		if f.Target == "" || strings.ContainsRune(f.Target, 0) {
			return fmt.Errorf("image file %s: a symlink needs a target without NUL bytes", quote(f.Path))
		}
		if len(f.Data) > 0 {
			return fmt.Errorf("image file %s: a symlink has no data", quote(f.Path))
		}
	default:
		return fmt.Errorf("image file %s: type %v is not a regular file, directory or symlink", quote(f.Path), f.Mode.Type())
	}
	return nil
}

func tarMode(m fs.FileMode) int64 {
	mode := int64(m.Perm())
	if m&fs.ModeSetuid != 0 {
		mode |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		mode |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		mode |= 0o1000
	}
	return mode
}

// fixedTime maps the zero time to the epoch and drops what a tar header or
// the config would render differently across machines (sub-seconds, zone).
func fixedTime(t time.Time) time.Time {
	if t.IsZero() {
		return time.Unix(0, 0).UTC()
	}
	return t.Truncate(time.Second).UTC()
}

// WriteDockerArchive writes img tagged tag (e.g. "localhost/app:v1", kept as
// written) as a docker-archive tarball at file, replacing it atomically.
func WriteDockerArchive(file, tag string, img v1.Image) error {
	ref, err := name.NewTag(tag)
	if err != nil {
		return RefError("parsing the image tag", tag, err)
	}
	var buf bytes.Buffer
	if err := tarball.Write(ref, img, &buf); err != nil {
		return fmt.Errorf("writing the image archive %s: %w", file, err)
	}
	if err := renameio.WriteFile(file, buf.Bytes(), 0o644); err != nil {
		return fmt.Errorf("writing the image archive %s: %w", file, err)
	}
	return nil
}
