package charts

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// `make chart VERSION=...` packages the chart with that appVersion, and the
// DaemonSet then runs the image of the same version unless nftmesh.image.tag says
// otherwise: `make image` and `make chart` from one checkout fit together.
func TestMakeChartStampsTheVersion(t *testing.T) {
	helmBin := helm(t)
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make is not installed")
	}
	const version = "v9.8.7-chart-test"
	bin := t.TempDir()
	out, err := exec.Command("make", "-C", "..", "chart", "BIN="+bin, "VERSION="+version, "HELM="+helmBin).CombinedOutput()
	if err != nil {
		t.Fatalf("make chart: %v\n%s", err, out)
	}
	pkgs, _ := filepath.Glob(filepath.Join(bin, "nftmesh-*.tgz"))
	if len(pkgs) != 1 {
		t.Fatalf("make chart wrote %v, want one nftmesh-<version>.tgz\n%s", pkgs, out)
	}

	meta, err := runHelm(t, "show", "chart", pkgs[0])
	if err != nil {
		t.Fatal(err)
	}
	// The chart's version follows the release's.
	if !strings.Contains(meta, "appVersion: "+version) || !strings.Contains(meta, "\nversion: 9.8.7-chart-test") ||
		filepath.Base(pkgs[0]) != "nftmesh-9.8.7-chart-test.tgz" {
		t.Errorf("packaged %s: Chart.yaml has no appVersion %s and version 9.8.7-chart-test:\n%s", pkgs[0], version, meta)
	}
	// The default image is the one `make image` tags for that version.
	ref, err := exec.Command("make", "-s", "-C", "..", "image-ref", "VERSION="+version).Output()
	if err != nil {
		t.Fatal(err)
	}
	if want := `image: "` + strings.TrimSpace(string(ref)) + `"`; !strings.Contains(mustTemplate(t, pkgs[0]), want) {
		t.Errorf("the chart's default image is not make image's: no %s", want)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, `image: "ghcr.io/nftmesh/nftmesh:` + version + `"`},
		// Istio's hub and tag never pick nftmesh's image.
		{[]string{"--set", "hub=docker.io/istio", "--set", "global.tag=1.27.1"}, `image: "ghcr.io/nftmesh/nftmesh:` + version + `"`},
		{[]string{"--set", "nftmesh.image.repository=localhost/nftmesh"}, `image: "localhost/nftmesh:` + version + `"`},
		{[]string{"--set", "nftmesh.image.tag=v1.0.0"}, `image: "ghcr.io/nftmesh/nftmesh:v1.0.0"`},
	} {
		out, err := runHelm(t, append([]string{"template", "nftmesh", pkgs[0], "--namespace", "nftmesh-system"}, tc.args...)...)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out, tc.want) {
			t.Errorf("helm template %v: no %s", tc.args, tc.want)
		}
		if !strings.Contains(out, `app.kubernetes.io/version: "`+version+`"`) {
			t.Errorf("helm template %v: objects not labelled with version %s", tc.args, version)
		}
	}
}

func mustTemplate(t *testing.T, chart string) string {
	t.Helper()
	out, err := runHelm(t, "template", "nftmesh", chart, "--namespace", "nftmesh-system")
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// A VERSION that is not SemVer (a bare commit, before the first tag) still
// gives Helm a chart version.
func TestChartVersionOfAnyVersion(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make is not installed")
	}
	for v, want := range map[string]string{"v0.2.0": "0.2.0", "v0.2.0-3-gabc1234-dirty": "0.2.0-3-gabc1234-dirty", "8c34896": "0.0.0-8c34896", "8c34896-dirty": "0.0.0-8c34896-dirty"} {
		out, err := exec.Command("make", "-s", "-C", "..", "chart-version", "VERSION="+v).Output()
		if err != nil || strings.TrimSpace(string(out)) != want {
			t.Errorf("VERSION=%s: chart version %q (%v), want %s", v, out, err, want)
		}
	}
}
