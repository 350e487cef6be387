package cluster

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/nftmesh/nftmesh/testkit/istiotest"
)

// The meshed conformance run's injector: a mutating webhook served by the
// test process on a socket in the first node's network namespace, where
// the apiserver calls it.
const (
	injectorName   = "nftmesh-conformance-injector"
	injectionLabel = "istio-injection" // what istiod's namespace selector reads
	// e2eRunLabel is on every namespace e2e.test creates.
	e2eRunLabel = "e2e-run"
	// relayTimeout bounds one relayed connection: specs hold connections
	// open through the proxy (netexec's /dial fan-out, exec streams) far
	// longer than the stand-ins' own 3 s exchanges.
	relayTimeout = "10m"
)

// injected counts the pods the injector added a sidecar to.
var injected atomic.Int64

// sidecar is what the injector adds to a pod: the istio-validation init
// container and the istio-proxy container of Istio's own injection
// (testdata/istio/injected), made offline by istiotest.Rewrite, with the
// proxy forwarding both ways; the pod annotations and labels the injector
// adds (nftmesh reads the capture settings from them).
type sidecar struct {
	validation, proxy corev1.Container
	native            bool // proxy is an init container with restartPolicy Always
	annotations       map[string]string
	labels            map[string]string
}

// Sidecar modes (NFTMESH_CONFORMANCE_SIDECAR): Istio's native sidecar
// (sidecar.istio.io/nativeSidecar, native-sidecar.yaml) or its classic
// one, an ordinary container after the app's (httpbin.yaml).
var sidecarTemplates = map[string]string{"native": "native-sidecar.yaml", "container": "httpbin.yaml"}

// injectedTemplate is the pod template of file's Deployment, rewritten
// with s.
func injectedTemplate(file string, s istiotest.Standin) (corev1.PodTemplateSpec, error) {
	data, err := os.ReadFile(filepath.Join(istiotest.TestdataDir(), "injected", file))
	if err != nil {
		return corev1.PodTemplateSpec{}, err
	}
	objs, err := istiotest.SplitManifests(data)
	if err != nil {
		return corev1.PodTemplateSpec{}, err
	}
	for _, o := range objs {
		if o.Kind != "Deployment" {
			continue
		}
		var dep appsv1.Deployment
		if err := yaml.Unmarshal(o.Raw, &dep); err != nil {
			return corev1.PodTemplateSpec{}, fmt.Errorf("%s: %w", file, err)
		}
		if err := istiotest.Rewrite(&dep.Spec.Template.Spec, s); err != nil {
			return corev1.PodTemplateSpec{}, fmt.Errorf("%s: %w", file, err)
		}
		return dep.Spec.Template, nil
	}
	return corev1.PodTemplateSpec{}, fmt.Errorf("%s has no Deployment", file)
}

// newSidecar takes the sidecar of mode out of Istio's injection. The
// containers keep no volume mounts: the stand-in needs none of the
// certificates, tokens and sockets Envoy mounts, which would not exist in
// the specs' namespaces.
func newSidecar(mode string) (sidecar, error) {
	tmpl, err := injectedTemplate(sidecarTemplates[mode], istiotest.Standin{Image: standinImage, ProxyForward: true})
	if err != nil {
		return sidecar{}, err
	}
	s := sidecar{native: mode == "native"}
	found := 0
	for _, c := range append(append([]corev1.Container(nil), tmpl.Spec.InitContainers...), tmpl.Spec.Containers...) {
		c.VolumeMounts = nil
		if c.SecurityContext == nil {
			c.SecurityContext = &corev1.SecurityContext{}
		}
		// The restricted Pod Security level, which many specs'
		// namespaces enforce, wants a seccomp profile.
		c.SecurityContext.SeccompProfile = &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}
		switch c.Name {
		case istiotest.ValidationContainer:
			s.validation = c
			found++
		case istiotest.ProxyContainer:
			c.Command = append([]string{c.Command[0], "-forward-inbound", "-relay-timeout=" + relayTimeout}, c.Command[1:]...)
			s.proxy = c
			found++
		}
	}
	if found != 2 {
		return s, fmt.Errorf("%s: want %s and %s, found %d of them", sidecarTemplates[mode], istiotest.ValidationContainer, istiotest.ProxyContainer, found)
	}
	s.annotations, s.labels = map[string]string{}, map[string]string{}
	for k, v := range tmpl.Annotations {
		s.annotations[k] = v
	}
	for k, v := range tmpl.Labels {
		if k != "app" && k != "version" {
			s.labels[k] = v
		}
	}
	return s, nil
}

// jsonPatch is one RFC 6902 operation.
type jsonPatch struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value"`
}

