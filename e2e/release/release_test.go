package release

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// registry is the README's placeholder: what `make push REGISTRY=...` and
// `--set nftmesh.image.repository=...` name.
const registry = "registry.example.com/mesh"

// TestVersionEverywhere cuts a release in a copy of this checkout with
// `make release`, then checks the five places at the release tag (all say
// vX.Y.Z) and on the development commit after it (all say
// vX.Y+1.0-dev.1.gHASH). The release is the version Chart.yaml says is in
// development (or the next patch, when the checkout is a release itself).
func TestVersionEverywhere(t *testing.T) {
	dir := copyCheckout(t)
	rel := nextRelease(t, dir)
	out := run(t, dir, nil, "make", "release", "VERSION="+rel)
	if !strings.Contains(out, "tagged "+rel+"\n") {
		t.Fatalf("make release VERSION=%s did not tag it:\n%s", rel, out)
	}
	branch := run(t, dir, nil, "git", "symbolic-ref", "--short", "HEAD")

	run(t, dir, nil, "git", "checkout", "-q", rel)
	chart := chartYAML(t, dir)
	if chart.Version != rel[1:] || chart.AppVersion != rel {
		t.Fatalf("Chart.yaml at %s: version %s, appVersion %s", rel, chart.Version, chart.AppVersion)
	}
	// The Done-when item: CHANGELOG.md names the chart's version.
	if log := readFile(t, dir, "CHANGELOG.md"); !regexp.MustCompile(`(?m)^## \[` + regexp.QuoteMeta(chart.Version) + `\] - \d{4}-\d{2}-\d{2}$`).MatchString(log) {
		t.Errorf("CHANGELOG.md at %s has no section ## [%s] - YYYY-MM-DD", rel, chart.Version)
	}
	if v := makeVar(t, dir, "version"); v != rel {
		t.Fatalf("make version at the tag %s = %s", rel, v)
	}
	release := agree(t, dir, rel)
	t.Logf("at the tag: %s everywhere; CNI VERSION %s", rel, release)
	if got := makeVar(t, dir, "image-tags"); got != rel {
		t.Errorf("make image-tags at %s = %q, want the release's tag alone", rel, got)
	}

	run(t, dir, nil, "git", "checkout", "-q", branch)
	dev := makeVar(t, dir, "version")
	app := chartYAML(t, dir).AppVersion
	if want := regexp.MustCompile(`^` + regexp.QuoteMeta(app) + `\.1\.g[0-9a-f]{7,}$`); !strings.HasSuffix(app, "-dev") || !want.MatchString(dev) {
		t.Fatalf("one commit after %s: make version = %s, Chart.yaml appVersion %s; want %s.1.gHASH", rel, dev, app, app)
	}
	development := agree(t, dir, dev)
	t.Logf("one commit later: %s everywhere, the in-tree chart's tag %s", dev, app)
	if got := makeVar(t, dir, "image-tags"); got != dev+" "+app {
		t.Errorf("make image-tags = %q, want %s and the in-tree chart's %s", got, dev, app)
	}
	// The CNI VERSION answer is the protocol's (cniVersion and
	// supportedVersions, per the CNI spec): the same from every build.
	if release != development {
		t.Errorf("CNI VERSION differs between %s (%s) and %s (%s)", rel, release, dev, development)
	}

	// Anything not committed makes it a dirty development build.
	if err := os.WriteFile(filepath.Join(dir, "scratch.txt"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if got := makeVar(t, dir, "version"); got != dev+".dirty" {
		t.Errorf("with an untracked file: make version = %s, want %s.dirty", got, dev)
	}
}

// agree builds the binaries and the chart as `make build` and `make chart`
// do, and checks that each place says version v: the agent, redirect, the
// plugin (--version and its about line), the image make names, the
// packaged chart's version and appVersion, and the image the in-tree
// chart and the packaged one run. It returns the plugin's CNI VERSION answer.
func agree(t *testing.T, dir, v string) string {
	t.Helper()
	dev := strings.Contains(v, "-dev.")
	if release := regexp.MustCompile(`^v\d+\.\d+\.\d+$`).MatchString(v); release == dev {
		t.Fatalf("version %s is neither vX.Y.Z nor a development version vX.Y.Z-dev.N.gHASH", v)
	}
	bin := t.TempDir()
	run(t, dir, nil, "make", "build", "BIN="+bin)
	toolchain := ` \(go[0-9.]+\S* linux/[a-z0-9]+\)$`
	for _, c := range []struct {
		args []string
		env  []string
		want string
	}{
		{[]string{"nftmesh-agent", "--version"}, nil, `^nftmesh-agent ` + regexp.QuoteMeta(v) + toolchain},
		{[]string{"redirect", "version"}, nil, `^redirect version ` + regexp.QuoteMeta(v) + toolchain},
		{[]string{"nftmesh-cni", "--version"}, nil, `^nftmesh-cni ` + regexp.QuoteMeta(v) + toolchain},
		{[]string{"nftmesh-cni-standalone", "--version"}, nil, `^nftmesh-cni ` + regexp.QuoteMeta(v) + toolchain},
		// The about line, on stderr, when a person runs the plugin.
		{[]string{"nftmesh-cni"}, []string{}, `(?m)^nftmesh-cni ` + regexp.QuoteMeta(v) + `: chained CNI plugin`},
	} {
		got := run(t, dir, c.env, append([]string{filepath.Join(bin, c.args[0])}, c.args[1:]...)...)
		if !regexp.MustCompile(c.want).MatchString(got) {
			t.Errorf("%s: %q, want %s", strings.Join(c.args, " "), got, c.want)
		}
	}
	cniVersion := run(t, dir, []string{"CNI_COMMAND=VERSION"}, filepath.Join(bin, "nftmesh-cni"))
	var answer struct {
		CNIVersion string   `json:"cniVersion"`
		Supported  []string `json:"supportedVersions"`
	}
	if err := json.Unmarshal([]byte(cniVersion), &answer); err != nil || answer.CNIVersion == "" || len(answer.Supported) == 0 {
		t.Errorf("CNI VERSION: %q (%v)", cniVersion, err)
	}

	ref := registry + "/nftmesh:" + v
	if got := makeVar(t, dir, "image-ref", "REGISTRY="+registry); got != ref {
		t.Errorf("make image-ref REGISTRY=%s = %s, want %s", registry, got, ref)
	}
	tags := strings.Fields(makeVar(t, dir, "image-tags"))
	if len(tags) == 0 || tags[0] != v {
		t.Errorf("make image-tags = %v, want %s first", tags, v)
	}

	run(t, dir, nil, "make", "chart", "BIN="+bin)
	pkg := filepath.Join(bin, "nftmesh-"+v[1:]+".tgz")
	var shown struct{ Version, AppVersion string }
	if err := yaml.Unmarshal([]byte(run(t, dir, nil, helm(t), "show", "chart", pkg)), &shown); err != nil {
		t.Fatal(err)
	}
	if shown.Version != v[1:] || shown.AppVersion != v {
		t.Errorf("helm show chart %s: version %s, appVersion %s; want %s and %s", pkg, shown.Version, shown.AppVersion, v[1:], v)
	}
	// The README's two installs: the in-tree chart with only the image's
	// repository set runs a tag make push pushes; the pushed chart runs
	// make image-ref's.
	set := "nftmesh.image.repository=" + registry + "/nftmesh"
	if img := renderedImage(t, dir, filepath.Join(dir, "charts", "nftmesh"), set); !slices.Contains(tags, strings.TrimPrefix(img, registry+"/nftmesh:")) {
		t.Errorf("the in-tree chart runs %s, which is not among the tags make push pushes (%v)", img, tags)
	}
	if img := renderedImage(t, dir, pkg, set); img != ref {
		t.Errorf("the packaged chart runs %s, want %s", img, ref)
	}
	if img := renderedImage(t, dir, pkg); img != "ghcr.io/nftmesh/nftmesh:"+v {
		t.Errorf("the packaged chart with no values runs %s, want ghcr.io/nftmesh/nftmesh:%s", img, v)
	}
	return cniVersion
}

var imageLine = regexp.MustCompile(`(?m)^\s+image: "?([^"\s]+)"?$`)

// renderedImage is the image helm template gives the agent's DaemonSet.
func renderedImage(t *testing.T, dir, chart string, set ...string) string {
	t.Helper()
	args := []string{"template", "nftmesh", chart, "--namespace", "nftmesh-system"}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	m := imageLine.FindAllStringSubmatch(run(t, dir, nil, append([]string{helm(t)}, args...)...), -1)
	if len(m) != 1 {
		t.Fatalf("helm %s: %d image lines, want the agent's one", strings.Join(args, " "), len(m))
	}
	return m[0][1]
}

// nextRelease is the release to cut in the copy: Chart.yaml's X.Y.Z-dev
// as vX.Y.Z, or, in a checkout of a release X.Y.Z, vX.Y.Z+1 with an entry
// under Unreleased (committed), since a release needs one.
func nextRelease(t *testing.T, dir string) string {
	t.Helper()
	v := chartYAML(t, dir).Version
	if base, ok := strings.CutSuffix(v, "-dev"); ok {
		return "v" + base
	}
	var x, y, z int
	if _, err := fmt.Sscanf(v, "%d.%d.%d", &x, &y, &z); err != nil {
		t.Fatalf("Chart.yaml version %q: %v", v, err)
	}
	log := readFile(t, dir, "CHANGELOG.md")
	log = strings.Replace(log, "## [Unreleased]\n", "## [Unreleased]\n\n- A change for the test.\n", 1)
	if err := os.WriteFile(filepath.Join(dir, "CHANGELOG.md"), []byte(log), 0o644); err != nil {
		t.Fatal(err)
	}
	run(t, dir, nil, "git", "commit", "-q", "-am", "a change")
	return fmt.Sprintf("v%d.%d.%d", x, y, z+1)
}

// TestChartAndChangelogAgree: this checkout's Chart.yaml and CHANGELOG.md
// tell one story, as the release tool reads them: at a release X.Y.Z,
// CHANGELOG.md's newest section is [X.Y.Z] (it names the chart's version);
// between releases, X.Y.Z-dev is newer than every release in it.
func TestChartAndChangelogAgree(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	t.Log(run(t, root, nil, "go", "-C", filepath.Join(root, "tools", "release"), "run", ".", "check", "--repo", root))
}
