// Command mkimage builds the nftmesh container image from the static
// binaries `make image` cross-compiled, without Docker, a daemon or a
// registry: an OCI image index with one image per architecture (an OCI
// image layout directory, which `make push` pushes), the docker-archive
// tarball of one of them (`ctr -n k8s.io images import`, `docker load`),
// and the index's SBOM (SPDX JSON, from the binaries' build info). The same
// binaries, version, revision and creation time give the same images,
// index and SBOM, byte for byte.
//
//	mkimage --bin-dir bin/image --arch amd64,arm64 --version v0.2.0 --created $SOURCE_DATE_EPOCH \
//	    [--tag ghcr.io/nftmesh/nftmesh:v0.2.0] [--oci-dir bin/nftmesh-image.oci] \
//	    [--out bin/nftmesh-image.tar [--archive-arch amd64]] [--sbom bin/nftmesh-image.spdx.json]
//
// The binaries of architecture A are <bin-dir>/linux-A/{nftmesh-agent,
// nftmesh-cni, nftmesh-cni-standalone, redirect}.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/renameio/v2"
	"github.com/spf13/pflag"

	"github.com/nftmesh/nftmesh/tools/imagebuild"
)

func main() {
	os.Exit(run(os.Args[1:], os.LookupEnv, os.Stdout, os.Stderr))
}

type options struct {
	binDir, version, revision, source, created, tag, out, archiveArch, ociDir, sbom string
	arches                                                                          []string
}

func run(args []string, getenv func(string) (string, bool), stdout, stderr io.Writer) int {
	var o options
	fs := pflag.NewFlagSet("mkimage", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.binDir, "bin-dir", "", "directory holding linux-<arch>/ with the static nftmesh-agent, nftmesh-cni, nftmesh-cni-standalone and redirect of each --arch (required)")
	fs.StringSliceVar(&o.arches, "arch", []string{runtime.GOARCH}, "the GOARCHes of the index's images")
	fs.StringVar(&o.version, "version", "", "the version the binaries were stamped with; the image's version label and default tag (required)")
	fs.StringVar(&o.revision, "revision", "", "the source commit, for the revision label")
	fs.StringVar(&o.source, "source", imagebuild.DefaultSource, "the source repository, for the source label")
	fs.StringVar(&o.created, "created", "", "image time and file mtimes, in Unix seconds (default $SOURCE_DATE_EPOCH, else 0)")
	fs.StringVar(&o.tag, "tag", "", "the image's name (default "+imagebuild.DefaultRepository+":<version>)")
	fs.StringVar(&o.ociDir, "oci-dir", "", "write the index as an OCI image layout to this directory (replaced)")
	fs.StringVar(&o.out, "out", "", "write the image of --archive-arch as a docker-archive tarball here")
	fs.StringVar(&o.archiveArch, "archive-arch", runtime.GOARCH, "the GOARCH of the --out image (one of --arch)")
	fs.StringVar(&o.sbom, "sbom", "", "write the index's SBOM (SPDX 2.3 JSON) here")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return 0
		}
		return 2
	}
	if o.created == "" {
		o.created, _ = getenv("SOURCE_DATE_EPOCH")
	}
	if err := build(o, stdout); err != nil {
		fmt.Fprintf(stderr, "mkimage: %v\n", err)
		return 1
	}
	return 0
}

func build(o options, stdout io.Writer) error {
	meta, bins, err := inputs(&o)
	if err != nil {
		return err
	}
	p, err := imagebuild.NftmeshIndex(bins, meta)
	if err != nil {
		return err
	}
	digest, err := p.Index.Digest()
	if err != nil {
		return fmt.Errorf("hashing the image index: %w", err)
	}
	fmt.Fprintf(stdout, "image %s\n  index   %s\n", o.tag, digest)
	for _, arch := range o.arches {
		d, err := p.Images[arch].Digest()
		if err != nil {
			return fmt.Errorf("hashing the linux/%s image: %w", arch, err)
		}
		size, err := compressedSize(p.Images[arch])
		if err != nil {
			return fmt.Errorf("sizing the linux/%s image: %w", arch, err)
		}
		fmt.Fprintf(stdout, "  %-7s %s (%.1f MiB compressed)\n", "linux/"+arch, d, float64(size)/(1<<20))
	}
	if o.ociDir != "" {
		if err := imagebuild.WriteOCIIndexLayout(o.ociDir, o.tag, p.Index); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "  layout  %s\n", o.ociDir)
	}
	if o.out != "" {
		if err := imagebuild.WriteDockerArchive(o.out, o.tag, p.Images[o.archiveArch]); err != nil {
			return err
		}
		st, err := os.Stat(o.out)
		if err != nil {
			return fmt.Errorf("reading back the image archive: %w", err)
		}
		fmt.Fprintf(stdout, "  archive %s (linux/%s, %.1f MiB)\n", o.out, o.archiveArch, float64(st.Size())/(1<<20))
	}
	if o.sbom != "" {
		ref, _ := name.NewTag(o.tag) // checked by inputs
		doc, err := imagebuild.SBOM(bins, meta, ref.Context().Name(), digest)
		if err != nil {
			return err
		}
		if err := renameio.WriteFile(o.sbom, doc, 0o644); err != nil {
			return fmt.Errorf("writing the SBOM: %w", err)
		}
		fmt.Fprintf(stdout, "  sbom    %s\n", o.sbom)
	}
	return nil
}

