// Command fileimage makes one-layer images of given files on an empty base
// as docker-archive tarballs (what `ctr images import` and `docker load`
// take), and reads such archives back: the test kit's stand-in images (the
// pod sandbox, Istio's pilot-agent with the stand-ins) and the cluster
// end-to-end test's look into the image it installed. The product module
// reaches it through testkit/imagetest, so that it does not link the image
// library itself.
//
//	fileimage build --out pause.tar --tag localhost/pause:e2e --entrypoint /pause \
//	    [--user 65535:65535] [--label k=v ...] --file /pause=bin/pause [--file /dst=src ...]
//	fileimage show --archive pause.tar   # its config and files as JSON (Shown)
//	fileimage cat --archive pause.tar --path /pause --out pause
//	fileimage cat --ref 127.0.0.1:5000/mesh/nftmesh:v1 --platform linux/amd64 --path /p --out p
//	fileimage digest --ref 127.0.0.1:5000/mesh/nftmesh:v1   # the digest the tag names
//
// --ref reads an image (or an index's image for --platform, the host's by
// default) from a registry; one on localhost or 127.0.0.1 in plain HTTP.
// Every file is a regular file with mode 0755 (the stand-ins are programs
// other users run), whatever its mode on the host.
package main

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"runtime"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/spf13/pflag"

	"github.com/nftmesh/nftmesh/tools/imagebuild"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, "fileimage: want a command: build, show, cat or digest")
		return 2
	}
	cmds := map[string]func([]string, io.Writer) error{"build": build, "show": show, "cat": cat, "digest": digest}
	cmd, ok := cmds[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "fileimage: unknown command %q: want build, show, cat or digest\n", truncate(args[0]))
		return 2
	}
	if err := cmd(args[1:], stdout); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return 0
		}
		fmt.Fprintf(stderr, "fileimage %s: %v\n", args[0], err)
		return 1
	}
	return 0
}

func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

func build(args []string, _ io.Writer) error {
	fs := pflag.NewFlagSet("fileimage build", pflag.ContinueOnError)
	out := fs.String("out", "", "the docker-archive tarball to write (required)")
	tag := fs.String("tag", "", "the image's name, repository:tag (required)")
	entrypoint := fs.StringArray("entrypoint", nil, "the entrypoint, one flag per argument")
	user := fs.String("user", "", "uid:gid the container runs as")
	labels := fs.StringToString("label", nil, "a config label, key=value")
	files := fs.StringArray("file", nil, "/path/in/image=host/file (at least one)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	switch {
	case *out == "":
		return errors.New("--out is required")
	case *tag == "":
		return errors.New("--tag is required")
	case len(*files) == 0:
		return errors.New("--file is required")
	}
	var layer []imagebuild.File
	for _, f := range *files {
		dst, src, ok := strings.Cut(f, "=")
		if !ok || src == "" {
			return fmt.Errorf("--file %q: want /path/in/image=host/file", truncate(f))
		}
		data, err := os.ReadFile(src)
		if err != nil {
			return fmt.Errorf("--file %q: %w", truncate(f), err)
		}
		layer = append(layer, imagebuild.File{Path: dst, Mode: 0o755, Data: data})
	}
	img, err := imagebuild.Build(layer, imagebuild.Config{Entrypoint: *entrypoint, User: *user, Labels: *labels})
	if err != nil {
		return err
	}
	return imagebuild.WriteDockerArchive(*out, *tag, img)
}

// Shown is what show prints of an archive's only image.
type Shown struct {
	OS           string            `json:"os"`
	Architecture string            `json:"architecture"`
	Entrypoint   []string          `json:"entrypoint"`
	User         string            `json:"user"`
	Labels       map[string]string `json:"labels"`
	Files        map[string]File   `json:"files"`
}

// File is one regular file of the image.
type File struct {
	Mode   uint32 `json:"mode"` // permission bits
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"` // hex
}

func archiveFlag(name string) (*pflag.FlagSet, *string) {
	fs := pflag.NewFlagSet(name, pflag.ContinueOnError)
	return fs, fs.String("archive", "", "the docker-archive tarball to read (required)")
}

