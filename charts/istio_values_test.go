package charts

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/rs/zerolog"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/yaml"

	"github.com/nftmesh/nftmesh/installer"
	"github.com/nftmesh/nftmesh/installer/repair"
)

func (r *rendered) agentConfig(t *testing.T) *installer.Config {
	t.Helper()
	env := r.agentEnv(t)
	cfg, err := installer.ParseConfig(nil, func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	if err != nil {
		t.Fatalf("the agent rejects the chart's config: %v", err)
	}
	return cfg
}

func pullSecretNames(refs []corev1.LocalObjectReference) []string {
	var out []string
	for _, r := range refs {
		out = append(out, r.Name)
	}
	return out
}

// A values file written for Istio's istio-cni chart, with its value names,
// renders, and every value in it takes effect.
func TestIstioValuesFileTakesEffect(t *testing.T) {
	file := filepath.Join("testdata", "istio-cni-values.yaml")
	if out, err := runHelm(t, "lint", "--strict", chartDir, "-f", file); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	r := render(t, "-f", file)
	ds := r.ds(t)
	pod := ds.Spec.Template
	c := pod.Spec.Containers[0]

	// Istio's hub, image, tag and variant name Istio's image: nftmesh's
	// default runs, and they are listed as ignored. pullPolicy is read.
	if c.Image != defaultImage || c.ImagePullPolicy != corev1.PullAlways {
		t.Errorf("image %s policy %s, want %s Always", c.Image, c.ImagePullPolicy, defaultImage)
	}
	if got := ds.Annotations["nftmesh.io/ignored-values"]; !strings.Contains(got, "hub, image, tag, variant (Istio's install-cni image") {
		t.Errorf("ignored values %q", got)
	}
	// global.imagePullSecrets (Istio's list of names): on the pod and its
	// ServiceAccount.
	if got := pullSecretNames(pod.Spec.ImagePullSecrets); !slices.Equal(got, []string{"regcred"}) {
		t.Errorf("pod pull secrets %v", got)
	}
	if got := pullSecretNames(r.SA[0].ImagePullSecrets); !slices.Equal(got, []string{"regcred"}) {
		t.Errorf("service account pull secrets %v", got)
	}

	cfg := r.agentConfig(t)
	// logging.level in Istio's scope form: the most verbose scope wins, for
	// the agent and the plugin.
	if cfg.LogLevel != zerolog.DebugLevel || *cfg.PluginConf().LogLevel != "debug" {
		t.Errorf("log level %v / plugin %s, want debug", cfg.LogLevel, *cfg.PluginConf().LogLevel)
	}
	// global.logAsJson=false: plain-text lines.
	if cfg.LogFormat != "text" {
		t.Errorf("log format %s, want text", cfg.LogFormat)
	}
	// global.nativeNftables: the nftables backend (and no NET_RAW for the
	// iptables-legacy one).
	if cfg.Backend != "nftables" {
		t.Errorf("backend %s, want nftables", cfg.Backend)
	}
	// The dirs and file, chained, excludeNamespaces, repair.*.
	if hostPath(ds, "cni-bin-dir") != "/usr/libexec/cni" || hostPath(ds, "cni-conf-dir") != "/etc/kubernetes/cni/net.d" ||
		cfg.CNIConfFileName != "10-calico.conflist" || !cfg.Chained || !slices.Equal(cfg.ExcludeNamespaces, []string{"kube-system", "istio-system"}) {
		t.Errorf("dirs %s %s, agent %+v", hostPath(ds, "cni-bin-dir"), hostPath(ds, "cni-conf-dir"), cfg)
	}
	if cfg.Repair.Mode() != repair.Delete || cfg.Repair.InitContainerName != "istio-validation" || cfg.Repair.BrokenPodLabelKey != "cni.istio.io/uninitialized" {
		t.Errorf("repair %+v", cfg.Repair)
	}

	sc := c.SecurityContext
	// seccompProfile as given.
	if sp := sc.SeccompProfile; sp == nil || sp.Type != corev1.SeccompProfileTypeLocalhost || sp.LocalhostProfile == nil || *sp.LocalhostProfile != "profiles/cni.json" {
		t.Errorf("seccomp %+v", sc.SeccompProfile)
	}
	// seLinuxOptions.
	if so := sc.SELinuxOptions; so == nil || so.Type != "spc_t" || so.Level != "s0" {
		t.Errorf("SELinux %+v", sc.SELinuxOptions)
	}
	// useAppArmorAnnotation=false: the securityContext field, no annotation.
	if ap := sc.AppArmorProfile; ap == nil || ap.Type != corev1.AppArmorProfileTypeUnconfined {
		t.Errorf("AppArmor profile %+v", sc.AppArmorProfile)
	}
	if _, ok := pod.Annotations["container.apparmor.security.beta.kubernetes.io/agent"]; ok {
		t.Error("AppArmor annotation with useAppArmorAnnotation=false")
	}
	// resources, and GOMEMLIMIT from the memory limit.
	if got := c.Resources.Requests[corev1.ResourceCPU]; got.Cmp(resource.MustParse("50m")) != 0 {
		t.Errorf("cpu request %v", got.String())
	}
	if got := c.Resources.Limits[corev1.ResourceMemory]; got.Cmp(resource.MustParse("256Mi")) != 0 {
		t.Errorf("memory limit %v", got.String())
	}
	// resourceQuotas.{enabled,pods}.
	checkQuota(t, r, "64")
	// global.networkPolicy.enabled: scrapes of the metrics port from the
	// default scraper namespace in (the node's probes need no rule),
	// everything out.
	if len(r.NetworkPolicies) != 1 {
		t.Fatalf("%d NetworkPolicies", len(r.NetworkPolicies))
	}
	np := r.NetworkPolicies[0]
	if got := ingressPorts(np); !slices.Equal(got, []string{"15014 from [ns{kubernetes.io/metadata.name=monitoring}]"}) || len(np.Spec.Egress) != 1 || np.Spec.PodSelector.MatchLabels["app.kubernetes.io/name"] != "nftmesh-agent" {
		t.Errorf("network policy ingress %q, spec %+v", got, np.Spec)
	}
	// affinity, labels, annotations, tolerations, update strategy, grace.
	if a := pod.Spec.Affinity; a == nil || a.NodeAffinity == nil || a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms[0].MatchExpressions[0].Key != "mesh" {
		t.Errorf("affinity %+v", pod.Spec.Affinity)
	}
	if ds.Labels["team"] != "platform" || pod.Labels["tier"] != "node" || pod.Annotations["example.com/owner"] != "platform" {
		t.Errorf("labels %v / %v, annotations %v", ds.Labels, pod.Labels, pod.Annotations)
	}
	if len(pod.Spec.Tolerations) != 1 || pod.Spec.Tolerations[0].Key != "dedicated" {
		t.Errorf("tolerations %+v", pod.Spec.Tolerations)
	}
	if ru := ds.Spec.UpdateStrategy.RollingUpdate; ru == nil || ru.MaxUnavailable.IntVal != 3 {
		t.Errorf("update strategy %+v", ds.Spec.UpdateStrategy)
	}
	if g := pod.Spec.TerminationGracePeriodSeconds; g == nil || *g != 45 {
		t.Errorf("termination grace %v", g)
	}
	// revision and ownerName: Istio's labels on every object.
	for _, o := range []map[string]string{ds.Labels, r.ConfigMaps[0].Labels, r.SA[0].Labels, r.Roles[0].Labels} {
		if o["istio.io/rev"] != "canary" || o["install.operator.istio.io/owning-resource"] != "istio-cni-operator" {
			t.Errorf("labels %v", o)
		}
	}
	// env values of any scalar type, as the strings a variable holds.
	want := map[string]string{"EXTRA_STRING": "hello", "EXTRA_INT": "42", "EXTRA_BIG": "1000000", "EXTRA_FLOAT": "1.5", "EXTRA_BOOL": "true"}
	for k, v := range want {
		if got := r.ConfigMaps[0].Data[k]; got != v {
			t.Errorf("env %s = %q, want %q", k, got, v)
		}
	}

}

// Istio's global values apply where the chart-level value is unset.
func TestIstioGlobalValuesTakeEffect(t *testing.T) {
	file := filepath.Join("testdata", "istio-global-values.yaml")
	if out, err := runHelm(t, "lint", "--strict", chartDir, "-f", file); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	r := render(t, "-f", file)
	ds := r.ds(t)
	c := ds.Spec.Template.Spec.Containers[0]
	// global.hub, global.tag and global.variant are Istio's image: ignored;
	// global.imagePullPolicy is read.
	if c.Image != defaultImage || c.ImagePullPolicy != corev1.PullNever {
		t.Errorf("image %s policy %s", c.Image, c.ImagePullPolicy)
	}
	if got := pullSecretNames(ds.Spec.Template.Spec.ImagePullSecrets); !slices.Equal(got, []string{"global-cred"}) {
		t.Errorf("pull secrets %v", got)
	}
	cfg := r.agentConfig(t)
	if cfg.LogLevel != zerolog.WarnLevel || cfg.LogFormat != "json" {
		t.Errorf("global.logging.level/logAsJson: %v %s", cfg.LogLevel, cfg.LogFormat)
	}
	// global.platform k3d.
	if hostPath(ds, "cni-bin-dir") != "/bin" {
		t.Errorf("global.platform k3d: bin dir %s", hostPath(ds, "cni-bin-dir"))
	}
	// resources null: global.defaultResources.
	if got := c.Resources.Requests[corev1.ResourceMemory]; got.Cmp(resource.MustParse("30Mi")) != 0 || len(c.Resources.Limits) != 0 {
		t.Errorf("resources %+v, want global.defaultResources", c.Resources)
	}
	for _, e := range c.Env {
		if e.Name == "GOMEMLIMIT" {
			t.Error("GOMEMLIMIT without a memory limit")
		}
	}
	// Nor does Istio's image, even as a full reference.
	if got := render(t, "-f", file, "--set", "image=mirror.example/x/agent@sha256:0123").ds(t).Spec.Template.Spec.Containers[0].Image; got != defaultImage {
		t.Errorf("image reference: %s", got)
	}
}

// Istio's umbrella layout (cni: prefix) reads as top-level values.
func TestIstioUmbrellaPrefix(t *testing.T) {
	r := render(t, "-f", filepath.Join("testdata", "istio-umbrella-values.yaml"))
	ds := r.ds(t)
	cfg := r.agentConfig(t)
	if hostPath(ds, "cni-bin-dir") != "/var/lib/cni/bin" || !slices.Equal(cfg.ExcludeNamespaces, []string{"kube-system", "monitoring"}) || cfg.LogLevel != zerolog.WarnLevel {
		t.Errorf("cni.* not applied: bin %s, agent %+v", hostPath(ds, "cni-bin-dir"), cfg)
	}
	if got := ds.Spec.Template.Spec.Containers[0].Image; got != defaultImage {
		t.Errorf("image %s", got)
	}
}

// defaultImage is what the DaemonSet runs unless nftmesh.image says
// otherwise: the repository `make image` tags, at the chart's appVersion.
var defaultImage = "ghcr.io/nftmesh/nftmesh:" + chartAppVersion()

func chartAppVersion() string {
	b, err := os.ReadFile(filepath.Join(chartDir, "Chart.yaml"))
	if err != nil {
		panic(err)
	}
	var c struct {
		AppVersion string `json:"appVersion"`
	}
	if err := yaml.Unmarshal(b, &c); err != nil || c.AppVersion == "" {
		panic(fmt.Sprintf("Chart.yaml: appVersion %q: %v", c.AppVersion, err))
	}
	return c.AppVersion
}

// nftmesh's image has values of its own, which Istio's never touch.
func TestOwnImageValues(t *testing.T) {
	r := render(t, "--set", "nftmesh.image.repository=reg.example/team/nftmesh", "--set", "nftmesh.image.tag=v7", "--set", "nftmesh.image.pullPolicy=Always",
		"--set", "imagePullSecrets[0].name=own", "--set", "hub=docker.io/istio", "--set", "tag=1.27.1", "--set", "global.hub=docker.io/istio", "--set", "global.tag=1.27.1")
	c := r.ds(t).Spec.Template.Spec.Containers[0]
	if c.Image != "reg.example/team/nftmesh:v7" || c.ImagePullPolicy != corev1.PullAlways {
		t.Errorf("image %s policy %s", c.Image, c.ImagePullPolicy)
	}
	if got := pullSecretNames(r.SA[0].ImagePullSecrets); !slices.Equal(got, []string{"own"}) {
		t.Errorf("pull secrets %v", got)
	}
	def := render(t).ds(t).Spec.Template.Spec.Containers[0]
	if def.Image != defaultImage || def.ImagePullPolicy != corev1.PullIfNotPresent {
		t.Errorf("default image %s policy %s", def.Image, def.ImagePullPolicy)
	}
	const digest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	if got := render(t, "--set", "nftmesh.image.digest="+digest, "--set", "nftmesh.image.tag=v7").ds(t).Spec.Template.Spec.Containers[0].Image; got != "ghcr.io/nftmesh/nftmesh@"+digest {
		t.Errorf("digest: %s", got)
	}
	// The old map form under image is refused with where it went.
	_, err := runHelm(t, "template", "nftmesh", chartDir, "--set", "image.repository=reg.example/x")
	if err == nil || !strings.Contains(err.Error(), "moved to nftmesh.image.repository") {
		t.Errorf("image.repository: %v", err)
	}
}

// A platform selects its settings inside the chart; the user's values still
// win over the platform's, and the packaged chart needs no other file.
func TestPlatformPrecedenceAndPackagedChart(t *testing.T) {
	r := render(t, "--set", "platform=gke", "--set", "cniBinDir=/opt/cni/bin", "--set", "resourceQuotas.enabled=false")
	if got := hostPath(r.ds(t), "cni-bin-dir"); got != "/opt/cni/bin" || len(r.Quotas) != 0 {
		t.Errorf("user values lost to the platform: bin %s, %d quotas", got, len(r.Quotas))
	}
	// platform wins over global.platform.
	if got := hostPath(render(t, "--set", "platform=k3d", "--set", "global.platform=k3s").ds(t), "cni-bin-dir"); got != "/bin" {
		t.Errorf("platform k3d with global.platform k3s: %s", got)
	}
	// An empty cniBinDir outside GKE (helm's --kube-version drops a -gke
	// suffix, so the GKE side of this needs a GKE server).
	if got := hostPath(render(t, "--set", "cniBinDir=", "--kube-version", "v1.33.2").ds(t), "cni-bin-dir"); got != "/opt/cni/bin" {
		t.Errorf("empty cniBinDir elsewhere: %s", got)
	}
	// Istio's demo profile.
	r = render(t, "--set", "profile=demo")
	if got := r.ds(t).Spec.Template.Spec.Containers[0].Resources.Requests[corev1.ResourceMemory]; got.Cmp(resource.MustParse("40Mi")) != 0 {
		t.Errorf("demo profile memory request %s", got.String())
	}
	_, err := runHelm(t, "template", "nftmesh", chartDir, "--set", "platform=gcp")
	if err == nil || !strings.Contains(err.Error(), `platform=gcp: unknown`) || !strings.Contains(err.Error(), "gke, k3d") {
		t.Errorf("unknown platform: %v", err)
	}

	dir := t.TempDir()
	if _, err := runHelm(t, "package", chartDir, "--destination", dir); err != nil {
		t.Fatal(err)
	}
	pkgs, _ := filepath.Glob(filepath.Join(dir, "nftmesh-*.tgz"))
	if len(pkgs) != 1 {
		t.Fatalf("packages %v", pkgs)
	}
	for _, p := range platforms {
		if p.name == "" {
			continue
		}
		t.Run("packaged/"+p.name, func(t *testing.T) {
			checkPlatform(t, renderChart(t, pkgs[0], "--set", "platform="+p.name), p)
		})
	}
	readme, err := runHelm(t, "show", "readme", pkgs[0])
	if err != nil || !strings.Contains(readme, "| `platform`") {
		t.Errorf("helm show readme on the package: %v\n%.300s", err, readme)
	}
}

// Ambient mode is refused by the chart with a message saying so, not by
// the schema; its other values are harmless while it is off.
func TestAmbientValuesRefused(t *testing.T) {
	for _, set := range []string{"ambient.enabled=true", "profile=ambient", "global.profile=ambient", "cni.ambient.enabled=true"} {
		t.Run(set, func(t *testing.T) {
			_, err := runHelm(t, "template", "nftmesh", chartDir, "--set", set)
			if err == nil {
				t.Fatal("accepted")
			}
			msg := err.Error()
			if !strings.Contains(msg, "ambient") || !strings.Contains(msg, "sidecar pods only") || strings.Contains(msg, "schema") {
				t.Errorf("message does not say why: %s", msg)
			}
		})
	}
	_, err := runHelm(t, "template", "nftmesh", chartDir, "--set", "istioOwnedCNIConfig=true")
	if err == nil || !strings.Contains(err.Error(), "does not write a conflist of its own") {
		t.Errorf("istioOwnedCNIConfig: %v", err)
	}
	for _, set := range []string{"ambient.enabled=false", "ambient.dnsCapture=false", "ambient.shareHostNetworkNamespace=true", "trustedZtunnelNamespace=kube-system", "istioOwnedCNIConfig=false"} {
		r := render(t, "--set", set)
		key, _, _ := strings.Cut(set, "=")
		if strings.HasPrefix(key, "ambient.") {
			key = "ambient.*"
		}
		if got := r.ds(t).Annotations["nftmesh.io/ignored-values"]; !strings.Contains(got, key) {
			t.Errorf("%s: not listed as ignored: %q", set, got)
		}
	}
}

// Every refused value is named in one message, and helm lint fails on
// them as install does (TestLintRefusesAsInstallDoes: with the same message).
func TestRefusalsNameEveryKeyAndFailLint(t *testing.T) {
	args := []string{"--set", "ambient.enabled=true", "--set", "platform=gcp", "--set", "istioOwnedCNIConfig=true", "--set", "image.tag=v1"}
	keys := []string{"ambient.enabled=true", "platform=gcp", "istioOwnedCNIConfig", "image.repository/image.tag"}
	_, err := runHelm(t, append([]string{"template", "nftmesh", chartDir}, args...)...)
	if err == nil {
		t.Fatal("accepted")
	}
	for _, k := range keys {
		if !strings.Contains(err.Error(), k) {
			t.Errorf("refusal does not name %s: %v", k, err)
		}
	}
	if !strings.Contains(err.Error(), "refuses 4 value(s)") {
		t.Errorf("not all at once: %v", err)
	}
	out, err := runHelm(t, append([]string{"lint", "--strict", chartDir}, args...)...)
	if err == nil {
		t.Fatalf("helm lint passed on refused values:\n%s", out)
	}
	for _, k := range keys {
		if !strings.Contains(out+err.Error(), k) {
			t.Errorf("lint does not name %s: %s %v", k, out, err)
		}
	}
}

// Values files Istio users have: Istio's own stock values (as `helm show
// values` prints them, ambient off), an Istio 1.27 user's file, and the
// 1.20-1.22 layouts. Each lints, renders nftmesh's image, lists Istio's
// keys as ignored with what replaces them, and maps the old names.
func TestIstioValuesFilesRenderNftmeshImage(t *testing.T) {
	for _, tc := range []struct {
		file    string
		ignored []string
		mapped  string
		check   func(t *testing.T, r *rendered)
	}{
		{file: "istio-stock-values.yaml",
			ignored: []string{"hub, image, tag, variant, global.hub, global.tag, global.variant (Istio's install-cni image; nftmesh's image is nftmesh.image.repository and nftmesh.image.tag)",
				"cniNetnsDir", "repair.hub", "repair.tag", "ambient.* (ambient mode is off)", "istioOwnedCNIConfig (off)"},
			check: func(t *testing.T, r *rendered) {
				// Istio's tolerations and logging come through.
				if n := len(r.ds(t).Spec.Template.Spec.Tolerations); n != 3 {
					t.Errorf("%d tolerations, want Istio's 3", n)
				}
				if cfg := r.agentConfig(t); cfg.LogFormat != "text" || cfg.Repair.Mode() != repair.InPlace {
					t.Errorf("agent %+v", cfg)
				}
			}},
		{file: "istio-1.27-user-values.yaml",
			ignored: []string{"global.hub, global.tag, global.variant (Istio's install-cni image", "ambient.* (ambient mode is off)", "trustedZtunnelNamespace", "global.istioNamespace"},
			check: func(t *testing.T, r *rendered) {
				ds := r.ds(t)
				if hostPath(ds, "cni-bin-dir") != "/var/lib/rancher/k3s/data/cni" || ds.Spec.Template.Labels["team"] != "mesh" {
					t.Errorf("platform k3s or podLabels lost: %s %v", hostPath(ds, "cni-bin-dir"), ds.Spec.Template.Labels)
				}
				if cfg := r.agentConfig(t); !slices.Equal(cfg.ExcludeNamespaces, []string{"kube-system", "istio-system"}) {
					t.Errorf("excludeNamespaces %v", cfg.ExcludeNamespaces)
				}
			}},
		{file: "istio-1.21-values.yaml",
			ignored: []string{"hub, image, tag, variant, global.hub, global.tag (Istio's install-cni image", "logLevel (", "use logging.level", "psp_cluster_role (", "enabled (", "pilot (another Istio chart's)", "meshConfig (another Istio chart's)"},
			mapped:  "rollingMaxUnavailable=2 → updateStrategy.rollingUpdate.maxUnavailable",
			check: func(t *testing.T, r *rendered) {
				ds := r.ds(t)
				if ru := ds.Spec.UpdateStrategy.RollingUpdate; ru == nil || ru.MaxUnavailable.IntVal != 2 {
					t.Errorf("rollingMaxUnavailable not mapped: %+v", ds.Spec.UpdateStrategy)
				}
				sc := ds.Spec.Template.Spec.Containers[0].SecurityContext
				if sc.Privileged == nil || !*sc.Privileged || sc.AllowPrivilegeEscalation != nil {
					t.Errorf("cni.privileged=true: %+v", sc)
				}
				if cfg := r.agentConfig(t); cfg.Repair.Mode() != repair.Delete || !slices.Equal(cfg.ExcludeNamespaces, []string{"istio-system", "kube-system"}) {
					t.Errorf("cni.* not read: %+v", cfg)
				}
			}},
		{file: "istio-1.22-stock-values.yaml",
			ignored: []string{"hub, image, tag, variant, global.hub, global.tag, global.variant (Istio's install-cni image", "logLevel ("},
			mapped:  "rollingMaxUnavailable=1",
			check: func(t *testing.T, r *rendered) {
				// cniBinDir "" picks the bin dir as Istio's chart does.
				if got := hostPath(r.ds(t), "cni-bin-dir"); got != "/opt/cni/bin" {
					t.Errorf("bin dir %s", got)
				}
			}},
	} {
		t.Run(tc.file, func(t *testing.T) {
			file := filepath.Join("testdata", tc.file)
			if out, err := runHelm(t, "lint", "--strict", chartDir, "-f", file); err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			r := render(t, "-f", file)
			ds := r.ds(t)
			if got := ds.Spec.Template.Spec.Containers[0].Image; got != defaultImage {
				t.Errorf("image %s, want nftmesh's %s", got, defaultImage)
			}
			got := ds.Annotations["nftmesh.io/ignored-values"]
			for _, k := range tc.ignored {
				if !strings.Contains(got, k) {
					t.Errorf("ignored values do not list %q:\n%s", k, got)
				}
			}
			if m := ds.Annotations["nftmesh.io/mapped-values"]; !strings.Contains(m, tc.mapped) {
				t.Errorf("mapped values %q, want %q", m, tc.mapped)
			}
			tc.check(t, r)
		})
	}
}

// global.resourceScope renders only the cluster or the namespace objects.
func TestResourceScope(t *testing.T) {
	r := render(t, "--set", "global.resourceScope=cluster", "--set", "platform=gke")
	if len(r.Roles) == 0 || len(r.DaemonSets)+len(r.ConfigMaps)+len(r.SA)+len(r.Quotas) != 0 {
		t.Errorf("cluster scope: %v", r.ObjectsByKind)
	}
	r = render(t, "--set", "global.resourceScope=namespace", "--set", "platform=gke")
	if len(r.Roles)+len(r.Bindings) != 0 || len(r.DaemonSets) != 1 || len(r.Quotas) != 1 {
		t.Errorf("namespace scope: %v", r.ObjectsByKind)
	}
}

// AppArmor: unconfined through the annotation before Kubernetes 1.30 and the
// securityContext field from 1.30, unless useAppArmorAnnotation says which.
func TestAppArmor(t *testing.T) {
	for _, c := range []struct {
		args       []string
		annotation bool
	}{
		{[]string{"--kube-version", "v1.29.4"}, true},
		{[]string{"--kube-version", "v1.30.0"}, false},
		{[]string{"--kube-version", "v1.33.1", "--set", "useAppArmorAnnotation=true"}, true},
		{[]string{"--kube-version", "v1.29.4", "--set", "useAppArmorAnnotation=false"}, false},
	} {
		ds := render(t, c.args...).ds(t)
		ann := ds.Spec.Template.Annotations["container.apparmor.security.beta.kubernetes.io/agent"] == "unconfined"
		ap := ds.Spec.Template.Spec.Containers[0].SecurityContext.AppArmorProfile
		field := ap != nil && ap.Type == corev1.AppArmorProfileTypeUnconfined
		if ann != c.annotation || field == c.annotation {
			t.Errorf("%v: annotation %v, field %v", c.args, ann, field)
		}
	}
}

// The Multus network is configurable; the agent's standalone conf follows.
func TestMultusNetworkName(t *testing.T) {
	r := render(t, "--set", "platform=openshift", "--set", "multusNetwork=mesh/nftmesh-capture")
	if len(r.NADs) != 1 || r.NADs[0].Namespace != "mesh" || r.NADs[0].Name != "nftmesh-capture" {
		t.Fatalf("NetworkAttachmentDefinition %+v", r.NADs)
	}
	if got := r.agentConfig(t).PluginConf().Name; got != "nftmesh-capture" {
		t.Errorf("standalone conf name %s", got)
	}
	if _, err := runHelm(t, "template", "nftmesh", chartDir, "--set", "multusNetwork=istio-cni"); err == nil {
		t.Error("a network without a namespace accepted")
	}
}

// env values of any scalar type, from --set too (integers arrive as int64
// there, as float64 from a file).
func TestEnvScalars(t *testing.T) {
	r := render(t, "--set", "env.A=1000000", "--set", "env.B=true", "--set", "env.C=x", "--set", "env.NFTMESH_API_TIMEOUT=5s")
	d := r.ConfigMaps[0].Data
	if d["A"] != "1000000" || d["B"] != "true" || d["C"] != "x" {
		t.Errorf("env %v", d)
	}
	// A name the chart sets itself is overridden, not duplicated.
	if cfg := r.agentConfig(t); cfg.APITimeout.String() != "5s" {
		t.Errorf("env did not override NFTMESH_API_TIMEOUT: %v", cfg.APITimeout)
	}
	if _, err := runHelm(t, "template", "nftmesh", chartDir, "--set", "env.A.b=1"); err == nil {
		t.Error("a map in env accepted")
	}
}

// The chart README (helm show readme) has a row for every value the schema
// accepts, top-level and global.
func TestReadmeListsEveryValue(t *testing.T) {
	readme, err := runHelm(t, "show", "readme", chartDir)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(chartDir, "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	var schema struct {
		Definitions struct {
			Values struct {
				Properties map[string]struct {
					Properties map[string]json.RawMessage `json:"properties"`
				} `json:"properties"`
			} `json:"values"`
		} `json:"definitions"`
	}
	if err := json.Unmarshal(b, &schema); err != nil {
		t.Fatal(err)
	}
	var missing []string
	row := func(name string) bool {
		// A row's first cell may name several values.
		return regexp.MustCompile("(?m)^\\| (`[^`|]*`, )*`" + regexp.QuoteMeta(name) + "(`|\\.)").MatchString(readme)
	}
	for name, p := range schema.Definitions.Values.Properties {
		if name == "_internal_defaults_do_not_set" {
			continue
		}
		if name == "global" {
			for g := range p.Properties {
				if !row("global." + g) {
					missing = append(missing, "global."+g)
				}
			}
			continue
		}
		if !row(name) {
			missing = append(missing, name)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("README has no row for %v", missing)
	}
}

// istiod's untaint controller (pilot.taint.enabled) lifts a node's
// cni.istio.io/not-ready taint only for a ready pod labelled
// k8s-app: istio-cni-node: the agent's pods carry it by default, next to
// the user's labels (Istio's stock podLabels: {} included), and only an
// explicit null removes it. The selector stays as it was (immutable).
func TestUntaintControllerLabel(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want map[string]string
		not  []string
	}{
		{nil, map[string]string{"k8s-app": "istio-cni-node"}, nil},
		{[]string{"-f", filepath.Join("testdata", "istio-stock-values.yaml")}, map[string]string{"k8s-app": "istio-cni-node"}, nil},
		{[]string{"--set", "podLabels.team=mesh"}, map[string]string{"k8s-app": "istio-cni-node", "team": "mesh"}, nil},
		{[]string{"--set", "cni.podLabels.team=mesh"}, map[string]string{"k8s-app": "istio-cni-node", "team": "mesh"}, nil},
		{[]string{"--set", "podLabels.k8s-app=null", "--set", "podLabels.team=mesh"}, map[string]string{"team": "mesh"}, []string{"k8s-app"}},
	} {
		ds := render(t, tc.args...).ds(t)
		labels := ds.Spec.Template.Labels
		for k, v := range tc.want {
			if labels[k] != v {
				t.Errorf("%v: pod label %s=%q, want %q (labels %v)", tc.args, k, labels[k], v, labels)
			}
		}
		for _, k := range tc.not {
			if _, ok := labels[k]; ok {
				t.Errorf("%v: pod label %s still there", tc.args, k)
			}
		}
		if _, ok := ds.Spec.Selector.MatchLabels["k8s-app"]; ok {
			t.Errorf("%v: k8s-app in the selector: %v", tc.args, ds.Spec.Selector.MatchLabels)
		}
	}
}

// OpenShift: Istio's istio-cni release creates the same
// NetworkAttachmentDefinition default/istio-cni. nftmesh's release can
// leave it to that release (create=false) while the agent still names its
// standalone config after it, and can keep it through its own uninstall.
func TestNetworkAttachmentDefinitionOwnership(t *testing.T) {
	r := render(t, "--set", "platform=openshift")
	if len(r.NADs) != 1 || r.NADs[0].Annotations["helm.sh/resource-policy"] != "" {
		t.Errorf("default: %+v", r.NADs)
	}
	r = render(t, "--set", "platform=openshift", "--set", "networkAttachmentDefinition.create=false")
	if len(r.NADs) != 0 {
		t.Errorf("create=false rendered %+v", r.NADs[0].ObjectMeta)
	}
	if got := r.agentConfig(t).PluginConf().Name; got != "istio-cni" {
		t.Errorf("standalone conf name %q without the object, want istio-cni", got)
	}
	r = render(t, "--set", "platform=openshift", "--set", "networkAttachmentDefinition.keep=true")
	if len(r.NADs) != 1 || r.NADs[0].Annotations["helm.sh/resource-policy"] != "keep" {
		t.Errorf("keep=true: %+v", r.NADs)
	}
}

// Privileges and resources as an Istio user knows them: Istio's resource
// requests plus a default memory limit (which is GOMEMLIMIT too) that the
// user's values override entry by entry, a value that adds capabilities
// (DAC_OVERRIDE, which Istio 1.25 added), and Istio's privileged escape
// hatch.
func TestPrivilegesAndResources(t *testing.T) {
	for _, tc := range []struct {
		args               []string
		cpu, mem, memLimit string // "" for none
	}{
		{nil, "100m", "100Mi", "256Mi"},
		{[]string{"--set", "resources.limits.memory=300Mi"}, "100m", "100Mi", "300Mi"},
		{[]string{"--set", "resources.limits.memory=null"}, "100m", "100Mi", ""},
		{[]string{"--set", "resources.requests.memory=64Mi", "--set", "resources.limits.cpu=1"}, "100m", "64Mi", "256Mi"},
		// Istio's stock values (requests only): Istio's requests, the limit.
		{[]string{"-f", filepath.Join("testdata", "istio-stock-values.yaml")}, "100m", "100Mi", "256Mi"},
		{[]string{"--set", "profile=demo"}, "10m", "40Mi", "256Mi"},
		{[]string{"--set", "resources=null", "--set", "global.defaultResources.requests.cpu=10m"}, "10m", "", ""},
	} {
		c := render(t, tc.args...).ds(t).Spec.Template.Spec.Containers[0]
		q := func(l corev1.ResourceList, n corev1.ResourceName) string {
			if v, ok := l[n]; ok {
				return v.String()
			}
			return ""
		}
		if got := [3]string{q(c.Resources.Requests, corev1.ResourceCPU), q(c.Resources.Requests, corev1.ResourceMemory), q(c.Resources.Limits, corev1.ResourceMemory)}; got != [3]string{tc.cpu, tc.mem, tc.memLimit} {
			t.Errorf("%v: requests cpu/memory, memory limit %q, want %q", tc.args, got, [3]string{tc.cpu, tc.mem, tc.memLimit})
		}
		// A memory limit is the Go runtime's soft limit too.
		goMemLimit := slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool {
			return e.Name == "GOMEMLIMIT" && e.ValueFrom != nil && e.ValueFrom.ResourceFieldRef != nil && e.ValueFrom.ResourceFieldRef.Resource == "limits.memory"
		})
		if goMemLimit != (tc.memLimit != "") {
			t.Errorf("%v: GOMEMLIMIT from the limit %v, memory limit %q", tc.args, goMemLimit, tc.memLimit)
		}
	}

	for _, tc := range []struct {
		args []string
		want []corev1.Capability
	}{
		{[]string{"--set", "addCapabilities[0]=DAC_OVERRIDE"}, []corev1.Capability{"NET_ADMIN", "NET_RAW", "SYS_ADMIN", "SYS_PTRACE", "DAC_OVERRIDE"}},
		{[]string{"--set", "addCapabilities[0]=DAC_OVERRIDE", "--set", "addCapabilities[1]=NET_ADMIN", "--set", "repair.enabled=false"}, []corev1.Capability{"NET_ADMIN", "SYS_ADMIN", "SYS_PTRACE", "DAC_OVERRIDE"}},
		{[]string{"--set", "cni.addCapabilities[0]=DAC_OVERRIDE", "--set", "backend=nftables"}, []corev1.Capability{"NET_ADMIN", "SYS_ADMIN", "SYS_PTRACE", "DAC_OVERRIDE"}},
	} {
		sc := render(t, tc.args...).ds(t).Spec.Template.Spec.Containers[0].SecurityContext
		if !slices.Equal(sc.Capabilities.Add, tc.want) || *sc.Privileged {
			t.Errorf("%v: capabilities %v, want %v", tc.args, sc.Capabilities.Add, tc.want)
		}
	}
	sc := render(t, "--set", "privileged=true").ds(t).Spec.Template.Spec.Containers[0].SecurityContext
	// The API server refuses privileged with allowPrivilegeEscalation false.
	if sc.Privileged == nil || !*sc.Privileged || sc.AllowPrivilegeEscalation != nil {
		t.Errorf("privileged=true: %+v", sc)
	}
	for _, bad := range []string{"addCapabilities[0]=CAP_NET_ADMIN", "addCapabilities[0]=dac_override", "privileged=maybe"} {
		if _, err := runHelm(t, "template", "nftmesh", chartDir, "--set", bad); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}
