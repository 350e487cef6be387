package imagebuild

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"debug/buildinfo"
	"encoding/hex"
	"fmt"
	"maps"
	"net/url"
	"regexp"
	"runtime/debug"
	"slices"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/spdx/tools-golang/json"
	"github.com/spdx/tools-golang/spdx"
	"github.com/spdx/tools-golang/spdx/v2/common"
)

// SBOMMediaType is the SBOM's media type (an SPDX 2.3 JSON document), as
// the artifact type of its OCI referrer.
const SBOMMediaType = "application/spdx+json"

// noAssertion is SPDX's "we do not say" for a field it requires.
const noAssertion = "NOASSERTION"

// program is one binary of the image.
type program struct {
	name, path string
	data       []byte
}

func (b Binaries) list() []program {
	return []program{
		{"nftmesh-agent", AgentPath, b.Agent},
		{"nftmesh-cni", PluginPath, b.Plugin},
		{"nftmesh-cni-standalone", StandalonePath, b.Standalone},
		{"redirect", RedirectPath, b.Redirect},
	}
}

// sbom collects the document's packages and relationships, each package
// once however many binaries link it.
type sbom struct {
	doc *spdx.Document
	ids map[string]common.ElementID // by package key (purl)
}

// SBOM returns the SPDX 2.3 JSON document of the nftmesh image index
// (digest index, pushed to repo): the index as a container package that
// contains each platform's four binaries, and each binary's Go modules
// (the main module at meta.Version, every dependency at the version it
// was built with, the standard library at the toolchain's), read from the
// build info the Go linker embeds in every binary (debug/buildinfo). It is
// a function of its inputs: the same binaries and meta give the same
// bytes.
func SBOM(bins map[string]Binaries, meta Meta, repo string, index v1.Hash) ([]byte, error) {
	if meta.Version == "" {
		return nil, fmt.Errorf("writing the SBOM: the version is empty")
	}
	r, err := name.NewRepository(repo)
	if err != nil {
		return nil, RefError("writing the SBOM: the repository", repo, err)
	}
	s := &sbom{ids: map[string]common.ElementID{}, doc: &spdx.Document{
		SPDXVersion:       spdx.Version,
		DataLicense:       spdx.DataLicense,
		SPDXIdentifier:    "DOCUMENT",
		DocumentName:      r.RepositoryStr() + "-" + meta.Version,
		DocumentNamespace: cmp.Or(meta.Source, DefaultSource) + "/spdx/" + url.PathEscape(meta.Version) + "/" + index.Hex,
		CreationInfo: &spdx.CreationInfo{
			Creators: []common.Creator{{CreatorType: "Tool", Creator: "nftmesh-mkimage-" + meta.Version}},
			Created:  fixedTime(meta.Created).Format("2006-01-02T15:04:05Z"),
		},
	}}
	image := s.add("Image", &spdx.Package{
		PackageName:               r.Name(),
		PackageVersion:            meta.Version,
		PackageDownloadLocation:   noAssertion,
		PackageChecksums:          []common.Checksum{{Algorithm: common.SHA256, Value: index.Hex}},
		PackageLicenseDeclared:    "Apache-2.0",
		PrimaryPackagePurpose:     "CONTAINER",
		PackageExternalReferences: []*spdx.PackageExternalReference{purlRef(ociPURL(r, index, meta.Version))},
	})
	s.relate("DOCUMENT", image, spdx.RelationshipDescribes)
	for _, arch := range slices.Sorted(maps.Keys(bins)) {
		for _, b := range bins[arch].list() {
			if err := s.addBinary(image, arch, b, meta); err != nil {
				return nil, err
			}
		}
	}
	var buf bytes.Buffer
	if err := json.Write(s.doc, &buf, json.Indent("  ")); err != nil {
		return nil, fmt.Errorf("writing the SBOM: %w", err)
	}
	return buf.Bytes(), nil
}

