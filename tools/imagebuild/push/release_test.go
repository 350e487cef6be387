package main

import (
	"bytes"
	"context"
	"crypto"
	"encoding/base64"
	"encoding/json"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/sigstore/cosign/v3/pkg/cosign"
	ociremote "github.com/sigstore/cosign/v3/pkg/oci/remote"
	"github.com/sigstore/sigstore/pkg/cryptoutils"
	"github.com/sigstore/sigstore/pkg/signature"
	spdxjson "github.com/spdx/tools-golang/json"
	"github.com/spdx/tools-golang/spdxlib"
)

// cosignCLI is the real cosign (make cosign: built from the module proxy
// into .cache/), the independent verifier; "" when not built, which CI
// (CI=true) does not accept.
func cosignCLI(t *testing.T) string {
	t.Helper()
	bin := os.Getenv("COSIGN_BIN")
	if _, err := os.Stat(bin); bin != "" && err == nil {
		return bin
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("COSIGN_BIN=%q is not a file: make cosign builds it (CI checks the signature with the real cosign)", bin)
	}
	t.Logf("COSIGN_BIN=%q is not a file (make cosign builds it): the signature is checked with cosign's library only", bin)
	return ""
}

// keyPair writes a cosign key pair with password into dir, made by the
// real cosign when there is one (the format users bring), else by its
// library, and returns the private and public key files.
func keyPair(t *testing.T, cli, dir, prefix, password string) (string, string) {
	t.Helper()
	priv, pub := filepath.Join(dir, prefix+".key"), filepath.Join(dir, prefix+".pub")
	if cli != "" {
		cmd := exec.Command(cli, "generate-key-pair", "--output-key-prefix", prefix)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "COSIGN_PASSWORD="+password)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("cosign generate-key-pair: %v\n%s", err, out)
		}
		return priv, pub
	}
	keys, err := cosign.GenerateKeyPair(func(bool) ([]byte, error) { return []byte(password), nil })
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(priv, keys.PrivateBytes, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(pub, keys.PublicBytes, 0o644); err != nil {
		t.Fatal(err)
	}
	return priv, pub
}

// TestMakePush runs `make push REGISTRY=127.0.0.1:PORT/mesh SIGNING_KEY=...`
// as a user does, into go-containerregistry's registry on loopback without
// the referrers API (as ghcr.io), and checks what landed there with readers
// that are not ours: the tag is the index of linux/amd64 and linux/arm64
// the layout holds; the SBOM is its referrer (the referrers tag), valid
// SPDX listing the binaries' modules at go.mod's versions; the real cosign
// (and cosign's library) verifies the signature and the SBOM attestation
// with the public key, and refuses another key; a second push adds no
// second signature; the output names every reference with its digest.
func TestMakePush(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the image of two architectures: not in -short")
	}
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make is not installed")
	}
	cli := cosignCLI(t)
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "http://")
	dir := t.TempDir()
	key, pub := keyPair(t, cli, dir, "cosign", "s3cret")
	root, err := filepath.Abs(filepath.Join("..", "..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	const version = "v9.8.7-push-test"
	makePush := func() string {
		t.Helper()
		cmd := exec.Command("make", "-C", root, "push", "REGISTRY="+host+"/mesh", "SIGNING_KEY="+key, "BIN="+filepath.Join(dir, "bin"),
			"VERSION="+version, "CHART_VERSION=9.8.7-push-test", "SOURCE_DATE_EPOCH=1700000000", "ARCHES=amd64 arm64")
		cmd.Env = append(os.Environ(), "COSIGN_PASSWORD=s3cret")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("make push: %v\n%s", err, out)
		}
		return string(out)
	}
	out := makePush()
	ref, err := name.NewTag(host + "/mesh/nftmesh:" + version)
	if err != nil {
		t.Fatal(err)
	}
	index := checkPushedIndex(t, ref, filepath.Join(dir, "bin", "nftmesh-image.oci"))
	d := ref.Context().Digest(index.String())
	hex := index.Hex
	for _, want := range []string{
		`image       ` + regexp.QuoteMeta(ref.String()+"@"+index.String()) + ` \(index: linux/amd64, linux/arm64\)`,
		`sbom        ` + regexp.QuoteMeta(ref.Context().String()) + `@sha256:[0-9a-f]{64} \(SPDX, referrer of ` + index.String(),
		`signature   ` + regexp.QuoteMeta(ref.Context().String()+":sha256-"+hex+".sig@sha256:") + `[0-9a-f]{64}`,
		`attestation ` + regexp.QuoteMeta(ref.Context().String()+":sha256-"+hex+".att@sha256:") + `[0-9a-f]{64}`,
		`chart       ` + regexp.QuoteMeta(host+"/mesh/charts/nftmesh:9.8.7-push-test@sha256:") + `[0-9a-f]{64}`,
	} {
		if !regexp.MustCompile(want).MatchString(out) {
			t.Errorf("make push printed no line matching %s:\n%s", want, out)
		}
	}
	sbom, err := os.ReadFile(filepath.Join(dir, "bin", "nftmesh-image.spdx.json"))
	if err != nil {
		t.Fatal(err)
	}
	checkReferrerSBOM(t, d, sbom, root)
	verifyWithLibrary(t, ref, pub, sbom, 1)
	if cli != "" {
		verifyWithCLI(t, cli, ref, pub, sbom)
		_, other := keyPair(t, cli, dir, "other", "x")
		cmd := exec.Command(cli, "verify", "--key", other, "--insecure-ignore-tlog=true", ref.String())
		if o, err := cmd.CombinedOutput(); err == nil {
			t.Errorf("cosign verify with another key accepted the image:\n%s", o)
		}
	}
	makePush()
	verifyWithLibrary(t, ref, pub, sbom, 1)
}

