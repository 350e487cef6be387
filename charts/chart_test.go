// Package charts holds the tests of the Helm chart in ./nftmesh: lint and
// template for every platform, strict decoding of every rendered object,
// the schema, RBAC per repair mode, and an install into a real API server.
package charts

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/nftmesh/nftmesh/installer"
	"github.com/nftmesh/nftmesh/installer/repair"
)

const chartDir = "nftmesh"

// helm finds the helm binary: $HELM, PATH, then $(go env GOPATH)/bin.
func helm(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("HELM"); p != "" {
		return p
	}
	if p, err := exec.LookPath("helm"); err == nil {
		return p
	}
	gopath := os.Getenv("GOPATH")
	if gopath == "" {
		home, _ := os.UserHomeDir()
		gopath = filepath.Join(home, "go")
	}
	p := filepath.Join(gopath, "bin", "helm")
	if _, err := os.Stat(p); err == nil {
		return p
	}
	t.Skip("helm not found (install it with `go install helm.sh/helm/v3/cmd/helm@v3.22.0`)")
	return ""
}

func runHelm(t testing.TB, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(helm(t), args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if err != nil {
		return out.String(), fmt.Errorf("helm %s: %w\n%s", strings.Join(args, " "), err, errb.String())
	}
	return out.String(), nil
}

// nad is the Multus NetworkAttachmentDefinition (no Go type in k8s.io/api).
type nad struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              *struct {
		Config string `json:"config,omitempty"`
	} `json:"spec,omitempty"`
}

// rendered is a chart rendering decoded strictly into typed objects.
type rendered struct {
	SA              []*corev1.ServiceAccount
	Roles           []*rbacv1.ClusterRole
	Bindings        []*rbacv1.ClusterRoleBinding
	NSRoles         []*rbacv1.Role
	NSBindings      []*rbacv1.RoleBinding
	ConfigMaps      []*corev1.ConfigMap
	DaemonSets      []*appsv1.DaemonSet
	NADs            []*nad
	Quotas          []*corev1.ResourceQuota
	NetworkPolicies []*networkingv1.NetworkPolicy
	Policies        []*admissionregistrationv1.ValidatingAdmissionPolicy
	PolicyBindings  []*admissionregistrationv1.ValidatingAdmissionPolicyBinding
	Raw             string
	ObjectsByKind   map[string]int
}

func strictDecode(t testing.TB, doc []byte, into any) {
	t.Helper()
	j, err := yaml.YAMLToJSON(doc)
	if err != nil {
		t.Fatalf("rendered YAML does not parse: %v\n%s", err, doc)
	}
	dec := json.NewDecoder(bytes.NewReader(j))
	dec.DisallowUnknownFields()
	if err := dec.Decode(into); err != nil {
		t.Fatalf("rendered object does not decode strictly into %T: %v\n%s", into, err, doc)
	}
}

func render(t testing.TB, args ...string) *rendered {
	t.Helper()
	return renderChart(t, chartDir, args...)
}

