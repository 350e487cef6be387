// Command push puts a release into a registry, without Docker, a daemon,
// helm or cosign: the nftmesh image index (the OCI layout `make image`
// wrote), its SBOM as an OCI referrer of the index, with a cosign key also
// cosign's signature of the index and the SBOM as a signed SPDX
// attestation, and the packaged chart (`make chart`) as Helm stores charts
// in OCI registries, so that `helm install nftmesh oci://<chart-repo>/nftmesh
// --version <v>` finds it. It prints each reference it pushed with its
// digest. Credentials come from the Docker config (~/.docker/config.json,
// as `docker login` or `crane auth login` write it); a registry on
// localhost or 127.0.0.1 is spoken to in plain HTTP.
//
//	push --oci-dir bin/nftmesh-image.oci --image ghcr.io/nftmesh/nftmesh:v0.2.0 [--tag v0.2.0-dev ...] \
//	    [--sbom bin/nftmesh-image.spdx.json] [--sign-key cosign.key] \
//	    [--chart bin/nftmesh-0.2.0.tgz --chart-repo ghcr.io/nftmesh/charts]
//
// The signing key's password is COSIGN_PASSWORD (empty when unset).
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/sigstore/sigstore/pkg/signature"
	"github.com/spf13/pflag"

	"github.com/nftmesh/nftmesh/tools/imagebuild"
)

func main() {
	os.Exit(run(os.Args[1:], os.LookupEnv, os.Stdout, os.Stderr))
}

type options struct {
	ociDir, image, sbom, signKey, chart, chartRepo string
	tags                                           []string
	insecure                                       bool
}

func run(args []string, getenv func(string) (string, bool), stdout, stderr io.Writer) int {
	var o options
	fs := pflag.NewFlagSet("push", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.ociDir, "oci-dir", "", "the OCI image layout holding the image index (make image's bin/nftmesh-image.oci)")
	fs.StringVar(&o.image, "image", "", "where to push the image, repository:tag")
	fs.StringArrayVar(&o.tags, "tag", nil, "another tag for the same image in --image's repository (repeatable)")
	fs.StringVar(&o.sbom, "sbom", "", "the index's SBOM (make image's bin/nftmesh-image.spdx.json), pushed as its referrer")
	fs.StringVar(&o.signKey, "sign-key", "", "a cosign private key (cosign generate-key-pair; password in COSIGN_PASSWORD): sign the index, attest the SBOM")
	fs.StringVar(&o.chart, "chart", "", "the chart package (make chart's bin/nftmesh-<version>.tgz)")
	fs.StringVar(&o.chartRepo, "chart-repo", "", "the repository the chart goes under (its name and version are the chart's): <registry>/<path>")
	fs.BoolVar(&o.insecure, "insecure", false, "plain HTTP to the registry (loopback registries get it anyway)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return 0
		}
		return 2
	}
	if err := push(o, getenv, stdout); err != nil {
		fmt.Fprintf(stderr, "push: %v\n", err)
		return 1
	}
	return 0
}

func push(o options, getenv func(string) (string, bool), stdout io.Writer) error {
	switch {
	case (o.ociDir == "") != (o.image == ""):
		return errors.New("--oci-dir and --image go together")
	case (o.chart == "") != (o.chartRepo == ""):
		return errors.New("--chart and --chart-repo go together")
	case o.ociDir == "" && o.chart == "":
		return errors.New("nothing to push: give --oci-dir and --image, --chart and --chart-repo, or both")
	case o.ociDir == "" && (o.sbom != "" || o.signKey != "" || len(o.tags) > 0):
		return errors.New("--sbom, --sign-key and --tag go with --oci-dir and --image")
	}
	var nameOpts []name.Option
	if o.insecure {
		nameOpts = append(nameOpts, name.Insecure)
	}
	remoteOpts := []remote.Option{remote.WithAuthFromKeychain(authn.DefaultKeychain)}
	if o.ociDir != "" {
		if err := pushImage(o, getenv, nameOpts, remoteOpts, stdout); err != nil {
			return err
		}
	}
	if o.chart != "" {
		return pushChart(o, nameOpts, remoteOpts, stdout)
	}
	return nil
}

