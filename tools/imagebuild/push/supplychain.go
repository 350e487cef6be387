package main

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/sigstore/cosign/v3/pkg/cosign"
	"github.com/sigstore/cosign/v3/pkg/cosign/attestation"
	cremote "github.com/sigstore/cosign/v3/pkg/cosign/remote"
	"github.com/sigstore/cosign/v3/pkg/oci"
	"github.com/sigstore/cosign/v3/pkg/oci/mutate"
	ociremote "github.com/sigstore/cosign/v3/pkg/oci/remote"
	ocistatic "github.com/sigstore/cosign/v3/pkg/oci/static"
	ctypes "github.com/sigstore/cosign/v3/pkg/types"
	"github.com/sigstore/sigstore/pkg/signature"
	"github.com/sigstore/sigstore/pkg/signature/dsse"
	sigpayload "github.com/sigstore/sigstore/pkg/signature/payload"
	spdxjson "github.com/spdx/tools-golang/json"

	"github.com/nftmesh/nftmesh/tools/imagebuild"
)

// The OCI 1.1 empty config of an artifact manifest, and the predicate type
// of an SPDX attestation (what `cosign verify-attestation --type spdxjson`
// asks for).
const (
	emptyMediaType   = types.MediaType("application/vnd.oci.empty.v1+json")
	spdxPredicateURI = "https://spdx.dev/Document"
)

// checkSBOM refuses an SBOM that is not SPDX JSON or describes another
// index than the one pushed (an SBOM left from an older `make image`).
func checkSBOM(sbom []byte, index v1.Hash) error {
	doc, err := spdxjson.Read(bytes.NewReader(sbom))
	if err != nil {
		return fmt.Errorf("reading the SBOM: %w", err)
	}
	for _, p := range doc.Packages {
		// An SPDX 2.1 or 2.2 document converted to 2.3 may hold nil
		// packages (FuzzCheckSBOM).
		if p == nil || p.PrimaryPackagePurpose != "CONTAINER" {
			continue
		}
		for _, c := range p.PackageChecksums {
			if c.Algorithm == "SHA256" && c.Value == index.Hex {
				return nil
			}
		}
	}
	return fmt.Errorf("the SBOM describes no container with digest %s, the image pushed (run make image again)", index)
}

// pushSBOM pushes the SBOM as an OCI 1.1 artifact whose subject is the
// index: `oras discover` and the registry's referrers API list it; on a
// registry without that API, go-containerregistry maintains the referrers
// tag (sha256-<index hex>) the distribution spec falls back to.
func pushSBOM(subject name.Digest, desc v1.Descriptor, sbom []byte, opts []remote.Option) (name.Digest, error) {
	cfg := static.NewLayer([]byte("{}"), emptyMediaType)
	layer := static.NewLayer(sbom, imagebuild.SBOMMediaType)
	// Static layers hash in memory: no error.
	cd, _ := cfg.Digest()
	ld, _ := layer.Digest()
	m := v1.Manifest{
		SchemaVersion: 2,
		MediaType:     types.OCIManifestSchema1,
		ArtifactType:  imagebuild.SBOMMediaType,
		Config:        v1.Descriptor{MediaType: emptyMediaType, Size: 2, Digest: cd, Data: []byte("{}")},
		Layers:        []v1.Descriptor{{MediaType: imagebuild.SBOMMediaType, Size: int64(len(sbom)), Digest: ld}},
		Subject:       &v1.Descriptor{MediaType: desc.MediaType, Size: desc.Size, Digest: desc.Digest},
	}
	raw, err := json.Marshal(m)
	if err != nil {
		return name.Digest{}, fmt.Errorf("encoding the SBOM's manifest: %w", err)
	}
	for _, l := range []v1.Layer{cfg, layer} {
		if err := remote.WriteLayer(subject.Context(), l, opts...); err != nil {
			return name.Digest{}, fmt.Errorf("pushing the SBOM to %s: %w", subject.Context(), err)
		}
	}
	d, _, err := v1.SHA256(bytes.NewReader(raw))
	if err != nil {
		return name.Digest{}, err
	}
	ref := subject.Context().Digest(d.String())
	if err := remote.Put(ref, rawManifest{raw, types.OCIManifestSchema1}, opts...); err != nil {
		return name.Digest{}, fmt.Errorf("pushing the SBOM's manifest to %s: %w", ref, err)
	}
	return ref, nil
}

type rawManifest struct {
	raw []byte
	mt  types.MediaType
}

func (r rawManifest) RawManifest() ([]byte, error)        { return r.raw, nil }
func (r rawManifest) MediaType() (types.MediaType, error) { return r.mt, nil }

