package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/nftmesh/nftmesh/tools/imagebuild"
)

// chartTgz is a chart package as `helm package` lays it out.
func chartTgz(t *testing.T, chartYAML string) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for name, body := range map[string]string{
		"nftmesh/Chart.yaml":                 chartYAML,
		"nftmesh/values.yaml":                "a: 1\n",
		"nftmesh/templates/cm.yaml":          "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n",
		"nftmesh/charts/dep/Chart.yaml":      "apiVersion: v2\nname: dep\nversion: 9.9.9\n",
		"nftmesh/charts/dep/templates/.keep": "",
	} {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// make push's program against go-containerregistry's in-process registry
// on loopback: the image arrives with the digest the layout holds, the
// chart under <chart-repo>/<name>:<version> ("+" as "_") with Helm's
// media types, and helm itself pulls it (when helm is installed).
func TestPushImageAndChart(t *testing.T) {
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "http://")
	dir := t.TempDir()

	img, err := imagebuild.Build([]imagebuild.File{{Path: "/hello", Mode: 0o644, Data: []byte("hi")}}, imagebuild.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ociDir := filepath.Join(dir, "image.oci")
	if err := imagebuild.WriteOCILayout(ociDir, "ghcr.io/nftmesh/nftmesh:v1.2.3", img); err != nil {
		t.Fatal(err)
	}
	const chartYAML = "apiVersion: v2\nname: nftmesh\ndescription: test chart\nversion: 1.2.3+build.4\nappVersion: v1.2.3+build.4\ntype: application\n"
	tgz := chartTgz(t, chartYAML)
	chartFile := filepath.Join(dir, "nftmesh-1.2.3+build.4.tgz")
	if err := os.WriteFile(chartFile, tgz, 0o644); err != nil {
		t.Fatal(err)
	}

	var out, errb bytes.Buffer
	imageRef := host + "/nftmesh/nftmesh:v1.2.3"
	if rc := run([]string{"--oci-dir", ociDir, "--image", imageRef, "--chart", chartFile, "--chart-repo", host + "/charts"}, noenv, &out, &errb); rc != 0 {
		t.Fatalf("push exited %d: %s", rc, errb.String())
	}

	ref, _ := name.NewTag(imageRef)
	got, err := remote.Image(ref)
	if err != nil {
		t.Fatal(err)
	}
	wantDigest, _ := img.Digest()
	if d, _ := got.Digest(); d != wantDigest {
		t.Errorf("image digest %s in the registry, %s in the layout", d, wantDigest)
	}

	chartRef, _ := name.NewTag(host + "/charts/nftmesh:1.2.3_build.4")
	desc, err := remote.Get(chartRef)
	if err != nil {
		t.Fatalf("chart not under its version tag: %v", err)
	}
	var m v1.Manifest
	if err := json.Unmarshal(desc.Manifest, &m); err != nil {
		t.Fatal(err)
	}
	if desc.MediaType != "application/vnd.oci.image.manifest.v1+json" || m.Config.MediaType != imagebuild.ChartConfigMediaType ||
		len(m.Layers) != 1 || m.Layers[0].MediaType != imagebuild.ChartContentMediaType {
		t.Fatalf("chart manifest %s %s", desc.MediaType, desc.Manifest)
	}
	blob, err := remote.Layer(chartRef.Context().Digest(m.Layers[0].Digest.String()))
	if err != nil {
		t.Fatal(err)
	}
	rc, err := blob.Compressed()
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	if !bytes.Equal(b, tgz) {
		t.Error("the chart's layer is not the package")
	}
	cfgBlob, err := remote.Layer(chartRef.Context().Digest(m.Config.Digest.String()))
	if err != nil {
		t.Fatal(err)
	}
	rc, _ = cfgBlob.Compressed()
	cb, _ := io.ReadAll(rc)
	rc.Close()
	var meta map[string]any
	if err := json.Unmarshal(cb, &meta); err != nil || meta["name"] != "nftmesh" || meta["version"] != "1.2.3+build.4" || meta["appVersion"] != "v1.2.3+build.4" {
		t.Errorf("chart config %s: %v", cb, err)
	}
	if !strings.Contains(out.String(), "helm install nftmesh oci://"+host+"/charts/nftmesh --version 1.2.3+build.4") {
		t.Errorf("output %q", out.String())
	}

	// Helm reads what was pushed as its own.
	helm := os.Getenv("HELM_BIN")
	if helm == "" {
		helm, _ = exec.LookPath("helm")
	}
	if helm == "" {
		t.Log("helm not found: the pull by helm is not checked")
		return
	}
	pullDir := t.TempDir()
	cmd := exec.Command(helm, "pull", "oci://"+host+"/charts/nftmesh", "--version", "1.2.3+build.4", "--plain-http", "--destination", pullDir)
	cmd.Env = append(os.Environ(), "HELM_REGISTRY_CONFIG="+filepath.Join(pullDir, "registry.json"), "HOME="+pullDir)
	if o, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("helm pull: %v\n%s", err, o)
	}
	pulled, err := os.ReadFile(filepath.Join(pullDir, "nftmesh-1.2.3+build.4.tgz"))
	if err != nil || !bytes.Equal(pulled, tgz) {
		t.Errorf("helm pulled another package: %v", err)
	}
}

func TestPushFlags(t *testing.T) {
	for _, args := range [][]string{
		nil,
		{"--oci-dir", "x"},
		{"--chart", "x.tgz"},
		{"--image", "a/b:c", "--oci-dir", "/nonexistent"},
		{"--chart", "/nonexistent.tgz", "--chart-repo", "127.0.0.1:1/charts"},
		{"--oci-dir", "x", "--image", "UPPER/Case:tag"},
	} {
		var out, errb bytes.Buffer
		if rc := run(args, noenv, &out, &errb); rc == 0 || !strings.HasPrefix(errb.String(), "push: ") {
			t.Errorf("%v: exit %d, %q", args, rc, errb.String())
		}
	}
}

func noenv(string) (string, bool) { return "", false }
