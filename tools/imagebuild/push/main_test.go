package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
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
	"github.com/sigstore/cosign/v3/pkg/cosign"
	spdxjson "github.com/spdx/tools-golang/json"
	"github.com/spdx/tools-golang/spdx"
	"github.com/spdx/tools-golang/spdx/v2/common"

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
	if rc := run([]string{"--oci-dir", ociDir, "--image", imageRef, "--tag", "v1.2.4-dev", "--chart", chartFile, "--chart-repo", host + "/charts"}, noenv, &out, &errb); rc != 0 {
		t.Fatalf("push exited %d: %s", rc, errb.String())
	}

	// The image under --image's tag and under each --tag.
	wantDigest, _ := img.Digest()
	for _, r := range []string{imageRef, host + "/nftmesh/nftmesh:v1.2.4-dev"} {
		ref, _ := name.NewTag(r)
		got, err := remote.Image(ref)
		if err != nil {
			t.Fatalf("%s: %v", r, err)
		}
		if d, _ := got.Digest(); d != wantDigest {
			t.Errorf("%s: digest %s in the registry, %s in the layout", r, d, wantDigest)
		}
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
		{"--tag", "v1"},
		{"--oci-dir", "x", "--image", "a/b:c", "--tag", "bad tag!"},
	} {
		var out, errb bytes.Buffer
		if rc := run(args, noenv, &out, &errb); rc == 0 || !strings.HasPrefix(errb.String(), "push: ") {
			t.Errorf("%v: exit %d, %q", args, rc, errb.String())
		}
		if len(args) > 2 && args[len(args)-2] == "--tag" && !strings.Contains(errb.String(), "--tag") {
			t.Errorf("%v: the error does not name --tag: %q", args, errb.String())
		}
	}
}

func noenv(string) (string, bool) { return "", false }

// smallIndex writes an index of two tiny one-file images as make image's
// layout, and an SPDX document naming it as make image's SBOM does.
func smallIndex(t testing.TB, dir string) (ociDir, sbomFile string, index v1.Hash) {
	t.Helper()
	var imgs []v1.Image
	for _, arch := range []string{"amd64", "arm64"} {
		img, err := imagebuild.Build([]imagebuild.File{{Path: "/hello", Mode: 0o644, Data: []byte(arch)}}, imagebuild.Config{Architecture: arch})
		if err != nil {
			t.Fatal(err)
		}
		imgs = append(imgs, img)
	}
	idx, err := imagebuild.Index(imgs, nil)
	if err != nil {
		t.Fatal(err)
	}
	ociDir = filepath.Join(dir, "image.oci")
	if err := imagebuild.WriteOCIIndexLayout(ociDir, "ghcr.io/nftmesh/nftmesh:v1.2.3", idx); err != nil {
		t.Fatal(err)
	}
	index, _ = idx.Digest()
	doc := &spdx.Document{SPDXVersion: spdx.Version, DataLicense: spdx.DataLicense, SPDXIdentifier: "DOCUMENT", DocumentName: "x",
		DocumentNamespace: "https://example.com/x", CreationInfo: &spdx.CreationInfo{Created: "2023-11-14T22:13:20Z",
			Creators: []common.Creator{{CreatorType: "Tool", Creator: "test"}}},
		Packages: []*spdx.Package{{PackageName: "nftmesh", PackageSPDXIdentifier: "Image", PackageDownloadLocation: "NOASSERTION",
			PrimaryPackagePurpose: "CONTAINER", PackageChecksums: []common.Checksum{{Algorithm: common.SHA256, Value: index.Hex}}}}}
	var buf bytes.Buffer
	if err := spdxjson.Write(doc, &buf); err != nil {
		t.Fatal(err)
	}
	sbomFile = filepath.Join(dir, "sbom.json")
	if err := os.WriteFile(sbomFile, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return ociDir, sbomFile, index
}

// On a registry with the referrers API (OCI 1.1), the SBOM is among the
// index's referrers, as an artifact of type application/spdx+json whose
// subject is the index.
func TestPushSBOMReferrersAPI(t *testing.T) {
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0)), registry.WithReferrersSupport(true)))
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "http://")
	ociDir, sbomFile, index := smallIndex(t, t.TempDir())
	var out, errb bytes.Buffer
	if rc := run([]string{"--oci-dir", ociDir, "--image", host + "/mesh/nftmesh:v1.2.3", "--sbom", sbomFile}, noenv, &out, &errb); rc != 0 {
		t.Fatalf("push: %d %s", rc, errb.String())
	}
	d, _ := name.NewDigest(host + "/mesh/nftmesh@" + index.String())
	refs, err := remote.Referrers(d)
	if err != nil {
		t.Fatal(err)
	}
	m, _ := refs.IndexManifest()
	if len(m.Manifests) != 1 || !strings.Contains(out.String(), m.Manifests[0].Digest.String()) {
		t.Fatalf("referrers %+v; push printed %s", m.Manifests, out.String())
	}
	// The registry's list names the config's type; the manifest itself
	// carries the artifact type.
	desc, err := remote.Get(d.Context().Digest(m.Manifests[0].Digest.String()))
	if err != nil {
		t.Fatal(err)
	}
	var am v1.Manifest
	if err := json.Unmarshal(desc.Manifest, &am); err != nil {
		t.Fatal(err)
	}
	want, _ := os.ReadFile(sbomFile)
	if am.ArtifactType != "application/spdx+json" || am.Subject == nil || am.Subject.Digest != index ||
		am.Config.MediaType != "application/vnd.oci.empty.v1+json" || len(am.Layers) != 1 || am.Layers[0].Size != int64(len(want)) {
		t.Errorf("the SBOM's manifest %s", desc.Manifest)
	}
}