// checkPushedIndex: the tag resolves to the layout's index, of linux/amd64
// and linux/arm64, whose images are all in the registry.
func checkPushedIndex(t *testing.T, ref name.Tag, ociDir string) v1.Hash {
	t.Helper()
	top, err := layout.ImageIndexFromPath(ociDir)
	if err != nil {
		t.Fatal(err)
	}
	tm, _ := top.IndexManifest()
	want := tm.Manifests[0].Digest
	idx, err := remote.Index(ref)
	if err != nil {
		t.Fatalf("%s is not an index in the registry: %v", ref, err)
	}
	if d, _ := idx.Digest(); d != want {
		t.Fatalf("%s is %s, the layout's index %s", ref, d, want)
	}
	m, _ := idx.IndexManifest()
	var platforms []string
	for _, e := range m.Manifests {
		platforms = append(platforms, e.Platform.String())
		img, err := remote.Image(ref.Context().Digest(e.Digest.String()))
		if err != nil {
			t.Fatal(err)
		}
		if cf, err := img.ConfigFile(); err != nil || cf.OS+"/"+cf.Architecture != e.Platform.String() {
			t.Errorf("%s: config %+v, %v", e.Platform, cf, err)
		}
	}
	if strings.Join(platforms, ",") != "linux/amd64,linux/arm64" {
		t.Errorf("platforms %v", platforms)
	}
	return want
}

// checkReferrerSBOM: the index's referrers list the SBOM, whose blob is
// the file make image wrote: valid SPDX naming the index and the modules.
func checkReferrerSBOM(t *testing.T, d name.Digest, sbom []byte, root string) {
	t.Helper()
	refs, err := remote.Referrers(d)
	if err != nil {
		t.Fatal(err)
	}
	rm, _ := refs.IndexManifest()
	var found []byte
	for _, r := range rm.Manifests {
		if r.ArtifactType != "application/spdx+json" {
			continue
		}
		img, err := remote.Image(d.Context().Digest(r.Digest.String()))
		if err != nil {
			t.Fatal(err)
		}
		m, _ := img.Manifest()
		if m.Subject == nil || m.Subject.Digest.String() != d.DigestStr() || len(m.Layers) != 1 {
			t.Fatalf("the SBOM's manifest %+v", m)
		}
		l, err := remote.Layer(d.Context().Digest(m.Layers[0].Digest.String()))
		if err != nil {
			t.Fatal(err)
		}
		rc, _ := l.Compressed()
		found, _ = io.ReadAll(rc)
		rc.Close()
	}
	if !bytes.Equal(found, sbom) {
		t.Fatalf("the referrers of %s hold no SBOM equal to make image's (%d referrers)", d, len(rm.Manifests))
	}
	doc, err := spdxjson.Read(bytes.NewReader(found))
	if err != nil {
		t.Fatal(err)
	}
	if err := spdxlib.ValidateDocument(doc); err != nil {
		t.Error(err)
	}
	got := map[string]string{}
	for _, p := range doc.Packages {
		got[p.PackageName] = p.PackageVersion
	}
	out, err := exec.Command("go", "-C", root, "list", "-m", "-f", "{{.Path}} {{.Version}}", "github.com/google/nftables", "k8s.io/client-go").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		path, version, _ := strings.Cut(l, " ")
		if got[path] != version {
			t.Errorf("the pushed SBOM lists %s at %q, go.mod selects %s", path, got[path], version)
		}
	}
}

