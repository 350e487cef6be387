// Package istiotest gives tests Istio itself: its real binaries, built from
// the pinned istio.io/istio module through the Go module proxy
// (build-istio.sh next to this file; `make istio`), and the Istio-injected
// manifests Istio's own injector wrote into testdata/istio (regenerated and
// diffed by this package's TestIstioInjectGolden; `make istio-manifests`).
//
// Binaries land in the repository's .cache directory: .cache/pilot-agent
// (whose `istio-iptables ... --run-validation --skip-rule-apply` mode is what
// the injected istio-validation init container runs) and .cache/istioctl
// (only needed to regenerate the manifests). ISTIO_PILOT_AGENT_BIN and
// ISTIOCTL_BIN override the paths.
//
// Rewrite turns an injected pod spec into one that runs offline: Istio's
// real pilot-agent stays in istio-validation with its injected arguments;
// istio-proxy and the app containers become the stand-ins of
// e2e/cluster/standin. Everything else stays as the injector wrote it.
// StandinImage builds the one image those containers run (`make
// pilot-agent standin` builds its inputs).
//
// What each pod of testdata/istio/injected then does on a node with
// nftmesh (TestInjectedPodsInNetns proves each in a network namespace):
//
//   - every mesh pod: istio-validation exits 0 (126 without capture);
//     istio-proxy logs "ready" and answers 15021 /healthz/ready, so the
//     injected readiness (and native-sidecar startup) probes pass; the
//     app's dials to a destination land on its own proxy, whose Reply
//     names listener outbound-15001 and the original destination; another
//     pod's connection to the app's port lands on inbound-15006 with the
//     original destination; the proxy's own dials (UID 1337, or GID 1337
//     under TPROXY) reach the destination itself;
//   - tproxy: the proxy runs as UID 0 / GID 1337 with NET_ADMIN and its
//     15001/15006 are IP_TRANSPARENT; inbound arrives by TPROXY (original
//     destination = local address);
//   - dns-capture: UDP (and TCP) to any port 53 lands on dns-15053;
//   - exclude-cidrs: dials to 10.244.0.0/16 (the pod network) and
//     203.0.113.0/24 leave without its proxy (a mesh destination's own
//     inbound capture still applies: dial the no-inject pod to see the
//     app answer);
//   - include-inbound-ports: inbound 8080 lands on 15006, 9090 on the app;
//   - native-sidecar: istio-proxy is an init container with restartPolicy
//     Always; the app starts after its startup probe passed;
//   - no-inject: no istio containers, no capture: the app's dials and the
//     inbound connections reach their destination directly.
//
// Injected pods mount the ConfigMap istio-ca-root-cert (not optional) and a
// service account token for audience istio-ca: the namespace needs that
// ConfigMap (any root-cert.pem) or the pods stay in ContainerCreating.
//
// It is a test helper: only tests import it.
package istiotest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// ModuleVersion is the istio.io/istio module the binaries are built from
// (the tools module's go.mod pins it; a test checks they agree). The proxy
// serves istio.io/istio only as pseudo-versions of its master branch.
const ModuleVersion = "v0.0.0-20260827124520-eed52ebb66ad"

// BinaryVersion is the version build-istio.sh stamps into the binaries: the
// release line of that master commit, the way Istio's Makefile stamps its
// own master builds.
const BinaryVersion = "1.31-dev"

// RepoRoot is the repository's top directory.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// TestdataDir is where the injector's inputs and outputs live.
func TestdataDir() string { return filepath.Join(RepoRoot(), "testdata", "istio") }

// PilotAgent is the path of Istio's pilot-agent, or an error saying how to
// build it.
func PilotAgent() (string, error) { return binary("ISTIO_PILOT_AGENT_BIN", "pilot-agent") }

// Istioctl is the path of istioctl, or an error saying how to build it.
func Istioctl() (string, error) { return binary("ISTIOCTL_BIN", "istioctl") }

func binary(env, name string) (string, error) {
	p := os.Getenv(env)
	if p == "" {
		p = filepath.Join(RepoRoot(), ".cache", name)
	}
	if st, err := os.Stat(p); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
		return "", fmt.Errorf("%s (from istio.io/istio) is not built at %s: run `make istio`, or set %s", name, p, env)
	}
	return p, nil
}

// Object is one document of a manifest file: its kind and name, and the
// document itself.
type Object struct {
	Kind, Name string
	Raw        []byte
}

// SplitManifests splits a multi-document YAML stream into its objects,
// skipping empty documents.
func SplitManifests(data []byte) ([]Object, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var out []Object
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("splitting manifests: %w", err)
		}
		var m struct {
			metav1.TypeMeta   `json:",inline"`
			metav1.ObjectMeta `json:"metadata"`
		}
		if err := yaml.Unmarshal(doc, &m); err != nil {
			return nil, fmt.Errorf("decoding manifest document %d: %w", len(out)+1, err)
		}
		if m.Kind == "" {
			continue
		}
		out = append(out, Object{Kind: m.Kind, Name: m.Name, Raw: doc})
	}
}

// PodTemplate returns the pod of a Deployment or Pod document: the metadata
// and spec the injector rewrote.
func PodTemplate(o Object) (metav1.ObjectMeta, corev1.PodSpec, error) {
	switch o.Kind {
	case "Deployment":
		var d appsv1.Deployment
		if err := yaml.Unmarshal(o.Raw, &d); err != nil {
			return metav1.ObjectMeta{}, corev1.PodSpec{}, fmt.Errorf("decoding Deployment %s: %w", o.Name, err)
		}
		return d.Spec.Template.ObjectMeta, d.Spec.Template.Spec, nil
	case "Pod":
		var p corev1.Pod
		if err := yaml.Unmarshal(o.Raw, &p); err != nil {
			return metav1.ObjectMeta{}, corev1.PodSpec{}, fmt.Errorf("decoding Pod %s: %w", o.Name, err)
		}
		return p.ObjectMeta, p.Spec, nil
	}
	return metav1.ObjectMeta{}, corev1.PodSpec{}, fmt.Errorf("%s %s has no pod template", o.Kind, o.Name)
}