// pushImage pushes the layout's one entry (make image's index, or a single
// image), then its SBOM, signature and attestation. What can be refused
// (the SBOM of another index, a key it cannot open) is refused before
// anything is pushed.
func pushImage(o options, getenv func(string) (string, bool), nameOpts []name.Option, remoteOpts []remote.Option, stdout io.Writer) error {
	ref, err := name.NewTag(o.image, nameOpts...)
	if err != nil {
		return imagebuild.RefError("--image", o.image, err)
	}
	var more []name.Tag
	for _, t := range o.tags {
		mt, err := name.NewTag(ref.Context().String()+":"+t, nameOpts...)
		if err != nil {
			return imagebuild.RefError("--tag", t, err)
		}
		more = append(more, mt)
	}
	entry, err := readLayout(o.ociDir)
	if err != nil {
		return err
	}
	var sbom []byte
	if o.sbom != "" {
		if sbom, err = os.ReadFile(o.sbom); err != nil {
			return fmt.Errorf("reading the SBOM: %w", err)
		}
		if err := checkSBOM(sbom, entry.desc.Digest); err != nil {
			return err
		}
	}
	var sv signature.SignerVerifier
	if o.signKey != "" {
		key, err := os.ReadFile(o.signKey)
		if err != nil {
			return fmt.Errorf("reading the signing key: %w", err)
		}
		password, _ := getenv("COSIGN_PASSWORD")
		if sv, err = loadKey(key, []byte(password)); err != nil {
			return err
		}
	}
	if err := entry.push(ref, remoteOpts); err != nil {
		return err
	}
	d := ref.Context().Digest(entry.desc.Digest.String())
	fmt.Fprintf(stdout, "image       %s@%s (%s)\n", ref, entry.desc.Digest, entry.what)
	for _, mt := range more {
		// The manifest again under another tag: its blobs are there.
		if err := entry.push(mt, remoteOpts); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "image       %s@%s (the same)\n", mt, entry.desc.Digest)
	}
	if sbom != nil {
		sd, err := pushSBOM(d, entry.desc, sbom, remoteOpts)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "sbom        %s (SPDX, referrer of %s: oras discover %s)\n", sd, entry.desc.Digest, ref)
	}
	if sv == nil {
		return nil
	}
	sig, err := sign(sv, d, remoteOpts)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "signature   %s (cosign verify --key cosign.pub --insecure-ignore-tlog=true %s)\n", withDigest(sig, remoteOpts), ref)
	if sbom != nil {
		att, err := attest(sv, d, sbom, remoteOpts)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "attestation %s (cosign verify-attestation --key cosign.pub --insecure-ignore-tlog=true --type spdxjson %s)\n", withDigest(att, remoteOpts), ref)
	}
	return nil
}

// layoutEntry is the one entry of make image's layout: an index or an image.
type layoutEntry struct {
	desc  v1.Descriptor
	what  string // for the output: "index: linux/amd64, linux/arm64"
	index v1.ImageIndex
	image v1.Image
}

func readLayout(dir string) (layoutEntry, error) {
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return layoutEntry{}, fmt.Errorf("reading the image layout %s: %w", dir, err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return layoutEntry{}, fmt.Errorf("reading the image layout %s: %w", dir, err)
	}
	if len(im.Manifests) != 1 {
		return layoutEntry{}, fmt.Errorf("reading the image layout %s: %d entries in it, want the one make image writes", dir, len(im.Manifests))
	}
	e := layoutEntry{desc: im.Manifests[0]}
	if e.desc.MediaType.IsImage() {
		e.what = "one image"
		e.image, err = idx.Image(e.desc.Digest)
	} else {
		e.index, err = idx.ImageIndex(e.desc.Digest)
	}
	if err != nil {
		return layoutEntry{}, fmt.Errorf("reading the image layout %s: %w", dir, err)
	}
	if e.index == nil {
		return e, nil
	}
	m, err := e.index.IndexManifest()
	if err != nil {
		return layoutEntry{}, fmt.Errorf("reading the image layout %s: %w", dir, err)
	}
	var platforms []string
	for _, p := range m.Manifests {
		if p.Platform != nil {
			platforms = append(platforms, p.Platform.String())
		}
	}
	e.what = "index: " + strings.Join(platforms, ", ")
	return e, nil
}

func (e layoutEntry) push(ref name.Tag, remoteOpts []remote.Option) error {
	if e.image != nil {
		if err := remote.Write(ref, e.image, remoteOpts...); err != nil {
			return fmt.Errorf("pushing the image to %s: %w", ref, err)
		}
		return nil
	}
	if err := remote.WriteIndex(ref, e.index, remoteOpts...); err != nil {
		return fmt.Errorf("pushing the image index to %s: %w", ref, err)
	}
	return nil
}

// withDigest is tag@digest as the registry now has it, or the tag alone.
func withDigest(t name.Tag, remoteOpts []remote.Option) string {
	desc, err := remote.Head(t, remoteOpts...)
	if err != nil {
		return t.String()
	}
	return t.String() + "@" + desc.Digest.String()
}

func pushChart(o options, nameOpts []name.Option, remoteOpts []remote.Option, stdout io.Writer) error {
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
		return imagebuild.RefError("--chart-repo", o.chartRepo, err)
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
	d, _, err := v1.SHA256(strings.NewReader(string(a.Manifest)))
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "chart       %s@%s (helm install nftmesh oci://%s --version %s)\n", ref, d, ref.Context(), a.Version)
	return nil
}