// injectPod returns the patch that adds the sidecar to pod, or nil for a
// pod Istio's injector leaves alone: host network, opted out, or injected
// already.
func (s sidecar) injectPod(pod *corev1.Pod) []jsonPatch {
	if pod.Spec.HostNetwork || pod.Annotations["sidecar.istio.io/inject"] == "false" || pod.Labels["sidecar.istio.io/inject"] == "false" {
		return nil
	}
	for _, c := range append(append([]corev1.Container(nil), pod.Spec.InitContainers...), pod.Spec.Containers...) {
		if c.Name == istiotest.ProxyContainer {
			return nil
		}
	}
	if len(pod.Spec.Containers) == 0 {
		return nil
	}
	ann := map[string]string{}
	for k, v := range pod.Annotations {
		ann[k] = v
	}
	for k, v := range s.annotations {
		ann[k] = v
	}
	// As Istio's injector does: kubectl's default container stays the
	// app's first.
	ann["kubectl.kubernetes.io/default-container"] = pod.Spec.Containers[0].Name
	ann["kubectl.kubernetes.io/default-logs-container"] = pod.Spec.Containers[0].Name
	labels := map[string]string{}
	for k, v := range s.labels {
		labels[k] = v
	}
	for k, v := range pod.Labels {
		labels[k] = v
	}
	inits := append([]corev1.Container{s.validation}, pod.Spec.InitContainers...)
	containers := append([]corev1.Container(nil), pod.Spec.Containers...)
	if s.native {
		inits = append([]corev1.Container{s.validation, s.proxy}, pod.Spec.InitContainers...)
	} else {
		containers = append(containers, s.proxy)
	}
	return []jsonPatch{
		{"add", "/metadata/annotations", ann},
		{"add", "/metadata/labels", labels},
		{"add", "/spec/initContainers", inits},
		{"add", "/spec/containers", containers},
	}
}

// review answers one AdmissionReview with mutate's patch (nil: allowed
// unchanged).
func review(w http.ResponseWriter, r *http.Request, mutate func(raw []byte) ([]jsonPatch, error)) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 8<<20))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var ar admissionv1.AdmissionReview
	if err := json.Unmarshal(body, &ar); err != nil || ar.Request == nil {
		http.Error(w, fmt.Sprintf("not an AdmissionReview: %v", err), http.StatusBadRequest)
		return
	}
	resp := &admissionv1.AdmissionResponse{UID: ar.Request.UID, Allowed: true}
	patch, err := mutate(ar.Request.Object.Raw)
	switch {
	case err != nil:
		resp.Allowed = false
		resp.Result = &metav1.Status{Message: err.Error()}
	case patch != nil:
		data, err := json.Marshal(patch)
		if err != nil {
			resp.Allowed = false
			resp.Result = &metav1.Status{Message: err.Error()}
			break
		}
		pt := admissionv1.PatchTypeJSONPatch
		resp.Patch, resp.PatchType = data, &pt
	}
	ar.Response, ar.Request = resp, nil
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(&ar)
}

// injectorHandler serves /namespace (labels every namespace e2e.test
// creates for injection) and /pod (adds the sidecar).
func injectorHandler(s sidecar) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/namespace", func(w http.ResponseWriter, r *http.Request) {
		review(w, r, func(raw []byte) ([]jsonPatch, error) {
			var ns corev1.Namespace
			if err := json.Unmarshal(raw, &ns); err != nil {
				return nil, fmt.Errorf("decoding the namespace: %w", err)
			}
			labels := map[string]string{injectionLabel: "enabled"}
			for k, v := range ns.Labels {
				labels[k] = v
			}
			return []jsonPatch{{"add", "/metadata/labels", labels}}, nil
		})
	})
	mux.HandleFunc("/pod", func(w http.ResponseWriter, r *http.Request) {
		review(w, r, func(raw []byte) ([]jsonPatch, error) {
			var pod corev1.Pod
			if err := json.Unmarshal(raw, &pod); err != nil {
				return nil, fmt.Errorf("decoding the pod: %w", err)
			}
			p := s.injectPod(&pod)
			if p != nil {
				injected.Add(1)
			}
			return p, nil
		})
	})
	return mux
}

