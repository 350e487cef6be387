package imagebuild

import (
	"bytes"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	spdxjson "github.com/spdx/tools-golang/json"
	"github.com/spdx/tools-golang/spdx"
	"github.com/spdx/tools-golang/spdxlib"
)

// goVersionM is what `go version -m` (the go tool, a reader of build info
// independent of this package) says a binary links: module path → version.
func goVersionM(t *testing.T, file string) map[string]string {
	t.Helper()
	goBin := os.Getenv("GO")
	if goBin == "" {
		goBin = "go"
	}
	out, err := exec.Command(goBin, "version", "-m", file).Output()
	if err != nil {
		t.Fatalf("go version -m %s: %v", file, err)
	}
	mods := map[string]string{}
	last := ""
	for _, l := range strings.Split(string(out), "\n") {
		f := strings.Fields(l)
		switch {
		case len(f) >= 3 && f[0] == "dep":
			mods[f[1]], last = f[2], f[1]
		case len(f) >= 3 && f[0] == "=>": // what the dep before was replaced with
			delete(mods, last)
			mods[f[1]] = f[2]
		}
	}
	if len(mods) == 0 {
		t.Fatalf("go version -m %s lists no modules:\n%s", file, out)
	}
	return mods
}

// goBinary builds one of this module's commands: a real Go binary, whose
// build info lists the modules it links (a test binary's lists none).
func goBinary(t *testing.T, pkg string) string {
	t.Helper()
	goBin := os.Getenv("GO")
	if goBin == "" {
		goBin = "go"
	}
	out := filepath.Join(t.TempDir(), filepath.Base(pkg))
	cmd := exec.Command(goBin, "build", "-trimpath", "-o", out, pkg)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, b)
	}
	return out
}

// The SBOM of a real Go binary (one of this module's commands):
// every module `go version -m` lists is a package at its version with
// its purl, a dependency of each binary; the document is valid SPDX, the
// image package is the index with its digest, it holds the binaries with
// their checksums, and the same input gives the same bytes.
func TestSBOMListsEveryModule(t *testing.T) {
	exe := goBinary(t, "./fileimage")
	data, err := os.ReadFile(exe)
	if err != nil {
		t.Fatal(err)
	}
	bins := map[string]Binaries{"amd64": {data, data, data, data}, "arm64": {data, data, data, data}}
	meta := Meta{Version: "v0.3.0+build.1", Created: time.Unix(1700000000, 0)}
	index := v1.Hash{Algorithm: "sha256", Hex: strings.Repeat("ab", 32)}
	out, err := SBOM(bins, meta, "registry.example.com/mesh/nftmesh", index)
	if err != nil {
		t.Fatal(err)
	}
	again, _ := SBOM(bins, meta, "registry.example.com/mesh/nftmesh", index)
	if !bytes.Equal(out, again) {
		t.Error("two SBOMs of the same input differ")
	}
	doc, err := spdxjson.Read(bytes.NewReader(out))
	if err != nil {
		t.Fatal(err)
	}
	if err := spdxlib.ValidateDocument(doc); err != nil {
		t.Errorf("not valid SPDX: %v", err)
	}
	if doc.SPDXVersion != "SPDX-2.3" || doc.CreationInfo.Created != "2023-11-14T22:13:20Z" ||
		doc.DocumentNamespace != DefaultSource+"/spdx/v0.3.0+build.1/"+index.Hex {
		t.Errorf("document %s, created %s, namespace %s", doc.SPDXVersion, doc.CreationInfo.Created, doc.DocumentNamespace)
	}
	byID := map[string]*spdx.Package{}
	byPURL := map[string]*spdx.Package{}
	for _, p := range doc.Packages {
		byID[string(p.PackageSPDXIdentifier)] = p
		for _, r := range p.PackageExternalReferences {
			byPURL[r.Locator] = p
		}
	}
	img := byID["Image"]
	if img == nil || img.PrimaryPackagePurpose != "CONTAINER" || img.PackageChecksums[0].Value != index.Hex ||
		byPURL["pkg:oci/nftmesh@sha256%3A"+index.Hex+"?repository_url=registry.example.com/mesh/nftmesh&tag=v0.3.0%2Bbuild.1"] != img {
		t.Errorf("the image package %+v", img)
	}
	sum := sha256.Sum256(data)
	contains, deps := relationships(doc)
	var bin []string
	for id, p := range byID {
		if p.PrimaryPackagePurpose == "APPLICATION" {
			bin = append(bin, id)
			if p.PackageChecksums[0].Value != hex.EncodeToString(sum[:]) || !contains[id] {
				t.Errorf("binary %s: checksum %v, in the image %v", id, p.PackageChecksums, contains[id])
			}
		}
	}
	if len(bin) != 8 {
		t.Errorf("binaries %v, want four per platform", bin)
	}
	for path, version := range goVersionM(t, exe) {
		purl := goPURL(moduleOf(path, version))
		p := byPURL[purl]
		if p == nil || p.PackageName != path || p.PackageVersion != version {
			t.Errorf("go version -m lists %s %s; the SBOM has %+v (purl %s)", path, version, p, purl)
			continue
		}
		for _, b := range bin {
			if !deps[b][string(p.PackageSPDXIdentifier)] {
				t.Errorf("%s does not depend on %s", b, p.PackageSPDXIdentifier)
			}
		}
	}
	if len(out) > 1<<20 {
		t.Errorf("an SBOM of %d bytes", len(out))
	}
}

// relationships are which packages the image contains, and what each
// package depends on.
func relationships(doc *spdx.Document) (contains map[string]bool, deps map[string]map[string]bool) {
	contains, deps = map[string]bool{}, map[string]map[string]bool{}
	for _, r := range doc.Relationships {
		a, b := string(r.RefA.ElementRefID), string(r.RefB.ElementRefID)
		switch r.Relationship {
		case "CONTAINS":
			contains[b] = a == "Image"
		case "DEPENDS_ON":
			if deps[a] == nil {
				deps[a] = map[string]bool{}
			}
			deps[a][b] = true
		}
	}
	return contains, deps
}

func moduleOf(path, version string) debug.Module { return debug.Module{Path: path, Version: version} }

func TestSBOMRefuses(t *testing.T) {
	notGo := map[string]Binaries{"amd64": fakeBins(t, elf.EM_X86_64, "")}
	index := v1.Hash{Algorithm: "sha256", Hex: strings.Repeat("ab", 32)}
	for _, tc := range []struct {
		name string
		bins map[string]Binaries
		meta Meta
		repo string
		want string
	}{
		{"not a Go binary", notGo, Meta{Version: "v1"}, "ghcr.io/nftmesh/nftmesh", "the build info of linux/amd64 " + AgentPath},
		{"no version", notGo, Meta{}, "ghcr.io/nftmesh/nftmesh", "the version is empty"},
		{"bad repository", notGo, Meta{Version: "v1"}, "UPPER/" + strings.Repeat("x", 300), `the repository "UPPER/xxx`},
	} {
		_, err := SBOM(tc.bins, tc.meta, tc.repo, index)
		if err == nil || !strings.Contains(err.Error(), tc.want) || len(err.Error()) > 400 {
			t.Errorf("%s: %v, want an error with %q", tc.name, err, tc.want)
		}
	}
}