// renderChart renders chart (a directory or a packaged .tgz).
func renderChart(t testing.TB, chart string, args ...string) *rendered {
	t.Helper()
	out, err := runHelm(t, append([]string{"template", "nftmesh", chart, "--namespace", "nftmesh-system"}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	r := &rendered{Raw: out, ObjectsByKind: map[string]int{}}
	for _, doc := range strings.Split(out, "\n---") {
		body := strings.TrimSpace(doc)
		lines := strings.Split(body, "\n")
		if len(lines) > 0 && strings.HasPrefix(lines[0], "# Source:") {
			body = strings.Join(lines[1:], "\n")
		}
		if strings.TrimSpace(body) == "" {
			continue
		}
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(body), &tm); err != nil {
			t.Fatalf("object without type: %v\n%s", err, body)
		}
		r.ObjectsByKind[tm.Kind]++
		b := []byte(body)
		switch tm.APIVersion + "/" + tm.Kind {
		case "v1/ServiceAccount":
			o := &corev1.ServiceAccount{}
			strictDecode(t, b, o)
			r.SA = append(r.SA, o)
		case "rbac.authorization.k8s.io/v1/ClusterRole":
			o := &rbacv1.ClusterRole{}
			strictDecode(t, b, o)
			r.Roles = append(r.Roles, o)
		case "rbac.authorization.k8s.io/v1/ClusterRoleBinding":
			o := &rbacv1.ClusterRoleBinding{}
			strictDecode(t, b, o)
			r.Bindings = append(r.Bindings, o)
		case "rbac.authorization.k8s.io/v1/Role":
			o := &rbacv1.Role{}
			strictDecode(t, b, o)
			r.NSRoles = append(r.NSRoles, o)
		case "rbac.authorization.k8s.io/v1/RoleBinding":
			o := &rbacv1.RoleBinding{}
			strictDecode(t, b, o)
			r.NSBindings = append(r.NSBindings, o)
		case "v1/ConfigMap":
			o := &corev1.ConfigMap{}
			strictDecode(t, b, o)
			r.ConfigMaps = append(r.ConfigMaps, o)
		case "apps/v1/DaemonSet":
			o := &appsv1.DaemonSet{}
			strictDecode(t, b, o)
			r.DaemonSets = append(r.DaemonSets, o)
		case "k8s.cni.cncf.io/v1/NetworkAttachmentDefinition":
			o := &nad{}
			strictDecode(t, b, o)
			r.NADs = append(r.NADs, o)
		case "v1/ResourceQuota":
			o := &corev1.ResourceQuota{}
			strictDecode(t, b, o)
			r.Quotas = append(r.Quotas, o)
		case "networking.k8s.io/v1/NetworkPolicy":
			o := &networkingv1.NetworkPolicy{}
			strictDecode(t, b, o)
			r.NetworkPolicies = append(r.NetworkPolicies, o)
		case "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy":
			o := &admissionregistrationv1.ValidatingAdmissionPolicy{}
			strictDecode(t, b, o)
			r.Policies = append(r.Policies, o)
		case "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicyBinding":
			o := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{}
			strictDecode(t, b, o)
			r.PolicyBindings = append(r.PolicyBindings, o)
		default:
			t.Fatalf("unexpected object %s %s in the chart", tm.APIVersion, tm.Kind)
		}
	}
	return r
}

func (r *rendered) ds(t testing.TB) *appsv1.DaemonSet {
	t.Helper()
	if len(r.DaemonSets) != 1 {
		t.Fatalf("%d DaemonSets", len(r.DaemonSets))
	}
	return r.DaemonSets[0]
}

// agentEnv is the environment the agent container gets: its ConfigMap plus
// the downward-API variables, as kubelet would set them.
func (r *rendered) agentEnv(t testing.TB) map[string]string {
	t.Helper()
	if len(r.ConfigMaps) != 1 {
		t.Fatalf("%d ConfigMaps", len(r.ConfigMaps))
	}
	env := map[string]string{
		"NODE_NAME": "node-1", "POD_NAME": "nftmesh-agent-x1", "POD_NAMESPACE": "nftmesh-system",
		"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443",
	}
	for k, v := range r.ConfigMaps[0].Data {
		env[k] = v
	}
	return env
}

func hostPath(ds *appsv1.DaemonSet, volume string) string {
	for _, v := range ds.Spec.Template.Spec.Volumes {
		if v.Name == volume && v.HostPath != nil {
			return v.HostPath.Path
		}
	}
	return ""
}

// platform is what Istio's platform profile (manifests/helm-profiles in
// istio/istio) makes its chart render, and what ours must render for the
// same --set platform=<name>.
type platform struct {
	name            string
	binDir, confDir string
	chained         bool
	confName        string
	quota           bool
	nadNS, nadName  string // the Multus network; "" = no NetworkAttachmentDefinition
	wantSCC         bool
	seLinuxType     string
	networkName     string // the standalone conf's name the agent writes
}

var platforms = []platform{
	{name: "", binDir: "/opt/cni/bin", confDir: "/etc/cni/net.d", chained: true},
	{name: "gke", binDir: "/home/kubernetes/bin", confDir: "/etc/cni/net.d", chained: true, quota: true},
	{name: "openshift", binDir: "/var/lib/cni/bin", confDir: "/etc/cni/multus/net.d", chained: false, confName: "istio-cni.conf",
		nadNS: "default", nadName: "istio-cni", wantSCC: true, seLinuxType: "spc_t", networkName: "istio-cni"},
	{name: "k3s", binDir: "/var/lib/rancher/k3s/data/cni", confDir: "/var/lib/rancher/k3s/agent/etc/cni/net.d", chained: true},
	{name: "k3d", binDir: "/bin", confDir: "/var/lib/rancher/k3s/agent/etc/cni/net.d", chained: true},
	{name: "microk8s", binDir: "/var/snap/microk8s/current/opt/cni/bin", confDir: "/var/snap/microk8s/current/args/cni-network", chained: true},
	{name: "minikube", binDir: "/opt/cni/bin", confDir: "/etc/cni/net.d", chained: true},
	{name: "eks", binDir: "/opt/cni/bin", confDir: "/etc/cni/net.d", chained: true},
	{name: "aks", binDir: "/opt/cni/bin", confDir: "/etc/cni/net.d", chained: true},
}

func TestLintAndTemplateEveryPlatform(t *testing.T) {
	files, _ := filepath.Glob(filepath.Join(chartDir, "files", "platform-*.yaml"))
	if len(files) != len(platforms)-1 {
		t.Fatalf("platforms in the chart %v do not match the test table", files)
	}
	for _, p := range platforms {
		name := p.name
		if name == "" {
			name = "default"
		}
		t.Run(name, func(t *testing.T) {
			var args []string
			if p.name != "" {
				args = []string{"--set", "platform=" + p.name}
			}
			if out, err := runHelm(t, append([]string{"lint", "--strict", chartDir}, args...)...); err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			r := render(t, args...)
			checkPlatform(t, r, p)
			if p.name != "" {
				// Istio's global.platform selects the same.
				checkPlatform(t, render(t, "--set", "global.platform="+p.name), p)
			}
		})
	}
}

func checkPlatform(t *testing.T, r *rendered, p platform) {
	t.Helper()
	ds := r.ds(t)
	spec := ds.Spec.Template.Spec
	if ds.Name != "nftmesh-agent" || spec.PriorityClassName != "system-node-critical" {
		t.Errorf("name %q priorityClass %q", ds.Name, spec.PriorityClassName)
	}
	if spec.NodeSelector["kubernetes.io/os"] != "linux" {
		t.Errorf("nodeSelector %v", spec.NodeSelector)
	}
	if !slices.ContainsFunc(spec.Tolerations, func(tl corev1.Toleration) bool {
		return tl.Operator == corev1.TolerationOpExists && tl.Key == "" && tl.Effect == ""
	}) {
		t.Errorf("does not tolerate every taint: %v", spec.Tolerations)
	}
	c := spec.Containers[0]
	if rp := c.ReadinessProbe; rp == nil || rp.HTTPGet == nil || rp.HTTPGet.Path != "/readyz" {
		t.Errorf("readiness probe %v", rp)
	}
	if got := hostPath(ds, "cni-bin-dir"); got != p.binDir {
		t.Errorf("bin dir %s, want %s", got, p.binDir)
	}
	if got := hostPath(ds, "cni-conf-dir"); got != p.confDir {
		t.Errorf("conf dir %s, want %s", got, p.confDir)
	}
	if got := hostPath(ds, "agent-run-dir"); got != "/var/run/nftmesh" {
		t.Errorf("run dir %s", got)
	}
	sc := c.SecurityContext
	if sc == nil || sc.Privileged == nil || *sc.Privileged || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
		t.Errorf("security context %+v", sc)
	}
	if got := ""; sc != nil && sc.SELinuxOptions != nil {
		got = sc.SELinuxOptions.Type
		if got != p.seLinuxType {
			t.Errorf("SELinux type %q, want %q", got, p.seLinuxType)
		}
	} else if p.seLinuxType != "" {
		t.Errorf("no SELinux options, want type %s", p.seLinuxType)
	}
	if len(r.SA) != 1 || spec.ServiceAccountName != r.SA[0].Name {
		t.Errorf("service account")
	}
	switch {
	case p.nadName == "" && len(r.NADs) != 0:
		t.Errorf("NetworkAttachmentDefinition rendered: %+v", r.NADs[0].ObjectMeta)
	case p.nadName != "" && (len(r.NADs) != 1 || r.NADs[0].Name != p.nadName || r.NADs[0].Namespace != p.nadNS):
		t.Errorf("NetworkAttachmentDefinitions %v, want %s/%s", r.NADs, p.nadNS, p.nadName)
	}
	scc := slices.ContainsFunc(r.Roles, func(cr *rbacv1.ClusterRole) bool {
		return slices.ContainsFunc(cr.Rules, func(pr rbacv1.PolicyRule) bool {
			return slices.Equal(pr.APIGroups, []string{"security.openshift.io"}) && slices.Equal(pr.Resources, []string{"securitycontextconstraints"}) &&
				slices.Equal(pr.ResourceNames, []string{"privileged"}) && slices.Equal(pr.Verbs, []string{"use"})
		})
	})
	if scc != p.wantSCC {
		t.Errorf("use of the privileged SCC granted: %v, want %v", scc, p.wantSCC)
	}
	if p.quota {
		checkQuota(t, r, "5000")
	} else if len(r.Quotas) != 0 {
		t.Errorf("ResourceQuota rendered: %+v", r.Quotas[0].Spec)
	}

	// The agent accepts the rendered configuration, and it means what the
	// platform says.
	env := r.agentEnv(t)
	cfg, err := installer.ParseConfig(nil, func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	if err != nil {
		t.Fatalf("the agent rejects the chart's config: %v", err)
	}
	if cfg.Chained != p.chained || !slices.Equal(cfg.ExcludeNamespaces, []string{"kube-system"}) ||
		cfg.PodNamespace != "nftmesh-system" || cfg.AgentRunDir != "/var/run/nftmesh" {
		t.Errorf("agent config %+v", cfg)
	}
	if p.confName != "" && cfg.CNIConfFileName != p.confName {
		t.Errorf("conf file %q, want %q", cfg.CNIConfFileName, p.confName)
	}
	if p.networkName != "" {
		// Multus finds the config of a NetworkAttachmentDefinition without
		// one by the name inside the standalone file.
		if got := cfg.PluginConf().Name; got != p.networkName || got != r.NADs[0].Name {
			t.Errorf("standalone conf name %q, want %q (the NetworkAttachmentDefinition's)", got, p.networkName)
		}
	}
	mounts := map[string]string{}
	for _, m := range c.VolumeMounts {
		mounts[m.Name] = m.MountPath
	}
	if mounts["cni-bin-dir"] != cfg.CNIBinDirs[0] || mounts["cni-conf-dir"] != cfg.CNIConfDir || mounts["agent-run-dir"] != cfg.AgentRunDir {
		t.Errorf("mounts %v do not match the agent's dirs %v %s %s", mounts, cfg.CNIBinDirs, cfg.CNIConfDir, cfg.AgentRunDir)
	}
	if got := env["NFTMESH_HEALTH_ADDR"]; got != fmt.Sprintf(":%d", rpPort(c)) {
		t.Errorf("health addr %s vs probe port", got)
	}
}

// checkQuota: a quota on system-node-critical pods, as GKE requires
// outside kube-system.
func checkQuota(t *testing.T, r *rendered, pods string) {
	t.Helper()
	if len(r.Quotas) != 1 {
		t.Fatalf("%d ResourceQuotas, want 1", len(r.Quotas))
	}
	q := r.Quotas[0]
	if got := q.Spec.Hard[corev1.ResourcePods]; got.Cmp(resource.MustParse(pods)) != 0 || len(q.Spec.Hard) != 1 {
		t.Errorf("quota hard %v, want pods %s", q.Spec.Hard, pods)
	}
	want := []corev1.ScopedResourceSelectorRequirement{{ScopeName: corev1.ResourceQuotaScopePriorityClass, Operator: corev1.ScopeSelectorOpIn, Values: []string{"system-node-critical"}}}
	if q.Spec.ScopeSelector == nil || !reflect.DeepEqual(q.Spec.ScopeSelector.MatchExpressions, want) || q.Namespace != "nftmesh-system" {
		t.Errorf("quota %s/%s scope %+v", q.Namespace, q.Name, q.Spec.ScopeSelector)
	}
}

func rpPort(c corev1.Container) int32 {
	for _, p := range c.Ports {
		if p.Name == c.ReadinessProbe.HTTPGet.Port.StrVal {
			return p.ContainerPort
		}
	}
	return -1
}

func TestSchemaRejectsTyposAndWrongTypes(t *testing.T) {
	bad := []struct{ set, want string }{
		{"cniBinDirr=/opt/cni/bin", "cniBinDirr"},
		{"repair.deletepods=true", "deletepods"},
		{"logging.levl=debug", "levl"},
		{"nftmesh.image.tagg=x", "tagg"},
		{"nftmesh.image.digest=latest", "digest"},
		{"chained=maybe", "chained"},
		{"backend=nft", "backend"},
		{"cniBinDir=relative/bin", "cniBinDir"},
		{"cniConfFileName=x.yaml", "cniConfFileName"},
		{"excludeNamespaces[0]=Bad_NS", "excludeNamespaces"},
		{"logging.level=loud", "level"},
		{"apiTimeout=soon", "apiTimeout"},
		{"metricsPort=70000", "metricsPort"},
		{"repair.initContainerExitCode=300", "initContainerExitCode"},
		{"logging.level=default:loud", "level"},
		{"global.logging.level=cni-plugin", "level"},
		{"resourceQuotas.pods=lots", "pods"},
		{"resourceQuotas.enabld=true", "enabld"},
		{"seccompProfile.type=Off", "seccompProfile"},
		{"multusNetwork=default/Istio_CNI", "multusNetwork"},
		{"global.resourceScope=some", "resourceScope"},
		{"env.A.b=1", "env"},
		{"useAppArmorAnnotation=maybe", "useAppArmorAnnotation"},
	}
	for _, b := range bad {
		t.Run(b.set, func(t *testing.T) {
			flag := "--set"
			if strings.Contains(b.set, "=maybe") || strings.Contains(b.set, "Port=") || strings.HasPrefix(b.set, "resourceQuotas.pods") {
				flag = "--set-string"
				if strings.Contains(b.set, "Port=") {
					flag = "--set"
				}
			}
			out, err := runHelm(t, "template", "nftmesh", chartDir, flag, b.set)
			if err == nil {
				t.Fatalf("schema accepted %s:\n%.300s", b.set, out)
			}
			if !strings.Contains(err.Error(), b.want) {
				t.Errorf("error does not name %s: %v", b.want, err)
			}
		})
	}
	if _, err := runHelm(t, "template", "nftmesh", chartDir, "--set", "chained=false", "--set", "cniConfFileName=nftmesh-cni.conf", "--set", "logging.level=default:info\\,cni-plugin:debug"); err != nil {
		t.Errorf("valid values rejected: %v", err)
	}
}

type repairCase struct {
	name     string
	set      []string
	mode     repair.Mode
	rules    []rbacv1.PolicyRule // of the repair ClusterRole; nil: no such role
	caps     []corev1.Capability
	hostProc bool
}

// podRead is the agent's own role in every set-up: the plugin's GET and
// the agent's watch of its node's pods, which answers the plugin.
var podRead = rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch"}}

var repairCases = []repairCase{
	{name: "off", set: []string{"repair.enabled=false"}, mode: repair.None, hostProc: true, caps: []corev1.Capability{"NET_ADMIN", "SYS_ADMIN", "SYS_PTRACE"}},
	{name: "enabled-no-mode", set: []string{"repair.repairPods=false"}, mode: repair.None, hostProc: true, caps: []corev1.Capability{"NET_ADMIN", "SYS_ADMIN", "SYS_PTRACE"}},
	{name: "delete", set: []string{"repair.repairPods=false", "repair.deletePods=true"}, mode: repair.Delete, hostProc: true, caps: []corev1.Capability{"NET_ADMIN", "SYS_ADMIN", "SYS_PTRACE"}, rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list", "watch", "delete"}},
		{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create"}},
	}},
	{name: "label", set: []string{"repair.repairPods=false", "repair.labelPods=true"}, mode: repair.Label, hostProc: true, caps: []corev1.Capability{"NET_ADMIN", "SYS_ADMIN", "SYS_PTRACE"}, rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"pods/status"}, Verbs: []string{"patch"}},
		{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create"}},
	}},
	{name: "repair in place (default)", mode: repair.InPlace, hostProc: true,
		caps: []corev1.Capability{"NET_ADMIN", "NET_RAW", "SYS_ADMIN", "SYS_PTRACE"}, rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list", "watch"}},
			{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create"}},
		}},
	{name: "repair in place, nftables backend", set: []string{"backend=nftables"}, mode: repair.InPlace, hostProc: true,
		caps: []corev1.Capability{"NET_ADMIN", "SYS_ADMIN", "SYS_PTRACE"}, rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list", "watch"}},
			{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create"}},
		}},
}