func (s *sbom) addBinary(image common.ElementID, arch string, b program, meta Meta) error {
	bi, err := buildinfo.Read(bytes.NewReader(b.data))
	if err != nil {
		return fmt.Errorf("writing the SBOM: the build info of linux/%s %s: %w", arch, b.path, err)
	}
	sum := sha256.Sum256(b.data)
	var settings []string
	for _, kv := range bi.Settings {
		settings = append(settings, kv.Key+"="+kv.Value)
	}
	main := module(bi.Main)
	main.Version = meta.Version // the stamp: the build has no VCS version (-buildvcs=false)
	sub := strings.TrimPrefix(strings.TrimPrefix(bi.Path, main.Path), "/")
	id := s.add(fmt.Sprintf("Binary-linux-%s-%s", arch, b.name), &spdx.Package{
		PackageName:             b.name,
		PackageVersion:          meta.Version,
		PackageFileName:         b.path,
		PackageDownloadLocation: noAssertion,
		PackageChecksums:        []common.Checksum{{Algorithm: common.SHA256, Value: hex.EncodeToString(sum[:])}},
		PrimaryPackagePurpose:   "APPLICATION",
		PackageComment:          fmt.Sprintf("linux/%s, %s, built with %s: %s", arch, bi.Path, bi.GoVersion, strings.Join(settings, " ")),
		PackageExternalReferences: []*spdx.PackageExternalReference{purlRef(
			goPURL(main) + "?goarch=" + arch + "&goos=linux#" + sub)},
	})
	s.relate(image, id, spdx.RelationshipContains)
	s.relate(id, s.addModule(main, "SOURCE"), spdx.RelationshipGeneratedFrom)
	s.relate(id, s.addModule(debug.Module{Path: "stdlib", Version: bi.GoVersion}, "LIBRARY"), spdx.RelationshipDependsOn)
	for _, d := range bi.Deps {
		s.relate(id, s.addModule(module(*d), "LIBRARY"), spdx.RelationshipDependsOn)
	}
	return nil
}

// module is what was compiled: a replaced module's replacement.
func module(m debug.Module) debug.Module {
	if m.Replace != nil {
		return *m.Replace
	}
	return m
}

// ociPURL is the package URL of the index in repo r (purl's oci type: the
// digest is the version, the repository a qualifier).
func ociPURL(r name.Repository, index v1.Hash, tag string) string {
	repo := r.RepositoryStr()
	return "pkg:oci/" + repo[strings.LastIndex(repo, "/")+1:] + "@" + url.QueryEscape(index.String()) +
		"?repository_url=" + r.Name() + "&tag=" + url.QueryEscape(tag)
}

// goPURL is the package URL of a Go module (purl's golang type).
func goPURL(m debug.Module) string {
	return "pkg:golang/" + m.Path + "@" + url.QueryEscape(m.Version)
}

func purlRef(purl string) *spdx.PackageExternalReference {
	return &spdx.PackageExternalReference{Category: common.CategoryPackageManager, RefType: common.TypePackageManagerPURL, Locator: purl}
}

// addModule adds the package of a Go module (the standard library as
// "stdlib") once, and returns its ID.
func (s *sbom) addModule(m debug.Module, purpose string) common.ElementID {
	purl := goPURL(m)
	if id, ok := s.ids[purl]; ok {
		return id
	}
	p := &spdx.Package{
		PackageName:               m.Path,
		PackageVersion:            m.Version,
		PackageDownloadLocation:   noAssertion,
		PrimaryPackagePurpose:     "LIBRARY",
		PackageExternalReferences: []*spdx.PackageExternalReference{purlRef(purl)},
	}
	if m.Sum != "" {
		p.PackageComment = "go.sum " + m.Sum
	}
	id := s.add("Module-"+m.Path+"-"+m.Version, p)
	s.ids[purl] = id
	return id
}

// notID is what SPDX IDs may not hold (they are [A-Za-z0-9.-]+).
var notID = regexp.MustCompile(`[^A-Za-z0-9.-]+`)

// add appends p under an ID made of id, unique in the document.
func (s *sbom) add(id string, p *spdx.Package) common.ElementID {
	base := notID.ReplaceAllString(id, "-")
	eid := common.ElementID(base)
	for n := 2; slices.ContainsFunc(s.doc.Packages, func(q *spdx.Package) bool { return q.PackageSPDXIdentifier == eid }); n++ {
		eid = common.ElementID(fmt.Sprintf("%s-%d", base, n))
	}
	p.PackageSPDXIdentifier = eid
	p.FilesAnalyzed, p.IsFilesAnalyzedTagPresent = false, true
	p.PackageCopyrightText = cmp.Or(p.PackageCopyrightText, noAssertion)
	p.PackageLicenseConcluded = cmp.Or(p.PackageLicenseConcluded, noAssertion)
	p.PackageLicenseDeclared = cmp.Or(p.PackageLicenseDeclared, noAssertion)
	s.doc.Packages = append(s.doc.Packages, p)
	return eid
}

func (s *sbom) relate(a, b common.ElementID, kind string) {
	s.doc.Relationships = append(s.doc.Relationships, &spdx.Relationship{
		RefA: common.MakeDocElementID("", string(a)), RefB: common.MakeDocElementID("", string(b)), Relationship: kind,
	})
}
