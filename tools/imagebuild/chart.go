package imagebuild

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"sigs.k8s.io/yaml"
)

// Helm's media types for a chart stored in an OCI registry (what `helm
// push` writes and `helm pull oci://...` reads).
const (
	ChartConfigMediaType  types.MediaType = "application/vnd.cncf.helm.config.v1+json"
	ChartContentMediaType types.MediaType = "application/vnd.cncf.helm.chart.content.v1.tar+gzip"
)

// maxChartYAML bounds the Chart.yaml read from a package.
const maxChartYAML = 1 << 20

// ChartArtifact is a packaged Helm chart as an OCI artifact: the config
// blob (Chart.yaml as JSON), the package as its one layer, and the
// manifest that ties them together under the tag Tag.
type ChartArtifact struct {
	Name, Version string
	// Tag is the version as an OCI tag: Helm writes "+" as "_".
	Tag      string
	Config   v1.Layer
	Content  v1.Layer
	Manifest []byte
}

// RawManifest and MediaType (an OCI image manifest, as Helm writes) make
// the artifact a remote.Taggable.
func (a *ChartArtifact) RawManifest() ([]byte, error) { return a.Manifest, nil }

func (a *ChartArtifact) MediaType() (types.MediaType, error) { return types.OCIManifestSchema1, nil }

// NewChartArtifact reads a chart package (a .tgz from `helm package`) and
// lays it out as Helm does in a registry.
func NewChartArtifact(tgz []byte) (*ChartArtifact, error) {
	meta, err := chartMetadata(tgz)
	if err != nil {
		return nil, err
	}
	name, _ := meta["name"].(string)
	version, _ := meta["version"].(string)
	if name == "" || version == "" {
		return nil, fmt.Errorf("reading the chart package: Chart.yaml has no name or version (name %s, version %s)", quote(name), quote(version))
	}
	cfg, err := json.Marshal(meta)
	if err != nil {
		return nil, fmt.Errorf("encoding the chart's metadata: %w", err)
	}
	a := &ChartArtifact{
		Name:    name,
		Version: version,
		Tag:     strings.ReplaceAll(version, "+", "_"),
		Config:  static.NewLayer(cfg, ChartConfigMediaType),
		Content: static.NewLayer(tgz, ChartContentMediaType),
	}
	desc := func(l v1.Layer, mt types.MediaType, n int) (v1.Descriptor, error) {
		d, err := l.Digest()
		return v1.Descriptor{MediaType: mt, Size: int64(n), Digest: d}, err
	}
	cd, err := desc(a.Config, ChartConfigMediaType, len(cfg))
	if err != nil {
		return nil, fmt.Errorf("hashing the chart's config: %w", err)
	}
	ld, err := desc(a.Content, ChartContentMediaType, len(tgz))
	if err != nil {
		return nil, fmt.Errorf("hashing the chart package: %w", err)
	}
	annotations := map[string]string{
		"org.opencontainers.image.title":   name,
		"org.opencontainers.image.version": version,
	}
	if d, ok := meta["description"].(string); ok && d != "" {
		annotations["org.opencontainers.image.description"] = d
	}
	if h, ok := meta["home"].(string); ok && h != "" {
		annotations["org.opencontainers.image.url"] = h
	}
	a.Manifest, err = json.Marshal(v1.Manifest{
		SchemaVersion: 2,
		MediaType:     types.OCIManifestSchema1,
		Config:        cd,
		Layers:        []v1.Descriptor{ld},
		Annotations:   annotations,
	})
	if err != nil {
		return nil, fmt.Errorf("encoding the chart's manifest: %w", err)
	}
	return a, nil
}

// chartMetadata returns the package's <chart>/Chart.yaml as a map, the
// form Helm's config blob carries it in (its field names are the YAML's).
func chartMetadata(tgz []byte) (map[string]any, error) {
	zr, err := gzip.NewReader(bytes.NewReader(tgz))
	if err != nil {
		return nil, fmt.Errorf("reading the chart package: %w", err)
	}
	tr := tar.NewReader(zr)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil, errors.New("reading the chart package: no <chart>/Chart.yaml in it")
		}
		if err != nil {
			return nil, fmt.Errorf("reading the chart package: %w", err)
		}
		// Only the top-level chart's, not a dependency's under charts/.
		if dir, file := path.Split(path.Clean(hdr.Name)); file != "Chart.yaml" || strings.Count(dir, "/") != 1 {
			continue
		}
		b, err := io.ReadAll(io.LimitReader(tr, maxChartYAML+1))
		if err != nil {
			return nil, fmt.Errorf("reading the chart package's %s: %w", quote(hdr.Name), err)
		}
		if len(b) > maxChartYAML {
			return nil, fmt.Errorf("reading the chart package's %s: larger than %d bytes", quote(hdr.Name), maxChartYAML)
		}
		var meta map[string]any
		if err := yaml.Unmarshal(b, &meta); err != nil {
			return nil, fmt.Errorf("parsing the chart package's %s: %w", quote(hdr.Name), err)
		}
		return meta, nil
	}
}
