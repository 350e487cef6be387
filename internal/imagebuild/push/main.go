// Command push puts the nftmesh image (the OCI layout `make image` wrote)
// and the packaged chart (`make chart`) into a registry, without Docker,
// a daemon or helm: the chart as Helm stores charts in OCI registries, so
// that `helm install nftmesh oci://<chart-repo>/nftmesh --version <v>`
// finds it. Credentials come from the Docker config (~/.docker/config.json,
// as `docker login` or `crane auth login` write it).
//
//	push --oci-dir bin/nftmesh-image.oci --image ghcr.io/nftmesh/nftmesh:v0.2.0 \
//	    --chart bin/nftmesh-0.2.0.tgz --chart-repo ghcr.io/nftmesh/charts
package main

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/spf13/pflag"

	"github.com/nftmesh/nftmesh/internal/imagebuild"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

type options struct {
	ociDir, image, chart, chartRepo string
	insecure                        bool
}

func run(args []string, stdout, stderr io.Writer) int {
	var o options
	fs := pflag.NewFlagSet("push", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.ociDir, "oci-dir", "", "the OCI image layout holding the image (make image's bin/nftmesh-image.oci)")
	fs.StringVar(&o.image, "image", "", "where to push the image, repository:tag")
	fs.StringVar(&o.chart, "chart", "", "the chart package (make chart's bin/nftmesh-<version>.tgz)")
	fs.StringVar(&o.chartRepo, "chart-repo", "", "the repository the chart goes under (its name and version are the chart's): <registry>/<path>")
	fs.BoolVar(&o.insecure, "insecure", false, "plain HTTP to the registry (loopback registries get it anyway)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return 0
		}
		return 2
	}
	if err := push(o, stdout); err != nil {
		fmt.Fprintf(stderr, "push: %v\n", err)
		return 1
	}
	return 0
}

func push(o options, stdout io.Writer) error {
	if (o.ociDir == "") != (o.image == "") {
		return errors.New("--oci-dir and --image go together")
	}
	if (o.chart == "") != (o.chartRepo == "") {
		return errors.New("--chart and --chart-repo go together")
	}
	if o.ociDir == "" && o.chart == "" {
		return errors.New("nothing to push: give --oci-dir and --image, --chart and --chart-repo, or both")
	}
	var nameOpts []name.Option
	if o.insecure {
		nameOpts = append(nameOpts, name.Insecure)
	}
	remoteOpts := []remote.Option{remote.WithAuthFromKeychain(authn.DefaultKeychain)}

	if o.ociDir != "" {
		ref, err := name.NewTag(o.image, nameOpts...)
		if err != nil {
			return fmt.Errorf("parsing --image: %w", err)
		}
		idx, err := layout.ImageIndexFromPath(o.ociDir)
		if err != nil {
			return fmt.Errorf("reading the image layout %s: %w", o.ociDir, err)
		}
		im, err := idx.IndexManifest()
		if err != nil {
			return fmt.Errorf("reading the image layout %s: %w", o.ociDir, err)
		}
		if len(im.Manifests) != 1 {
			return fmt.Errorf("reading the image layout %s: %d images in it, want the one make image writes", o.ociDir, len(im.Manifests))
		}
		img, err := idx.Image(im.Manifests[0].Digest)
		if err != nil {
			return fmt.Errorf("reading the image layout %s: %w", o.ociDir, err)
		}
		if err := remote.Write(ref, img, remoteOpts...); err != nil {
			return fmt.Errorf("pushing the image to %s: %w", ref, err)
		}
		fmt.Fprintf(stdout, "image %s@%s\n", ref, im.Manifests[0].Digest)
	}

	if o.chart != "" {
		tgz, err := os.ReadFile(o.chart)
		if err != nil {
			return fmt.Errorf("reading the chart package: %w", err)
		}
		a, err := imagebuild.NewChartArtifact(tgz)
		if err != nil {
			return err
		}
		ref, err := name.NewTag(o.chartRepo+"/"+a.Name+":"+a.Tag, nameOpts...)
		if err != nil {
			return fmt.Errorf("parsing --chart-repo: %w", err)
		}
		for _, l := range []struct {
			what  string
			layer v1.Layer
		}{{"config", a.Config}, {"package", a.Content}} {
			if err := remote.WriteLayer(ref.Context(), l.layer, remoteOpts...); err != nil {
				return fmt.Errorf("pushing the chart's %s to %s: %w", l.what, ref.Context(), err)
			}
		}
		if err := remote.Put(ref, a, remoteOpts...); err != nil {
			return fmt.Errorf("pushing the chart's manifest to %s: %w", ref, err)
		}
		fmt.Fprintf(stdout, "chart %s (helm install nftmesh oci://%s --version %s)\n", ref, ref.Context(), a.Version)
	}
	return nil
}