// verifyWithLibrary checks the signature and the attestation with cosign's
// own verification (the public key, no transparency log), and that there
// are n signatures.
func verifyWithLibrary(t *testing.T, ref name.Tag, pubFile string, sbom []byte, n int) {
	t.Helper()
	pem, err := os.ReadFile(pubFile)
	if err != nil {
		t.Fatal(err)
	}
	pk, err := cryptoutils.UnmarshalPEMToPublicKey(pem)
	if err != nil {
		t.Fatal(err)
	}
	v, err := signature.LoadVerifier(pk, crypto.SHA256)
	if err != nil {
		t.Fatal(err)
	}
	co := &cosign.CheckOpts{SigVerifier: v, IgnoreTlog: true, ClaimVerifier: cosign.SimpleClaimVerifier,
		RegistryClientOpts: []ociremote.Option{ociremote.WithRemoteOptions(remote.WithContext(context.Background()))}}
	sigList, _, err := cosign.VerifyImageSignatures(context.Background(), ref, co)
	if err != nil || len(sigList) != n {
		t.Fatalf("cosign's library: %d signatures verified, want %d: %v", len(sigList), n, err)
	}
	co.ClaimVerifier = cosign.IntotoSubjectClaimVerifier
	atts, _, err := cosign.VerifyImageAttestations(context.Background(), ref, co)
	if err != nil || len(atts) != 1 {
		t.Fatalf("cosign's library: %d attestations verified, want 1: %v", len(atts), err)
	}
	payload, _ := atts[0].Payload()
	checkAttestedSBOM(t, payload, sbom)
}

// checkAttestedSBOM: a DSSE envelope whose in-toto statement is an SPDX
// predicate equal to the SBOM.
func checkAttestedSBOM(t *testing.T, envelope, sbom []byte) {
	t.Helper()
	var env struct{ PayloadType, Payload string }
	if err := json.Unmarshal(envelope, &env); err != nil {
		t.Fatalf("attestation %.200s: %v", envelope, err)
	}
	st, err := base64.StdEncoding.DecodeString(env.Payload)
	if err != nil {
		t.Fatal(err)
	}
	var statement struct {
		PredicateType string          `json:"predicateType"`
		Predicate     json.RawMessage `json:"predicate"`
	}
	if err := json.Unmarshal(st, &statement); err != nil {
		t.Fatal(err)
	}
	var got, want any
	if err := json.Unmarshal(statement.Predicate, &got); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(sbom, &want); err != nil {
		t.Fatal(err)
	}
	gotJSON, _ := json.Marshal(got)
	wantJSON, _ := json.Marshal(want)
	if env.PayloadType != "application/vnd.in-toto+json" || statement.PredicateType != "https://spdx.dev/Document" || !bytes.Equal(gotJSON, wantJSON) {
		t.Errorf("attestation %s / %s, predicate equal to the SBOM %v", env.PayloadType, statement.PredicateType, bytes.Equal(gotJSON, wantJSON))
	}
}

// verifyWithCLI: `cosign verify --key` and `cosign verify-attestation
// --type spdxjson`, as docs/supply-chain.md tells users to run them.
func verifyWithCLI(t *testing.T, cli string, ref name.Tag, pub string, sbom []byte) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(cli, "verify", "--key", pub, "--insecure-ignore-tlog=true", ref.String())
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("cosign verify: %v\n%s%s", err, stdout.String(), stderr.String())
	}
	if !strings.Contains(stdout.String(), `"docker-manifest-digest":"`) || !strings.Contains(stderr.String(), "The signatures were verified against the specified public key") {
		t.Errorf("cosign verify printed:\n%s%s", stdout.String(), stderr.String())
	}
	stdout.Reset()
	stderr.Reset()
	cmd = exec.Command(cli, "verify-attestation", "--key", pub, "--insecure-ignore-tlog=true", "--type", "spdxjson", ref.String())
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("cosign verify-attestation: %v\n%s%s", err, stdout.String(), stderr.String())
	}
	checkAttestedSBOM(t, bytes.TrimSpace(stdout.Bytes()), sbom)
	t.Logf("%s verified the signature and the SBOM attestation of %s", cli, ref)
}
