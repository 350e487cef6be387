// Command mkimage builds the nftmesh container image from the static
// binaries `make image` built, without Docker, a daemon or a registry: a
// docker-archive tarball (`ctr -n k8s.io images import`, `docker load`) and,
// optionally, an OCI image layout directory. The same binaries, version,
// revision and creation time give the same image, byte for byte.
//
//	mkimage --bin-dir bin/image --version v0.2.0 --created $SOURCE_DATE_EPOCH \
//	    --out bin/nftmesh-image.tar [--oci-dir bin/nftmesh-image.oci] [--tag ghcr.io/nftmesh/nftmesh:v0.2.0]
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"time"

	"github.com/spf13/pflag"

	"github.com/nftmesh/nftmesh/internal/imagebuild"
)

func main() {
	os.Exit(run(os.Args[1:], os.LookupEnv, os.Stdout, os.Stderr))
}

type options struct {
	binDir, version, revision, source, created, arch, tag, out, ociDir string
}

func run(args []string, getenv func(string) (string, bool), stdout, stderr io.Writer) int {
	var o options
	fs := pflag.NewFlagSet("mkimage", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.binDir, "bin-dir", "", "directory holding the static nftmesh-agent, nftmesh-cni, nftmesh-cni-standalone and redirect (required)")
	fs.StringVar(&o.version, "version", "", "the version the binaries were stamped with; the image's version label and default tag (required)")
	fs.StringVar(&o.revision, "revision", "", "the source commit, for the revision label")
	fs.StringVar(&o.source, "source", imagebuild.DefaultSource, "the source repository, for the source label")
	fs.StringVar(&o.created, "created", "", "image time and file mtimes, in Unix seconds (default $SOURCE_DATE_EPOCH, else 0)")
	fs.StringVar(&o.arch, "arch", runtime.GOARCH, "the binaries' GOARCH, the image's architecture")
	fs.StringVar(&o.tag, "tag", "", "the image's name (default "+imagebuild.DefaultRepository+":<version>)")
	fs.StringVar(&o.out, "out", "", "the docker-archive tarball to write (required)")
	fs.StringVar(&o.ociDir, "oci-dir", "", "also write an OCI image layout to this directory (replaced)")
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
	switch {
	case o.binDir == "":
		return errors.New("--bin-dir is required")
	case o.version == "":
		return errors.New("--version is required")
	case o.out == "":
		return errors.New("--out is required")
	}
	created, err := parseCreated(o.created)
	if err != nil {
		return err
	}
	if o.tag == "" {
		o.tag = imagebuild.DefaultRepository + ":" + o.version
	}
	var bins imagebuild.Binaries
	for name, dst := range map[string]*[]byte{
		"nftmesh-agent": &bins.Agent, "nftmesh-cni": &bins.Plugin, "nftmesh-cni-standalone": &bins.Standalone, "redirect": &bins.Redirect,
	} {
		if *dst, err = os.ReadFile(filepath.Join(o.binDir, name)); err != nil {
			return fmt.Errorf("reading the binary: %w", err)
		}
	}
	img, err := imagebuild.Nftmesh(bins, imagebuild.Meta{
		Version:      o.version,
		Revision:     o.revision,
		Source:       o.source,
		Created:      created,
		Architecture: o.arch,
	})
	if err != nil {
		return err
	}
	if err := imagebuild.WriteDockerArchive(o.out, o.tag, img); err != nil {
		return err
	}
	if o.ociDir != "" {
		if err := imagebuild.WriteOCILayout(o.ociDir, o.tag, img); err != nil {
			return err
		}
	}
	id, err := img.ConfigName()
	if err != nil {
		return fmt.Errorf("hashing the image config: %w", err)
	}
	digest, err := img.Digest()
	if err != nil {
		return fmt.Errorf("hashing the image manifest: %w", err)
	}
	st, err := os.Stat(o.out)
	if err != nil {
		return fmt.Errorf("reading back the image archive: %w", err)
	}
	fmt.Fprintf(stdout, "image %s\n  id      %s\n  digest  %s\n  archive %s (%.1f MiB)\n", o.tag, id, digest, o.out, float64(st.Size())/(1<<20))
	if o.ociDir != "" {
		fmt.Fprintf(stdout, "  layout  %s\n", o.ociDir)
	}
	return nil
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