// loadKey reads a cosign private key (`cosign generate-key-pair`: an
// encrypted PEM) with its password.
func loadKey(pem, password []byte) (signature.SignerVerifier, error) {
	sv, err := cosign.LoadPrivateKey(pem, password, nil)
	if err != nil {
		return nil, fmt.Errorf("loading the signing key (cosign's encrypted key; its password in COSIGN_PASSWORD): %w", err)
	}
	return sv, nil
}

// sign pushes cosign's signature of the image d: the simple-signing
// payload (`cosign sign` writes the same) signed with the key, as a layer
// of the image cosign finds under the tag sha256-<hex>.sig. It returns that
// tag. No transparency log holds it: `cosign verify --key` needs
// --insecure-ignore-tlog=true.
func sign(sv signature.SignerVerifier, d name.Digest, opts []remote.Option) (name.Tag, error) {
	payload, err := (&sigpayload.Cosign{Image: d}).MarshalJSON()
	if err != nil {
		return name.Tag{}, fmt.Errorf("encoding the signature payload: %w", err)
	}
	sig, err := sv.SignMessage(bytes.NewReader(payload))
	if err != nil {
		return name.Tag{}, fmt.Errorf("signing %s: %w", d, err)
	}
	ociSig, err := ocistatic.NewSignature(payload, base64.StdEncoding.EncodeToString(sig))
	if err != nil {
		return name.Tag{}, fmt.Errorf("signing %s: %w", d, err)
	}
	return attach(sv, d, opts, ociremote.SignatureTag, func(se oci.SignedEntity, dd mutate.DupeDetector) (oci.SignedEntity, error) {
		return mutate.AttachSignatureToEntity(se, ociSig, mutate.WithDupeDetector(dd))
	}, ociremote.WriteSignatures)
}

// attest pushes the SBOM as a signed in-toto statement about the image d
// (predicate type https://spdx.dev/Document, in a DSSE envelope), under the
// tag sha256-<hex>.att as `cosign attest --type spdxjson` does, and returns
// that tag.
func attest(sv signature.SignerVerifier, d name.Digest, sbom []byte, opts []remote.Option) (name.Tag, error) {
	st, err := attestation.GenerateStatement(attestation.GenerateOpts{
		Predicate: bytes.NewReader(sbom), Type: "spdxjson", Digest: d.DigestStr()[len("sha256:"):], Repo: d.Repository.String(),
	})
	if err != nil {
		return name.Tag{}, fmt.Errorf("making the SBOM attestation: %w", err)
	}
	statement, err := st.MarshalJSON()
	if err != nil {
		return name.Tag{}, fmt.Errorf("making the SBOM attestation: %w", err)
	}
	envelope, err := dsse.WrapSigner(sv, ctypes.IntotoPayloadType).SignMessage(bytes.NewReader(statement))
	if err != nil {
		return name.Tag{}, fmt.Errorf("signing the SBOM attestation: %w", err)
	}
	att, err := ocistatic.NewAttestation(envelope, ocistatic.WithLayerMediaType(ctypes.DssePayloadType),
		ocistatic.WithAnnotations(map[string]string{"predicateType": spdxPredicateURI}))
	if err != nil {
		return name.Tag{}, fmt.Errorf("making the SBOM attestation: %w", err)
	}
	return attach(sv, d, opts, ociremote.AttestationTag, func(se oci.SignedEntity, dd mutate.DupeDetector) (oci.SignedEntity, error) {
		return mutate.AttachAttestationToEntity(se, att, mutate.WithDupeDetector(dd), mutate.WithReplaceOp(cremote.NewReplaceOp(spdxPredicateURI)))
	}, ociremote.WriteAttestations)
}

// attach adds what add makes to the signatures or attestations d already
// has in the registry (one verifying with the same key over the same
// payload is kept, not doubled: a second push adds nothing), writes them
// with write, and returns the tag they are under.
func attach(sv signature.SignerVerifier, d name.Digest, opts []remote.Option,
	tag func(name.Reference, ...ociremote.Option) (name.Tag, error),
	add func(oci.SignedEntity, mutate.DupeDetector) (oci.SignedEntity, error),
	write func(name.Repository, oci.SignedEntity, ...ociremote.Option) error,
) (name.Tag, error) {
	ropts := []ociremote.Option{ociremote.WithRemoteOptions(opts...)}
	se, err := add(ociremote.SignedUnknown(d, ropts...), cremote.NewDupeDetector(sv))
	if err != nil {
		return name.Tag{}, err
	}
	if err := write(d.Repository, se, ropts...); err != nil {
		return name.Tag{}, fmt.Errorf("pushing to %s: %w", d.Repository, err)
	}
	return tag(d, ropts...)
}
