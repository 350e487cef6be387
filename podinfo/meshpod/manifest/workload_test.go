package manifest

import (
	"fmt"
	"strings"
	"testing"

	"github.com/nftmesh/nftmesh/podinfo/meshpod"
	"github.com/nftmesh/nftmesh/redirect"
)

// template is a pod template (at indent) of an injected sidecar pod.
func template(indent string) string {
	t := `template:
  metadata:
    labels: {app: web}
    annotations:
      sidecar.istio.io/status: '{}'
      traffic.sidecar.istio.io/excludeOutboundIPRanges: 192.0.2.1/32
      sidecar.istio.io/inject: true
  spec:
    containers:
    - name: app
    - name: istio-proxy
      args: [proxy, sidecar]
`
	return indent + strings.ReplaceAll(strings.TrimSuffix(t, "\n"), "\n", "\n"+indent) + "\n"
}

func workloadDoc(apiVersion, kind, namespace, name string) string {
	head := fmt.Sprintf("apiVersion: %s\nkind: %s\nmetadata:\n  name: %s\n  namespace: %s\nspec:\n", apiVersion, kind, name, namespace)
	if kind == "CronJob" {
		return head + "  schedule: '* * * * *'\n  jobTemplate:\n    spec:\n" + template("      ")
	}
	return head + "  replicas: 1\n" + template("  ")
}

