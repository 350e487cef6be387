package imagebuild

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Index returns the OCI image index of images, one per platform (each
// image's config says which), in the order given, with annotations on the
// index itself. A runtime pulls the image of its own platform; the index
// digest covers every image's, so it is as reproducible as they are.
func Index(images []v1.Image, annotations map[string]string) (v1.ImageIndex, error) {
	if len(images) == 0 {
		return nil, errors.New("building the image index: no images")
	}
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	seen := map[string]bool{}
	for _, img := range images {
		cf, err := img.ConfigFile()
		if err != nil {
			return nil, fmt.Errorf("building the image index: reading an image's config: %w", err)
		}
		p := v1.Platform{OS: cf.OS, Architecture: cf.Architecture, Variant: cf.Variant}
		if seen[p.String()] {
			return nil, fmt.Errorf("building the image index: two images for %s", p.String())
		}
		seen[p.String()] = true
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &p}})
	}
	if len(annotations) > 0 {
		idx = mutate.Annotations(idx, annotations).(v1.ImageIndex)
	}
	return idx, nil
}

// Platforms are the nftmesh image's images by GOARCH, and their index.
type Platforms struct {
	Index  v1.ImageIndex
	Images map[string]v1.Image
}

// NftmeshIndex builds the nftmesh image of each architecture's binaries
// (Nftmesh, with meta.Architecture set to the key) and their index, in
// GOARCH order, annotated with the images' labels (registries show those of
// the index).
func NftmeshIndex(bins map[string]Binaries, meta Meta) (Platforms, error) {
	p := Platforms{Images: map[string]v1.Image{}}
	var images []v1.Image
	for _, arch := range slices.Sorted(maps.Keys(bins)) {
		m := meta
		m.Architecture = arch
		img, err := Nftmesh(bins[arch], m)
		if err != nil {
			return Platforms{}, fmt.Errorf("linux/%s: %w", arch, err)
		}
		p.Images[arch] = img
		images = append(images, img)
	}
	idx, err := Index(images, Labels(meta))
	if err != nil {
		return Platforms{}, err
	}
	p.Index = idx
	return p, nil
}

// WriteOCIIndexLayout writes idx as the only entry of an OCI image layout at
// dir, replacing whatever dir held, annotated as WriteOCILayout annotates an
// image (containerd's `ctr images import` then names it tag and unpacks the
// platforms it is asked for).
func WriteOCIIndexLayout(dir, tag string, idx v1.ImageIndex) error {
	return writeLayout(dir, tag, func(p layout.Path, opt layout.Option) error { return p.AppendIndex(idx, opt) })
}

// WriteOCILayout writes img as the only image of an OCI image layout at dir,
// replacing whatever dir held. Its descriptor carries the tag both as the
// OCI ref name (the tag part) and as containerd's full image name.
func WriteOCILayout(dir, tag string, img v1.Image) error {
	return writeLayout(dir, tag, func(p layout.Path, opt layout.Option) error { return p.AppendImage(img, opt) })
}

func writeLayout(dir, tag string, add func(layout.Path, layout.Option) error) error {
	ref, err := name.NewTag(tag)
	if err != nil {
		return RefError("parsing the image tag", tag, err)
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("replacing the OCI layout %s: %w", dir, err)
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return fmt.Errorf("writing the OCI layout %s: %w", dir, err)
	}
	err = add(p, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": ref.TagStr(),
		"io.containerd.image.name":          ref.String(),
	}))
	if err != nil {
		return fmt.Errorf("writing the OCI layout %s: %w", dir, err)
	}
	return nil
}
