// Command rootimage makes an image of a root file system tarball (one
// layer, as it is) plus files on top (a second layer), as a docker-archive
// tarball under one or more names: the conformance run's test images
// (Kubernetes' agnhost, busybox and jessie-dnsutils, made offline from
// Debian's packages and programs built here) and its CoreDNS.
//
//	rootimage --out agnhost.tar --tag registry.k8s.io/e2e-test-images/agnhost:2.59 \
//	    --root testroot.tar --file /agnhost=.cache/agnhost-2.59 --link /agnhost-2=agnhost \
//	    --entrypoint /agnhost --cmd pause
//
// Without --root the image has only the files layer.
package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/spf13/pflag"

	"github.com/nftmesh/nftmesh/tools/imagebuild"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return
		}
		fmt.Fprintf(os.Stderr, "rootimage: %v\n", err)
		os.Exit(1)
	}
}

// options are the parsed flags.
type options struct {
	out, root       string
	tags            []string
	files, links    []imagebuild.File
	entrypoint, cmd []string
	env             []string
}

func parse(args []string) (options, error) {
	var o options
	fs := pflag.NewFlagSet("rootimage", pflag.ContinueOnError)
	fs.StringVar(&o.out, "out", "", "the docker-archive tarball to write (required)")
	fs.StringVar(&o.root, "root", "", "a root file system tarball, the image's first layer as it is")
	fs.StringArrayVar(&o.tags, "tag", nil, "a name of the image, repository:tag (at least one)")
	files := fs.StringArray("file", nil, "/path/in/image=host/file, mode 0755")
	links := fs.StringArray("link", nil, "/path/in/image=target, a symbolic link")
	fs.StringArrayVar(&o.entrypoint, "entrypoint", nil, "the entrypoint, one flag per argument")
	fs.StringArrayVar(&o.cmd, "cmd", nil, "the default command, one flag per argument")
	fs.StringArrayVar(&o.env, "env", nil, "KEY=value in the image's environment")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return o, err
		}
		// pflag's errors quote the whole argument.
		return o, errors.New(truncate(err.Error()))
	}
	if o.out == "" {
		return o, errors.New("--out is required")
	}
	if len(o.tags) == 0 {
		return o, errors.New("--tag is required")
	}
	for _, f := range *files {
		dst, src, ok := strings.Cut(f, "=")
		if !ok || src == "" || !strings.HasPrefix(dst, "/") {
			return o, fmt.Errorf("--file %q: want /path/in/image=host/file", truncate(f))
		}
		data, err := os.ReadFile(src)
		if err != nil {
			return o, fmt.Errorf("--file %q: %w", truncate(f), err)
		}
		o.files = append(o.files, imagebuild.File{Path: dst, Mode: 0o755, Data: data})
	}
	for _, l := range *links {
		dst, target, ok := strings.Cut(l, "=")
		if !ok || target == "" || !strings.HasPrefix(dst, "/") {
			return o, fmt.Errorf("--link %q: want /path/in/image=target", truncate(l))
		}
		o.links = append(o.links, imagebuild.File{Path: dst, Mode: os.ModeSymlink | 0o777, Target: target})
	}
	if len(o.files)+len(o.links) == 0 && o.root == "" {
		return o, errors.New("want --root, --file or --link: the image would be empty")
	}
	return o, nil
}

func truncate(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}

func run(args []string) error {
	o, err := parse(args)
	if err != nil {
		return err
	}
	created := time.Unix(0, 0).UTC()
	cf := &v1.ConfigFile{
		Created: v1.Time{Time: created}, OS: "linux", Architecture: runtime.GOARCH,
		RootFS: v1.RootFS{Type: "layers"},
		Config: v1.Config{Entrypoint: o.entrypoint, Cmd: o.cmd, Env: o.env},
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return fmt.Errorf("setting the image config: %w", err)
	}
	var layers []v1.Layer
	if o.root != "" {
		l, err := tarball.LayerFromFile(o.root, tarball.WithMediaType(types.OCILayer), tarball.WithCompressedCaching)
		if err != nil {
			return fmt.Errorf("--root %s: %w", truncate(o.root), err)
		}
		layers = append(layers, l)
	}
	if top := append(o.files, o.links...); len(top) > 0 {
		data, err := imagebuild.Layer(top, created)
		if err != nil {
			return err
		}
		l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil },
			tarball.WithMediaType(types.OCILayer), tarball.WithCompressedCaching)
		if err != nil {
			return fmt.Errorf("making the files layer: %w", err)
		}
		layers = append(layers, l)
	}
	for _, l := range layers {
		if img, err = mutate.Append(img, mutate.Addendum{Layer: l, MediaType: types.OCILayer,
			History: v1.History{Created: v1.Time{Time: created}, CreatedBy: "rootimage"}}); err != nil {
			return fmt.Errorf("appending a layer: %w", err)
		}
	}
	refs := map[name.Reference]v1.Image{}
	for _, t := range o.tags {
		ref, err := name.NewTag(t)
		if err != nil {
			return imagebuild.RefError("parsing --tag", t, err)
		}
		refs[ref] = img
	}
	f, err := os.CreateTemp(dirOf(o.out), ".rootimage-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if err := tarball.MultiRefWrite(refs, f); err != nil {
		f.Close()
		return fmt.Errorf("writing %s: %w", o.out, err)
	}
	if err := f.Chmod(0o644); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), o.out)
}

func dirOf(p string) string {
	if i := strings.LastIndexByte(p, '/'); i >= 0 {
		return p[:i+1]
	}
	return "."
}