// inputs checks the options, fills their defaults and reads the binaries.
func inputs(o *options) (imagebuild.Meta, map[string]imagebuild.Binaries, error) {
	switch {
	case o.binDir == "":
		return imagebuild.Meta{}, nil, errors.New("--bin-dir is required")
	case o.version == "":
		return imagebuild.Meta{}, nil, errors.New("--version is required")
	case o.out == "" && o.ociDir == "" && o.sbom == "":
		return imagebuild.Meta{}, nil, errors.New("nothing to write: give --oci-dir, --out or --sbom")
	case len(o.arches) == 0:
		return imagebuild.Meta{}, nil, errors.New("--arch is empty")
	case o.out != "" && !slices.Contains(o.arches, o.archiveArch):
		return imagebuild.Meta{}, nil, fmt.Errorf("--archive-arch %q is not one of --arch %v", o.archiveArch, o.arches)
	}
	created, err := parseCreated(o.created)
	if err != nil {
		return imagebuild.Meta{}, nil, err
	}
	if o.tag == "" {
		o.tag = imagebuild.DefaultRepository + ":" + o.version
	}
	if _, err := name.NewTag(o.tag); err != nil {
		return imagebuild.Meta{}, nil, imagebuild.RefError("--tag", o.tag, err)
	}
	for i, arch := range o.arches {
		if slices.Contains(o.arches[:i], arch) {
			return imagebuild.Meta{}, nil, fmt.Errorf("--arch lists %q twice", arch)
		}
	}
	bins := map[string]imagebuild.Binaries{}
	for _, arch := range o.arches {
		var b imagebuild.Binaries
		for file, dst := range map[string]*[]byte{
			"nftmesh-agent": &b.Agent, "nftmesh-cni": &b.Plugin, "nftmesh-cni-standalone": &b.Standalone, "redirect": &b.Redirect,
		} {
			if *dst, err = os.ReadFile(filepath.Join(o.binDir, "linux-"+arch, file)); err != nil {
				return imagebuild.Meta{}, nil, fmt.Errorf("reading the binary: %w", err)
			}
		}
		bins[arch] = b
	}
	meta := imagebuild.Meta{Version: o.version, Revision: o.revision, Source: o.source, Created: created}
	return meta, bins, nil
}

// compressedSize is what a pull of the image moves: its manifest, config
// and layer.
func compressedSize(img v1.Image) (int64, error) {
	m, err := img.Manifest()
	if err != nil {
		return 0, err
	}
	n, err := img.Size()
	if err != nil {
		return 0, err
	}
	n += m.Config.Size
	for _, l := range m.Layers {
		n += l.Size
	}
	return n, nil
}

// parseCreated reads SOURCE_DATE_EPOCH's format: decimal Unix seconds.
func parseCreated(s string) (time.Time, error) {
	if s == "" {
		return time.Unix(0, 0).UTC(), nil
	}
	secs, err := strconv.ParseInt(s, 10, 64)
	// Beyond year 9999 RFC 3339, which the config's time is written in,
	// has no representation.
	if err != nil || secs < 0 || secs > 253402300799 {
		// %q may write 4 bytes for each input byte: 24 keep the message short.
		quoted := strconv.Quote(s)
		if len(s) > 24 {
			quoted = strconv.Quote(s[:24]) + "..."
		}
		return time.Time{}, fmt.Errorf("--created (SOURCE_DATE_EPOCH) %s is not Unix seconds between 0 and 253402300799", quoted)
	}
	return time.Unix(secs, 0).UTC(), nil
}
