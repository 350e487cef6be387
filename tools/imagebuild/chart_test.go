package imagebuild

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"strings"
	"testing"
)

func tgzOf(t testing.TB, files map[string]string) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for name, body := range files {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(body)); err != nil {
			t.Fatal(err)
		}
	}
	tw.Close()
	zw.Close()
	return buf.Bytes()
}

func TestChartArtifactBadPackages(t *testing.T) {
	for _, tc := range []struct {
		name string
		tgz  []byte
		want string
	}{
		{"not gzip", []byte("PK\x03\x04"), "reading the chart package"},
		{"empty", nil, "reading the chart package"},
		{"no Chart.yaml", tgzOf(t, map[string]string{"nftmesh/values.yaml": "a: 1"}), "no <chart>/Chart.yaml"},
		{"only a dependency's Chart.yaml", tgzOf(t, map[string]string{"nftmesh/charts/dep/Chart.yaml": "name: dep\nversion: 1.0.0"}), "no <chart>/Chart.yaml"},
		{"Chart.yaml not YAML", tgzOf(t, map[string]string{"nftmesh/Chart.yaml": "name: [x"}), "parsing the chart package's \"nftmesh/Chart.yaml\""},
		{"no version", tgzOf(t, map[string]string{"nftmesh/Chart.yaml": "name: nftmesh"}), "no name or version"},
		{"version not a string", tgzOf(t, map[string]string{"nftmesh/Chart.yaml": "name: nftmesh\nversion: [1]"}), "no name or version"},
		{"huge Chart.yaml", tgzOf(t, map[string]string{"nftmesh/Chart.yaml": "name: nftmesh\n#" + strings.Repeat("x", maxChartYAML)}), "larger than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, err := NewChartArtifact(tc.tgz)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %+v, %v; want an error with %q", a, err, tc.want)
			}
			if len(err.Error()) > 300 {
				t.Errorf("unbounded error: %d bytes", len(err.Error()))
			}
		})
	}
	a, err := NewChartArtifact(tgzOf(t, map[string]string{"nftmesh/Chart.yaml": "apiVersion: v2\nname: nftmesh\nversion: 0.0.0-8c34896+dirty\n"}))
	if err != nil || a.Tag != "0.0.0-8c34896_dirty" || a.Name != "nftmesh" {
		t.Errorf("%+v %v", a, err)
	}
}

func FuzzNewChartArtifact(f *testing.F) {
	f.Add(tgzOf(f, map[string]string{"nftmesh/Chart.yaml": "apiVersion: v2\nname: nftmesh\nversion: 1.0.0\n"}))
	f.Add(tgzOf(f, map[string]string{"nftmesh/Chart.yaml": "name: x"}))
	f.Add([]byte{0x1f, 0x8b})
	f.Fuzz(func(t *testing.T, b []byte) {
		a, err := NewChartArtifact(b)
		if err != nil {
			if len(err.Error()) > 300 {
				t.Errorf("unbounded error: %d bytes", len(err.Error()))
			}
			return
		}
		if a.Name == "" || a.Version == "" || strings.Contains(a.Tag, "+") || len(a.Manifest) == 0 {
			t.Errorf("artifact %+v", a)
		}
	})
}
