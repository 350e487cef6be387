// Package charts holds the tests of the Helm chart in ./nftmesh: lint and
// template for every profile, strict decoding of every rendered object,
// the schema, RBAC per repair mode, and an install into a real API server.
package charts

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/nftmesh/nftmesh/installer"
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
	SA            []*corev1.ServiceAccount
	Roles         []*rbacv1.ClusterRole
	Bindings      []*rbacv1.ClusterRoleBinding
	ConfigMaps    []*corev1.ConfigMap
	DaemonSets    []*appsv1.DaemonSet
	NADs          []*nad
	Raw           string
	ObjectsByKind map[string]int
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
	out, err := runHelm(t, append([]string{"template", "nftmesh", chartDir, "--namespace", "nftmesh-system"}, args...)...)
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

type profile struct {
	file             string
	binDir, confDir  string
	chained          bool
	confName         string
	wantNAD, wantSCC bool
}

var profiles = []profile{
	{file: "", binDir: "/opt/cni/bin", confDir: "/etc/cni/net.d", chained: true},
	{file: "values-gke.yaml", binDir: "/home/kubernetes/bin", confDir: "/etc/cni/net.d", chained: true},
	{file: "values-openshift.yaml", binDir: "/var/lib/cni/bin", confDir: "/etc/cni/multus/net.d", chained: false, confName: "nftmesh-cni.conf", wantNAD: true, wantSCC: true},
	{file: "values-k3s.yaml", binDir: "/var/lib/rancher/k3s/data/cni", confDir: "/var/lib/rancher/k3s/agent/etc/cni/net.d", chained: true},
	{file: "values-microk8s.yaml", binDir: "/var/snap/microk8s/current/opt/cni/bin", confDir: "/var/snap/microk8s/current/args/cni-network", chained: true},
	{file: "values-minikube.yaml", binDir: "/opt/cni/bin", confDir: "/etc/cni/net.d", chained: true},
}

func TestLintAndTemplateEveryProfile(t *testing.T) {
	files, _ := filepath.Glob(filepath.Join(chartDir, "values-*.yaml"))
	if len(files) != len(profiles)-1 {
		t.Fatalf("profiles on disk %v do not match the test table", files)
	}
	for _, p := range profiles {
		name := p.file
		if name == "" {
			name = "default"
		}
		t.Run(name, func(t *testing.T) {
			var args []string
			if p.file != "" {
				args = []string{"-f", filepath.Join(chartDir, p.file)}
			}
			if out, err := runHelm(t, append([]string{"lint", "--strict", chartDir}, args...)...); err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			r := render(t, args...)
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
			if len(r.SA) != 1 || spec.ServiceAccountName != r.SA[0].Name {
				t.Errorf("service account")
			}
			if (len(r.NADs) == 1) != p.wantNAD {
				t.Errorf("NetworkAttachmentDefinition: %d", len(r.NADs))
			}
			scc := slices.ContainsFunc(r.Roles, func(cr *rbacv1.ClusterRole) bool {
				return slices.ContainsFunc(cr.Rules, func(pr rbacv1.PolicyRule) bool { return slices.Contains(pr.Resources, "securitycontextconstraints") })
			})
			if scc != p.wantSCC {
				t.Errorf("SCC rule present: %v", scc)
			}

			// The agent accepts the rendered configuration, and it means
			// what the profile says.
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
			mounts := map[string]string{}
			for _, m := range c.VolumeMounts {
				mounts[m.Name] = m.MountPath
			}
			if mounts["cni-bin-dir"] != cfg.CNIBinDirs[0] || mounts["cni-conf-dir"] != cfg.CNIConfDir || mounts["agent-run-dir"] != cfg.AgentRunDir {
				t.Errorf("mounts %v do not match the agent's dirs %v %s %s", mounts, cfg.CNIBinDirs, cfg.CNIConfDir, cfg.AgentRunDir)
			}
			if got := r.agentEnv(t)["NFTMESH_HEALTH_ADDR"]; got != fmt.Sprintf(":%d", rpPort(c)) {
				t.Errorf("health addr %s vs probe port", got)
			}
		})
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
		{"image.tagg=x", "tagg"},
		{"chained=maybe", "chained"},
		{"backend=nft", "backend"},
		{"cniBinDir=relative/bin", "cniBinDir"},
		{"cniConfFileName=x.yaml", "cniConfFileName"},
		{"excludeNamespaces[0]=Bad_NS", "excludeNamespaces"},
		{"logging.level=loud", "level"},
		{"apiTimeout=soon", "apiTimeout"},
		{"metricsPort=70000", "metricsPort"},
		{"repair.initContainerExitCode=300", "initContainerExitCode"},
	}
	for _, b := range bad {
		t.Run(b.set, func(t *testing.T) {
			flag := "--set"
			if strings.Contains(b.set, "=maybe") || strings.Contains(b.set, "Port=") {
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
	if _, err := runHelm(t, "template", "nftmesh", chartDir, "--set", "chained=false", "--set", "cniConfFileName=nftmesh-cni.conf", "--set", "logging.level=debug"); err != nil {
		t.Errorf("valid values rejected: %v", err)
	}
}

type repairCase struct {
	name     string
	set      []string
	mode     installer.RepairMode
	rules    []rbacv1.PolicyRule // of the repair ClusterRole; nil: no such role
	caps     []corev1.Capability
	hostProc bool
}

var podGet = rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get"}}

var repairCases = []repairCase{
	{name: "off", set: []string{"repair.enabled=false"}, mode: installer.RepairNone, caps: []corev1.Capability{"NET_ADMIN"}},
	{name: "enabled-no-mode", set: []string{"repair.repairPods=false"}, mode: installer.RepairNone, caps: []corev1.Capability{"NET_ADMIN"}},
	{name: "delete", set: []string{"repair.repairPods=false", "repair.deletePods=true"}, mode: installer.RepairDelete, caps: []corev1.Capability{"NET_ADMIN"}, rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list", "watch", "delete"}},
		{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create"}},
	}},
	{name: "label", set: []string{"repair.repairPods=false", "repair.labelPods=true"}, mode: installer.RepairLabel, caps: []corev1.Capability{"NET_ADMIN"}, rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"pods/status"}, Verbs: []string{"patch"}},
		{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create"}},
	}},
	{name: "repair in place (default)", mode: installer.RepairInPlace, hostProc: true,
		caps: []corev1.Capability{"NET_ADMIN", "NET_RAW", "SYS_ADMIN", "SYS_PTRACE"}, rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list", "watch"}},
			{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create"}},
		}},
	{name: "repair in place, nftables backend", set: []string{"backend=nftables"}, mode: installer.RepairInPlace, hostProc: true,
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
			if base == nil || len(base.Rules) != 1 || !equalRule(base.Rules[0], podGet) {
				t.Errorf("the plugin's role must be exactly get pods: %+v", base)
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
