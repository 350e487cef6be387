package istiotest

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/nftmesh/nftmesh/testkit/golden"
)

// TestModuleVersionPinned: the constant the tests report is the version
// the tools module builds.
func TestModuleVersionPinned(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(RepoRoot(), "testkit", "istiotest", "istio", "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) >= 3 && f[0] == "require" {
			f = f[1:]
		}
		if len(f) >= 2 && f[0] == "istio.io/istio" {
			if v := f[1]; v != ModuleVersion {
				t.Errorf("tools module requires istio.io/istio %s, ModuleVersion is %s", v, ModuleVersion)
			}
			return
		}
	}
	t.Error("tools module does not require istio.io/istio")
}

func istioctl(t *testing.T, args ...string) []byte {
	t.Helper()
	bin, err := Istioctl()
	if err != nil {
		t.Skip(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	// istioctl must not find a cluster: everything here is offline.
	cmd.Env = append(os.Environ(), "KUBECONFIG="+filepath.Join(t.TempDir(), "none"), "HOME="+t.TempDir())
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("istioctl %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return out
}

// TestIstioInjectGolden regenerates testdata/istio with Istio's own
// injector and fails on any difference (UPDATE_GOLDEN=1, or `make
// istio-manifests`, rewrites it). Inputs: operator.yaml (the installation)
// and in/*.yaml (un-injected workloads). Outputs: config/ (the injector's
// template, values and mesh config, as istiod's ConfigMaps hold them) and
// injected/*.yaml (what `istioctl kube-inject` wrote). The exact commands
// are in testdata/istio/README.md.
func TestIstioInjectGolden(t *testing.T) {
	if testing.Short() {
		t.Skip("runs istioctl (-short)")
	}
	dir := TestdataDir()
	if v := strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(string(istioctl(t, "version", "--remote=false", "--short"))), "client version:")); v != BinaryVersion {
		t.Fatalf("istioctl reports version %q, want %q: a stale build? delete .cache/istioctl and run `make istio`", v, BinaryVersion)
	}

	// 1. The injection config of this istioctl's own charts, rendered offline.
	rendered := istioctl(t, "manifest", "generate", "-f", filepath.Join(dir, "operator.yaml"))
	objs, err := SplitManifests(rendered)
	if err != nil {
		t.Fatal(err)
	}
	data := map[string]map[string]string{}
	for _, o := range objs {
		if o.Kind != "ConfigMap" {
			continue
		}
		var cm corev1.ConfigMap
		if err := yaml.Unmarshal(o.Raw, &cm); err != nil {
			t.Fatal(err)
		}
		data[cm.Name] = cm.Data
	}
	config := map[string]string{
		"inject-config.yaml": data["istio-sidecar-injector"]["config"],
		"values.json":        data["istio-sidecar-injector"]["values"],
		"mesh.yaml":          data["istio"]["mesh"],
	}
	tmp := t.TempDir()
	for name, content := range config {
		if content == "" {
			t.Fatalf("istioctl manifest generate rendered no %s (ConfigMaps found: %v)", name, keys(data))
		}
		if !strings.HasSuffix(content, "\n") {
			content += "\n"
		}
		golden.Check(t, filepath.Join("istio", "config", name), content)
		if err := os.WriteFile(filepath.Join(tmp, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}

	// 2. Each workload through the injector.
	inputs, err := filepath.Glob(filepath.Join(dir, "in", "*.yaml"))
	if err != nil || len(inputs) == 0 {
		t.Fatalf("no inputs in %s/in: %v", dir, err)
	}
	for _, in := range inputs {
		name := filepath.Base(in)
		out := istioctl(t, InjectArgs(tmp, in)...)
		golden.Check(t, filepath.Join("istio", "injected", name), string(out))
	}

	// 3. Nothing stale: every injected file has an input.
	if os.Getenv("UPDATE_GOLDEN") != "1" {
		outs, _ := filepath.Glob(filepath.Join(dir, "injected", "*.yaml"))
		if len(outs) != len(inputs) {
			t.Errorf("testdata/istio/injected has %d files for %d inputs: remove the stale ones", len(outs), len(inputs))
		}
	}
}

// InjectArgs are the istioctl arguments that inject the workloads in file
// with the injection config in configDir (inject-config.yaml, values.json,
// mesh.yaml): Istio's injector, offline, for the default revision.
func InjectArgs(configDir, file string) []string {
	return []string{"kube-inject", "--revision", "default",
		"--injectConfigFile", filepath.Join(configDir, "inject-config.yaml"),
		"--valuesFile", filepath.Join(configDir, "values.json"),
		"--meshConfigFile", filepath.Join(configDir, "mesh.yaml"),
		"-f", file}
}

func keys(m map[string]map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