// What push can refuse it refuses before it pushes anything: an SBOM of
// another index, a key it cannot open, a wrong password.
func TestPushRefusesBeforePushing(t *testing.T) {
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "http://")
	dir := t.TempDir()
	ociDir, sbomFile, _ := smallIndex(t, dir)
	otherDir := t.TempDir()
	_, otherSBOM, _ := smallIndex(t, otherDir)
	// Another index: the same files, another tag, another SBOM digest.
	doc, _ := os.ReadFile(otherSBOM)
	if err := os.WriteFile(otherSBOM, bytes.Replace(doc, []byte(`"checksumValue":"`), []byte(`"checksumValue":"0`), 1), 0o644); err != nil {
		t.Fatal(err)
	}
	keys, err := cosign.GenerateKeyPair(func(bool) ([]byte, error) { return []byte("right"), nil })
	if err != nil {
		t.Fatal(err)
	}
	keyFile, notKey := filepath.Join(dir, "cosign.key"), filepath.Join(dir, "not.key")
	if err := os.WriteFile(keyFile, keys.PrivateBytes, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(notKey, keys.PublicBytes, 0o600); err != nil {
		t.Fatal(err)
	}
	image := host + "/mesh/nftmesh:v1.2.3"
	for _, tc := range []struct {
		name     string
		args     []string
		password string
		want     string
	}{
		{"SBOM of another index", []string{"--sbom", otherSBOM}, "", "the SBOM describes no container with digest sha256:"},
		{"not SPDX", []string{"--sbom", keyFile}, "", "reading the SBOM"},
		{"no SBOM file", []string{"--sbom", filepath.Join(dir, "missing.json")}, "", "reading the SBOM"},
		{"a public key", []string{"--sign-key", notKey}, "right", "loading the signing key (cosign's encrypted key; its password in COSIGN_PASSWORD): unsupported pem type: PUBLIC KEY"},
		{"wrong password", []string{"--sbom", sbomFile, "--sign-key", keyFile}, "wrong", "loading the signing key (cosign's encrypted key; its password in COSIGN_PASSWORD): decrypt"},
		{"no password", []string{"--sign-key", keyFile}, "", "decrypt"},
	} {
		var out, errb bytes.Buffer
		getenv := func(k string) (string, bool) { return tc.password, k == "COSIGN_PASSWORD" && tc.password != "" }
		args := append([]string{"--oci-dir", ociDir, "--image", image}, tc.args...)
		if rc := run(args, getenv, &out, &errb); rc != 1 || !strings.Contains(errb.String(), tc.want) || out.Len() != 0 {
			t.Errorf("%s: exit %d, %q, printed %q; want exit 1 and %q", tc.name, rc, errb.String(), out.String(), tc.want)
		}
	}
	reg, _ := name.NewRegistry(host)
	if repos, err := remote.Catalog(context.Background(), reg); err != nil || len(repos) != 0 {
		t.Errorf("after refusals the registry holds %v (%v)", repos, err)
	}
}

// FuzzCheckSBOM: any file given as --sbom is accepted only when it is SPDX
// naming the index, else refused with a bounded error; never a panic.
func FuzzCheckSBOM(f *testing.F) {
	_, sbomFile, index := smallIndex(f, f.TempDir())
	good, err := os.ReadFile(sbomFile)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add([]byte(`{"spdxVersion":"SPDX-2.3","packages":[{"primaryPackagePurpose":"CONTAINER","checksums":[{"algorithm":"SHA256","checksumValue":"x"}]}]}`))
	f.Add([]byte("{}"))
	f.Fuzz(func(t *testing.T, b []byte) {
		err := checkSBOM(b, index)
		if err != nil && len(err.Error()) > 400 {
			t.Errorf("unbounded error: %d bytes", len(err.Error()))
		}
	})
}
