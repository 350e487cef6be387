package charts

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/nftmesh/nftmesh/installer/nodetaint"
	"github.com/nftmesh/nftmesh/testkit/kubetest"
)

// The chart's node rights, installed into a real API server, with the
// agent's token bound to its pod on node-1 as kubelet's projected token is:
// the agent takes its not-ready taint off node-1 and leaves node-1's other
// taints; it cannot take it off node-2, nor add a taint or change a label
// on node-1, nor change any node with a token not bound to a pod. RBAC
// alone (nodes get/patch) would allow all of that: the chart's admission
// policy is what refuses it.
func TestChartAgentPatchesOnlyItsOwnNode(t *testing.T) {
	helm(t)
	s := kubetest.Start(t)
	ctx := context.Background()
	admin := s.Client()
	kc := filepath.Join(t.TempDir(), "admin.kubeconfig")
	if err := s.WriteKubeconfig(kc, s.AdminToken()); err != nil {
		t.Fatal(err)
	}
	if _, err := runHelm(t, "install", "nftmesh", chartDir, "--kubeconfig", kc, "--namespace", agentNS, "--create-namespace"); err != nil {
		t.Fatal(err)
	}
	waitChartRBAC(t, s)
	if _, err := admin.AdmissionregistrationV1().ValidatingAdmissionPolicies().Get(ctx, "nftmesh-agent-own-node", metav1.GetOptions{}); err != nil {
		t.Fatalf("the chart installed no own-node policy on a 1.3x API server: %v", err)
	}

	maintenance := corev1.Taint{Key: "example.com/maintenance", Effect: corev1.TaintEffectNoSchedule}
	for _, n := range []string{"node-1", "node-2"} {
		_, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: n, Labels: map[string]string{"kubernetes.io/hostname": n}},
			Spec: corev1.NodeSpec{Taints: []corev1.Taint{
				{Key: nodetaint.DefaultKey, Effect: corev1.TaintEffectNoSchedule}, maintenance,
				{Key: nodetaint.DefaultKey, Effect: corev1.TaintEffectNoExecute},
			}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
	}
	// The agent's pod on node-1 and a token bound to it, as kubelet
	// projects it: the API server puts the pod's node in the token.
	pod, err := admin.CoreV1().Pods(agentNS).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "nftmesh-agent-x1"},
		Spec: corev1.PodSpec{NodeName: "node-1", ServiceAccountName: "nftmesh-agent",
			Containers: []corev1.Container{{Name: "agent", Image: "registry.example/nftmesh:1"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	exp := int64(3600)
	tr, err := admin.CoreV1().ServiceAccounts(agentNS).CreateToken(ctx, "nftmesh-agent", &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &exp,
			BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	agent := kubernetes.NewForConfigOrDie(s.ConfigFor(tr.Status.Token))
	unbound := kubernetes.NewForConfigOrDie(s.ConfigFor(s.TokenFor(t, agentNS, "nftmesh-agent")))

	// RBAC lets the agent's account patch any node: the policy must be
	// what stops it.
	sar, err := admin.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User:               "system:serviceaccount:" + agentNS + ":nftmesh-agent",
		Groups:             []string{"system:serviceaccounts", "system:serviceaccounts:" + agentNS, "system:authenticated"},
		ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: "patch", Resource: "nodes", Name: "node-2"},
	}}, metav1.CreateOptions{})
	if err != nil || !sar.Status.Allowed {
		t.Fatalf("RBAC does not grant the agent nodes patch: %v %+v", err, sar.Status)
	}

	taints := func(node string) []string {
		n, err := admin.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, x := range n.Spec.Taints {
			// TaintNodesByCondition's node.kubernetes.io/not-ready on a
			// new node is the node lifecycle's, not ours.
			if strings.HasPrefix(x.Key, "node.kubernetes.io/") {
				continue
			}
			out = append(out, x.Key+":"+string(x.Effect))
		}
		return out
	}
	all := []string{nodetaint.DefaultKey + ":NoSchedule", "example.com/maintenance:NoSchedule", nodetaint.DefaultKey + ":NoExecute"}

	// The admission policy is enforced a moment after it is created:
	// wait until a change it refuses (adding a taint, dry run) is refused.
	add := `[{"op":"add","path":"/spec/taints/-","value":{"key":"example.com/x","effect":"NoSchedule"}}]`
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		_, err := agent.CoreV1().Nodes().Patch(ctx, "node-1", types.JSONPatchType, []byte(add), metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}})
		if apierrors.IsForbidden(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the node admission policy is not enforced after 60 s: a dry-run taint add gave %v", err)
		}
	}

	// Another node, with the agent's own token: refused, untouched.
	if _, err := (&nodetaint.Untainter{Client: agent.CoreV1(), Node: "node-2", Key: nodetaint.DefaultKey}).Remove(ctx); !apierrors.IsForbidden(err) {
		t.Errorf("untainting node-2 from node-1's agent: %v, want forbidden", err)
	}
	// Its own node with a token bound to no pod: refused.
	if _, err := (&nodetaint.Untainter{Client: unbound.CoreV1(), Node: "node-1", Key: nodetaint.DefaultKey}).Remove(ctx); !apierrors.IsForbidden(err) {
		t.Errorf("untainting node-1 with an unbound token: %v, want forbidden", err)
	}
	// Its own node, but adding a taint or changing a label: refused.
	if _, err := agent.CoreV1().Nodes().Patch(ctx, "node-1", types.JSONPatchType, []byte(add), metav1.PatchOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("adding a taint to its own node: %v, want forbidden", err)
	}
	label := `{"metadata":{"labels":{"node-role.kubernetes.io/control-plane":""}}}`
	if _, err := agent.CoreV1().Nodes().Patch(ctx, "node-1", types.MergePatchType, []byte(label), metav1.PatchOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("labelling its own node: %v, want forbidden", err)
	}
	unsched := `{"spec":{"unschedulable":true}}`
	if _, err := agent.CoreV1().Nodes().Patch(ctx, "node-1", types.MergePatchType, []byte(unsched), metav1.PatchOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("cordoning its own node: %v, want forbidden", err)
	}
	if got := taints("node-1"); !slices.Equal(got, all) {
		t.Fatalf("node-1 changed by refused requests: %v", got)
	}
	// Its own node: our taint goes (both effects), the other stays.
	n, err := (&nodetaint.Untainter{Client: agent.CoreV1(), Node: "node-1", Key: nodetaint.DefaultKey}).Remove(ctx)
	if err != nil || n != 2 {
		t.Fatalf("untainting its own node: %d, %v", n, err)
	}
	if got := taints("node-1"); !slices.Equal(got, []string{"example.com/maintenance:NoSchedule"}) {
		t.Errorf("node-1 taints %v, want only the maintenance taint", got)
	}
	if got := taints("node-2"); !slices.Equal(got, all) {
		t.Errorf("node-2 taints %v, want all three", got)
	}
	// Node reads are get only: no list of the cluster's nodes.
	if _, err := agent.CoreV1().Nodes().List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("listing nodes: %v, want forbidden", err)
	}
}

