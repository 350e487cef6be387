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
	if !strings.Contains(meta, "appVersion: "+version) {
		t.Errorf("packaged Chart.yaml has no appVersion %s:\n%s", version, meta)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, `image: "ghcr.io/nftmesh/nftmesh:` + version + `"`},
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