// TestParseWorkload: every workload kind users have gives its pod
// template, as a pod of the workload's namespace and name; several
// workloads are refused naming each unless --name (NAME, NAMESPACE/NAME,
// KIND/NAME) picks one; bad ones are refused naming the document, the kind
// and the field.
func TestParseWorkload(t *testing.T) {
	svc := "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: shop}\n"
	web := workloadDoc("apps/v1", "Deployment", "shop", "web")
	db := workloadDoc("apps/v1", "StatefulSet", "shop", "db")
	for _, tc := range []struct {
		name, data, pick string
		kind, ref        string // the chosen object's kind and NAMESPACE/NAME
		err              []string
	}{
		{name: "Deployment", data: web, kind: "Deployment", ref: "shop/web"},
		{name: "StatefulSet", data: db, kind: "StatefulSet", ref: "shop/db"},
		{name: "DaemonSet", data: workloadDoc("apps/v1", "DaemonSet", "kube-system", "agent"), kind: "DaemonSet", ref: "kube-system/agent"},
		{name: "ReplicaSet", data: workloadDoc("apps/v1", "ReplicaSet", "shop", "web-5d9"), kind: "ReplicaSet", ref: "shop/web-5d9"},
		{name: "Job", data: workloadDoc("batch/v1", "Job", "shop", "migrate"), kind: "Job", ref: "shop/migrate"},
		{name: "CronJob", data: workloadDoc("batch/v1", "CronJob", "shop", "nightly"), kind: "CronJob", ref: "shop/nightly"},
		{name: "old extensions Deployment", data: workloadDoc("extensions/v1beta1", "Deployment", "shop", "web"), kind: "Deployment", ref: "shop/web"},
		{name: "Pod", data: podDoc("shop", "web-a"), kind: "Pod", ref: "shop/web-a"},
		{name: "kube-inject layout: service, then workload", data: "apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: web}\n---\n" + svc + "---\n" + web + "---\n", kind: "Deployment", ref: "shop/web"},
		{name: "JSON List of workloads, by kind", data: `{"kind":"List","items":[{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"web"},"spec":{"template":{"metadata":{"annotations":{"a":"b"}}}}},{"kind":"Pod","metadata":{"name":"web"}}]}`, pick: "deployment/web", kind: "Deployment", ref: "/web"},
		{name: "two workloads", data: web + "---\n" + db, err: []string{"2 objects", `Deployment "shop/web"`, `StatefulSet "shop/db"`, "choose one with --name", "KIND/NAME"}},
		{name: "two workloads, by name", data: web + "---\n" + db, pick: "db", kind: "StatefulSet", ref: "shop/db"},
		{name: "two workloads, by namespace/name", data: web + "---\n" + db, pick: "shop/web", kind: "Deployment", ref: "shop/web"},
		{name: "a pod and a workload of one name", data: web + "---\n" + podDoc("shop", "web"), pick: "web", err: []string{`2 objects are named "web"`, `Pod "shop/web"`, `Deployment "shop/web"`, "KIND/NAME"}},
		{name: "a pod and a workload of one name, by kind", data: web + "---\n" + podDoc("shop", "web"), pick: "Pod/web", kind: "Pod", ref: "shop/web"},
		{name: "unknown name", data: web + "---\n" + db, pick: "cache", err: []string{`named "cache"`, `Deployment "shop/web"`, `StatefulSet "shop/db"`}},
		{name: "only other kinds", data: svc + "---\nkind: ConfigMap\nmetadata: {name: c}\n", err: []string{"no Pod or workload (Deployment, StatefulSet, DaemonSet, ReplicaSet, Job, CronJob)", `Service "shop/web"`, `ConfigMap "c"`}},
		{name: "a lone Service", data: svc, err: []string{"no Pod or workload", `Service "shop/web"`}},
		{name: "no kind", data: "metadata: {name: x}\n", err: []string{"no Pod or workload", "without kind"}},
		{name: "empty", data: "", err: []string{"the manifest is empty"}},
		{name: "Deployment without a template", data: "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\nspec: {replicas: 1}\n", err: []string{`Deployment "web"`, "spec.template is missing"}},
		{name: "CronJob without a job template", data: "apiVersion: batch/v1\nkind: CronJob\nmetadata: {name: 1234}\nspec:\n" + template("  "), err: []string{`CronJob "1234"`, "spec.jobTemplate.spec.template is missing"}},
		{name: "Deployment of another group", data: workloadDoc("example.com/v1", "Deployment", "shop", "web"), err: []string{`Deployment "shop/web"`, `apiVersion is "example.com/v1"`, "apps/v1"}},
		{name: "Job of group apps", data: workloadDoc("apps/v1", "Job", "shop", "j"), err: []string{`apiVersion is "apps/v1"`, "batch/v1"}},
		{name: "bad field in the third document", data: svc + "---\n" + db + "---\n" + strings.Replace(web, "args: [proxy, sidecar]", "securityContext: {runAsUser: abc}", 1), pick: "web",
			err: []string{`Deployment "shop/web" (document 3)`, "runAsUser"}},
		{name: "template not a map", data: "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\nspec: {template: [1]}\n", err: []string{`Deployment "web"`, "template"}},
		{name: "bad YAML in the second document", data: web + "---\nkind: [\n", err: []string{"document 2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, err := ParseWorkload([]byte(tc.data), tc.pick)
			if len(tc.err) > 0 {
				if err == nil {
					t.Fatalf("chose %s, want an error", o.Subject())
				}
				for _, w := range tc.err {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q does not say %s", err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if o.Kind != tc.kind || o.Namespace+"/"+o.Name != tc.ref {
				t.Errorf("chose %s %s/%s, want %s %s", o.Kind, o.Namespace, o.Name, tc.kind, tc.ref)
			}
			if o.Pod.Namespace != o.Namespace || o.Pod.Name != o.Name {
				t.Errorf("pod %s/%s for %s", o.Pod.Namespace, o.Pod.Name, o.Subject())
			}
			if o.Kind == "Pod" || tc.ref == "/web" {
				return
			}
			// The template's metadata and containers, scalars bound for
			// strings read as text.
			if o.Pod.Annotations["sidecar.istio.io/inject"] != "true" || o.Pod.Labels["app"] != "web" || len(o.Pod.Containers) != 2 {
				t.Errorf("template read as %+v", o.Pod)
			}
			in, _, spec, err := meshpod.Decide(o.Pod)
			if err != nil || !in || len(spec.OutboundIPRangesExclude) != 1 {
				t.Errorf("decision on the template: in=%t %v %+v", in, err, spec.OutboundIPRangesExclude)
			}
		})
	}
}

// TestParseWorkloadTemplateOwnNames: a template's own namespace and name,
// when it has them, are the pod's.
func TestParseWorkloadTemplateOwnNames(t *testing.T) {
	doc := "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web, namespace: shop}\nspec:\n  template:\n    metadata: {name: t, namespace: other}\n"
	o, err := ParseWorkload([]byte(doc), "")
	if err != nil {
		t.Fatal(err)
	}
	if o.Subject() != "Deployment shop/web" || o.Pod.Namespace != "other" || o.Pod.Name != "t" {
		t.Errorf("%s: pod %s/%s", o.Subject(), o.Pod.Namespace, o.Pod.Name)
	}
}

// FuzzParseWorkload: any stream and name give an object or an error, never
// a panic; an object picked by name has that name; a template the decision
// puts in the mesh without error builds a plan.
func FuzzParseWorkload(f *testing.F) {
	f.Add([]byte(workloadDoc("apps/v1", "Deployment", "shop", "web")+"---\n"+workloadDoc("batch/v1", "CronJob", "shop", "n")), "cronjob/n")
	f.Add([]byte(workloadDoc("batch/v1", "Job", "shop", "j")), "")
	f.Add([]byte(`{"kind":"List","items":[{"kind":"StatefulSet","metadata":{"name":"a"},"spec":{"template":{}}}]}`), "a")
	f.Add([]byte("kind: CronJob\nspec: {jobTemplate: {spec: {template: 5}}}\n"), "")
	f.Add([]byte(podDoc("shop", "a")), "shop/a")
	f.Add([]byte(`[{"kind":"Pod"}]`), "")
	f.Add([]byte("kind: Pod\nmetadata: {annotations: [a]}\n"), "")
	f.Add([]byte("# nothing\n---\n"), "")
	f.Fuzz(func(t *testing.T, data []byte, name string) {
		o, err := ParseWorkload(data, name)
		if err != nil {
			for _, leak := range goLeaks {
				if strings.Contains(err.Error(), leak) {
					t.Fatalf("error %q names Go's types (%q)", err, leak)
				}
			}
			return
		}
		if name != "" {
			first, n, ok := strings.Cut(name, "/")
			if !ok && o.Name != name || ok && (o.Name != n || first != o.Namespace && !strings.EqualFold(first, o.Kind)) {
				t.Fatalf("asked for %q, got %s", name, o.Subject())
			}
		}
		in, reason, spec, err := meshpod.Decide(o.Pod)
		if err != nil {
			if !in || reason != meshpod.ReasonInvalid {
				t.Fatalf("error %v with inMesh=%t reason=%q: errors must fail closed", err, in, reason)
			}
			return
		}
		if in {
			if _, err := redirect.Build(spec); err != nil {
				t.Fatalf("in-mesh spec does not build: %v", err)
			}
		}
	})
}