func show(args []string, stdout io.Writer) error {
	fs, archive := archiveFlag("fileimage show")
	if err := fs.Parse(args); err != nil {
		return err
	}
	s := Shown{Files: map[string]File{}}
	err := walk(*archive, func(h *tar.Header, r io.Reader) error {
		sum := sha256.New()
		n, err := io.Copy(sum, r)
		s.Files["/"+path.Clean(h.Name)] = File{Mode: uint32(h.Mode & 0o7777), Size: n, SHA256: hex.EncodeToString(sum.Sum(nil))}
		return err
	}, &s)
	if err != nil {
		return err
	}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(s)
}

func cat(args []string, _ io.Writer) error {
	fs, archive := archiveFlag("fileimage cat")
	ref := fs.String("ref", "", "read the image from a registry instead: repository:tag or @digest")
	platform := fs.String("platform", "linux/"+runtime.GOARCH, "with --ref to an index: the image of this os/arch")
	want := fs.String("path", "", "the file's absolute path in the image (required)")
	out := fs.String("out", "", "where to write it (required)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *want == "" || *out == "" {
		return errors.New("--path and --out are required")
	}
	var img v1.Image
	var err error
	switch {
	case *ref != "" && *archive != "":
		return errors.New("--archive and --ref: give one")
	case *ref != "":
		img, err = remoteImage(*ref, *platform)
		*archive = *ref
	case *archive != "":
		img, err = tarball.ImageFromPath(*archive, nil)
	default:
		return errors.New("--archive or --ref is required")
	}
	if err != nil {
		return fmt.Errorf("reading the image %s: %w", truncate(*archive), err)
	}
	found := false
	err = walkImage(img, *archive, func(h *tar.Header, r io.Reader) error {
		if "/"+path.Clean(h.Name) != *want {
			return nil
		}
		found = true
		data, err := io.ReadAll(r)
		if err != nil {
			return err
		}
		return os.WriteFile(*out, data, 0o644)
	}, nil)
	if err == nil && !found {
		err = fmt.Errorf("%q is not a regular file of %s", truncate(*want), *archive)
	}
	return err
}

// walk calls each on every regular file of the archive's only image (its
// layers flattened), and fills s from its config when s is not nil.
func walk(archive string, each func(*tar.Header, io.Reader) error, s *Shown) error {
	if archive == "" {
		return errors.New("--archive is required")
	}
	img, err := tarball.ImageFromPath(archive, nil)
	if err != nil {
		return fmt.Errorf("reading the image archive %s: %w", archive, err)
	}
	return walkImage(img, archive, each, s)
}

// remoteImage is the image ref names in its registry; for an index, its
// image for platform (os/arch).
func remoteImage(ref, platform string) (v1.Image, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return nil, err
	}
	p, err := v1.ParsePlatform(platform)
	if err != nil {
		return nil, fmt.Errorf("--platform %q: %w", truncate(platform), err)
	}
	return remote.Image(r, remote.WithPlatform(*p), remote.WithAuthFromKeychain(authn.DefaultKeychain))
}

// digest prints the digest of what --ref names in its registry.
func digest(args []string, stdout io.Writer) error {
	fs := pflag.NewFlagSet("fileimage digest", pflag.ContinueOnError)
	ref := fs.String("ref", "", "repository:tag (required)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *ref == "" {
		return errors.New("--ref is required")
	}
	r, err := name.ParseReference(*ref)
	if err != nil {
		return fmt.Errorf("--ref %q: %w", truncate(*ref), err)
	}
	desc, err := remote.Head(r, remote.WithAuthFromKeychain(authn.DefaultKeychain))
	if err != nil {
		return fmt.Errorf("--ref %q: %w", truncate(*ref), err)
	}
	_, err = fmt.Fprintln(stdout, desc.Digest)
	return err
}

// walkImage is walk over img (what names it in errors).
func walkImage(img v1.Image, archive string, each func(*tar.Header, io.Reader) error, s *Shown) error {
	if s != nil {
		cf, err := img.ConfigFile()
		if err != nil {
			return fmt.Errorf("reading the image config of %s: %w", archive, err)
		}
		s.OS, s.Architecture = cf.OS, cf.Architecture
		s.Entrypoint, s.User, s.Labels = cf.Config.Entrypoint, cf.Config.User, cf.Config.Labels
	}
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("reading the files of %s: %w", archive, err)
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		if err := each(h, tr); err != nil {
			return fmt.Errorf("reading %s of %s: %w", h.Name, archive, err)
		}
	}
}