// With nodeTaint off the agent gets no node rights and the chart no
// policy; with podEvents off, no events rights.
func TestChartNodeRightsFollowValues(t *testing.T) {
	nodeRole := func(r *rendered) []string {
		var out []string
		for _, cr := range r.Roles {
			if cr.Name != "nftmesh-agent-node" {
				continue
			}
			for _, rule := range cr.Rules {
				for _, res := range rule.Resources {
					for _, v := range rule.Verbs {
						out = append(out, res+":"+v)
					}
				}
			}
		}
		return out
	}
	cases := []struct {
		name     string
		args     []string
		rules    []string
		policies int
	}{
		{"default", []string{"--kube-version", "1.31.0"}, []string{"nodes:get", "nodes:patch", "events:create", "events:patch"}, 1},
		{"no policy API (1.29)", []string{"--kube-version", "1.29.0"}, []string{"events:create", "events:patch"}, 0},
		{"taint off", []string{"--kube-version", "1.31.0", "--set", "nodeTaint.enabled=false"}, []string{"events:create", "events:patch"}, 0},
		{"events off", []string{"--kube-version", "1.31.0", "--set", "podEvents.enabled=false"}, []string{"nodes:get", "nodes:patch"}, 1},
		{"both off", []string{"--kube-version", "1.31.0", "--set", "podEvents.enabled=false", "--set", "nodeTaint.enabled=false"}, nil, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := render(t, c.args...)
			if got := nodeRole(r); !slices.Equal(got, c.rules) {
				t.Errorf("node role %v, want %v", got, c.rules)
			}
			if len(r.Policies) != c.policies || len(r.PolicyBindings) != c.policies {
				t.Errorf("%d policies, %d bindings; want %d", len(r.Policies), len(r.PolicyBindings), c.policies)
			}
			env := r.agentEnv(t)
			wantTaint := "true"
			if slices.Contains(c.args, "nodeTaint.enabled=false") {
				wantTaint = "false"
			}
			if env["NFTMESH_REMOVE_NODE_TAINT"] != wantTaint || env["NFTMESH_NODE_TAINT_KEY"] != nodetaint.DefaultKey {
				t.Errorf("agent env: remove %q key %q", env["NFTMESH_REMOVE_NODE_TAINT"], env["NFTMESH_NODE_TAINT_KEY"])
			}
		})
	}
	if _, err := runHelm(t, "template", "nftmesh", chartDir, "--set", "nodeTaint.key=not a key"); err == nil {
		t.Error("a taint key with spaces was accepted")
	}
}