func (c repairCase) args() []string {
	var a []string
	for _, s := range c.set {
		a = append(a, "--set", s)
	}
	return a
}

func TestRBACMatchesRepairMode(t *testing.T) {
	for _, c := range repairCases {
		t.Run(c.name, func(t *testing.T) {
			r := render(t, c.args()...)
			byName := map[string]*rbacv1.ClusterRole{}
			for _, cr := range r.Roles {
				byName[cr.Name] = cr
			}
			base := byName["nftmesh-agent"]
			if base == nil || len(base.Rules) != 1 || !equalRule(base.Rules[0], podRead) {
				t.Errorf("the agent's role must be exactly get, list and watch pods: %+v", base)
			}
			rep := byName["nftmesh-agent-repair"]
			switch {
			case c.rules == nil && rep != nil:
				t.Errorf("repair role rendered without a repair mode: %+v", rep.Rules)
			case c.rules != nil && rep == nil:
				t.Fatal("no repair role")
			case c.rules != nil:
				if len(rep.Rules) != len(c.rules) {
					t.Fatalf("repair rules %+v, want %+v", rep.Rules, c.rules)
				}
				for i := range c.rules {
					if !equalRule(rep.Rules[i], c.rules[i]) {
						t.Errorf("repair rule %d: %+v, want %+v", i, rep.Rules[i], c.rules[i])
					}
				}
			}
			for _, b := range r.Bindings {
				if byName[b.RoleRef.Name] == nil || len(b.Subjects) != 1 || b.Subjects[0].Name != "nftmesh-agent" || b.Subjects[0].Namespace != "nftmesh-system" {
					t.Errorf("binding %s: %+v", b.Name, b)
				}
			}
			if len(r.Bindings) != len(r.Roles) {
				t.Errorf("%d roles, %d bindings", len(r.Roles), len(r.Bindings))
			}
			ds := r.ds(t)
			c0 := ds.Spec.Template.Spec.Containers[0]
			if got := c0.SecurityContext.Capabilities.Add; !slices.Equal(got, c.caps) {
				t.Errorf("capabilities %v, want %v", got, c.caps)
			}
			if (hostPath(ds, "host-proc") == "/proc") != c.hostProc {
				t.Errorf("/proc mount: %v", hostPath(ds, "host-proc"))
			}
			env := r.agentEnv(t)
			cfg, err := installer.ParseConfig(nil, func(k string) (string, bool) { v, ok := env[k]; return v, ok })
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Repair.Mode() != c.mode {
				t.Errorf("the agent's repair mode %q, want %q", cfg.Repair.Mode(), c.mode)
			}
			if c.hostProc {
				mounted := ""
				for _, vm := range c0.VolumeMounts {
					if vm.Name == "host-proc" {
						mounted = vm.MountPath
					}
				}
				if mounted == "" || mounted != cfg.Repair.HostProc {
					t.Errorf("host /proc mounted at %q, the agent looks in %q", mounted, cfg.Repair.HostProc)
				}
			}
		})
	}
}

func equalRule(a, b rbacv1.PolicyRule) bool {
	return slices.Equal(a.APIGroups, b.APIGroups) && slices.Equal(a.Resources, b.Resources) &&
		slices.Equal(a.Verbs, b.Verbs) && slices.Equal(a.ResourceNames, b.ResourceNames) && len(a.NonResourceURLs) == 0
}