// startInjector serves the injector in the node's network namespace and
// registers it; stop unregisters it and stops the server.
func (c *Cluster) startInjector(ctx context.Context, t *testing.T, mode string) (stop func(), err error) {
	s, err := newSidecar(mode)
	if err != nil {
		return nil, err
	}
	certFile, keyFile, err := c.pki.issue("injector", "injector", nil, []string{"127.0.0.1"})
	if err != nil {
		return nil, err
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("loading the injector's certificate: %w", err)
	}
	ca, err := os.ReadFile(c.pki.CA)
	if err != nil {
		return nil, err
	}
	l, err := c.listenInNode("127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: injectorHandler(s), ReadHeaderTimeout: 10 * time.Second,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}}
	served := make(chan error, 1)
	go func() { served <- srv.ServeTLS(l, "", "") }()
	base := "https://" + l.Addr().String()
	fail := admissionregistrationv1.Fail
	none := admissionregistrationv1.SideEffectClassNone
	timeout := int32(10)
	hook := func(name, path, resource string) admissionregistrationv1.MutatingWebhook {
		url := base + path
		return admissionregistrationv1.MutatingWebhook{
			Name:                    name,
			ClientConfig:            admissionregistrationv1.WebhookClientConfig{URL: &url, CABundle: ca},
			Rules:                   []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create}, Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{resource}}}},
			FailurePolicy:           &fail,
			SideEffects:             &none,
			TimeoutSeconds:          &timeout,
			AdmissionReviewVersions: []string{"v1"},
		}
	}
	nsHook := hook("namespaces.conformance.nftmesh.test", "/namespace", "namespaces")
	nsHook.ObjectSelector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: e2eRunLabel, Operator: metav1.LabelSelectorOpExists}}}
	podHook := hook("pods.conformance.nftmesh.test", "/pod", "pods")
	podHook.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{injectionLabel: "enabled"}}
	cfg := &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: injectorName},
		Webhooks:   []admissionregistrationv1.MutatingWebhook{nsHook, podHook},
	}
	api := c.Client.AdmissionregistrationV1().MutatingWebhookConfigurations()
	if _, err := api.Create(ctx, cfg, metav1.CreateOptions{}); err != nil {
		_ = srv.Close()
		return nil, fmt.Errorf("registering the injector: %w", err)
	}
	injected.Store(0)
	return func() {
		if err := api.Delete(context.Background(), injectorName, metav1.DeleteOptions{}); err != nil {
			t.Errorf("unregistering the injector: %v", err)
		}
		_ = srv.Close()
		if err := <-served; err != nil && !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("the injector's server: %v", err)
		}
	}, nil
}

// TestInjectPod: the injector's patch in both modes, and the pods it
// leaves alone (host network, opted out, injected already).
func TestInjectPod(t *testing.T) {
	app := corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "x"}, Annotations: map[string]string{"a": "b"}},
		Spec:       corev1.PodSpec{InitContainers: []corev1.Container{{Name: "init"}}, Containers: []corev1.Container{{Name: "web"}, {Name: "b"}}},
	}
	names := func(cs []corev1.Container) (out []string) {
		for _, c := range cs {
			out = append(out, c.Name)
		}
		return out
	}
	for mode, want := range map[string][2]string{
		"native":    {"istio-validation,istio-proxy,init", "web,b"},
		"container": {"istio-validation,init", "web,b,istio-proxy"},
	} {
		t.Run(mode, func(t *testing.T) {
			s, err := newSidecar(mode)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Contains(s.proxy.Command, "-forward-inbound") || !slices.Contains(s.proxy.Command, "-forward") {
				t.Errorf("proxy command %q, want -forward and -forward-inbound", s.proxy.Command)
			}
			p := s.injectPod(app.DeepCopy())
			if len(p) != 4 {
				t.Fatalf("patch %+v", p)
			}
			ann, labels := p[0].Value.(map[string]string), p[1].Value.(map[string]string)
			if ann["a"] != "b" || ann["kubectl.kubernetes.io/default-container"] != "web" || ann["sidecar.istio.io/status"] == "" {
				t.Errorf("annotations %v", ann)
			}
			if labels["app"] != "x" || labels["security.istio.io/tlsMode"] != "istio" {
				t.Errorf("labels %v", labels)
			}
			if got := strings.Join(names(p[2].Value.([]corev1.Container)), ","); got != want[0] {
				t.Errorf("init containers %s, want %s", got, want[0])
			}
			if got := strings.Join(names(p[3].Value.([]corev1.Container)), ","); got != want[1] {
				t.Errorf("containers %s, want %s", got, want[1])
			}
			host := app.DeepCopy()
			host.Spec.HostNetwork = true
			out := app.DeepCopy()
			out.Annotations["sidecar.istio.io/inject"] = "false"
			done := app.DeepCopy()
			done.Spec.InitContainers = p[2].Value.([]corev1.Container)
			done.Spec.Containers = p[3].Value.([]corev1.Container)
			for name, pod := range map[string]*corev1.Pod{"host network": host, "opted out": out, "injected": done} {
				if p := s.injectPod(pod); p != nil {
					t.Errorf("%s: patched %+v", name, p)
				}
			}
		})
	}
}