// renderNotes renders the chart's NOTES.txt with helm template (which
// prints no notes): a copy of the chart holds them as a ConfigMap's data.
func renderNotes(t *testing.T, args ...string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "nftmesh")
	if err := os.CopyFS(dir, os.DirFS(chartDir)); err != nil {
		t.Fatal(err)
	}
	notes, err := os.ReadFile(filepath.Join(dir, "templates", "NOTES.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, "templates", "NOTES.txt")); err != nil {
		t.Fatal(err)
	}
	def := `{{- define "test.notes" -}}` + string(notes) + `{{- end -}}`
	cm := "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes\ndata:\n  notes: {{ include \"test.notes\" . | quote }}\n"
	if os.WriteFile(filepath.Join(dir, "templates", "_test_notes.tpl"), []byte(def), 0o644) != nil ||
		os.WriteFile(filepath.Join(dir, "templates", "test-notes.yaml"), []byte(cm), 0o644) != nil {
		t.Fatal("writing the notes templates")
	}
	out, err := runHelm(t, append([]string{"template", "nftmesh", dir, "-n", agentNS, "--show-only", "templates/test-notes.yaml"}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	var c corev1.ConfigMap
	strictDecode(t, []byte(out), &c)
	return c.Data["notes"]
}

// Where the chart grants no node rights (Kubernetes < 1.30, or helm
// template without --kube-version), the install notes say the agent will
// not remove the taint, why, and the ways out.
func TestNotesSayWhenTheAgentGetsNoNodeRights(t *testing.T) {
	noRights := []string{"NOT removed by the agent", "No node rights", "Kubernetes 1.30 or later", "--kube-version",
		"pilot.taint.enabled=true", "pilot.taint.namespace=" + agentNS, "nodeTaint.enabled=false", "once in its log"}
	cases := []struct {
		name      string
		args      []string
		want, not []string
	}{
		{"helm template without --kube-version", nil, append(noRights, "rendered for v1.20.0"), []string{"podLabels.k8s-app"}},
		{"1.29", []string{"--kube-version", "1.29.4"}, append(noRights, "rendered for v1.29.4"), nil},
		{"1.29 without istiod's label", []string{"--kube-version", "1.29.4", "--set", "podLabels.k8s-app=null"}, []string{"podLabels.k8s-app=istio-cni-node"}, nil},
		{"1.31", []string{"--kube-version", "1.31.0"}, []string{"Node taint cni.istio.io/not-ready: the agent takes it off its own node"}, []string{"No node rights", "NOT removed"}},
		{"the policy API listed", []string{"--api-versions", "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"}, []string{"takes it off its own node"}, []string{"No node rights"}},
		{"taint off", []string{"--set", "nodeTaint.enabled=false"}, []string{"left alone (nodeTaint.enabled=false)"}, []string{"No node rights"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			notes := renderNotes(t, c.args...)
			for _, w := range c.want {
				if !strings.Contains(notes, w) {
					t.Errorf("notes lack %q:\n%s", w, notes)
				}
			}
			for _, n := range c.not {
				if strings.Contains(notes, n) {
					t.Errorf("notes say %q:\n%s", n, notes)
				}
			}
		})
	}
}
