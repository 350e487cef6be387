// Package meshpod is the pure in-mesh decision: from the few Pod fields
// Istio's CNI reads, whether the pod gets capture rules and with which
// redirect.Spec. It imports nothing from Kubernetes, so the `redirect` CLI
// reads manifests without client-go's start-up cost; podinfo.Mesh adapts a
// *corev1.Pod to it.
package meshpod

import (
	"fmt"
	"math"
	"strconv"

	"github.com/nftmesh/nftmesh/redirect"
	"github.com/nftmesh/nftmesh/redirect/quote"
)

// Container names and environment variables Istio's injector uses.
const (
	ProxyContainer = "istio-proxy"
	InitContainer  = "istio-init"

	EnvDisableEnvoy = "DISABLE_ENVOY"
	EnvDNSCapture   = "ISTIO_META_DNS_CAPTURE"
	EnvDualStack    = "ISTIO_DUAL_STACK"
	EnvInvalidDrop  = "INVALID_DROP"
)

// Reasons Decide and the plugin's pre-lookup checks give; stable, as logs
// and tests match on them.
const (
	ReasonNotKubernetes       = "not a kubernetes pod"
	ReasonExcludedNamespace   = "namespace excluded"
	ReasonAgentPod            = "agent's own pod"
	ReasonIstioInit           = "istio-init container present"
	ReasonEnvoyDisabled       = "DISABLE_ENVOY set on istio-proxy"
	ReasonNoProxy             = "no istio-proxy container"
	ReasonNotSidecar          = "proxy is not a sidecar (gateway)"
	ReasonInjectLabelFalse    = "inject=false label"
	ReasonInjectAnnotationOff = "inject=false annotation"
	ReasonNotInjected         = "no sidecar.istio.io/status annotation"
	ReasonInterceptionNone    = "interceptionMode NONE"
	ReasonInvalid             = "invalid capture settings"
	ReasonInMesh              = "injected sidecar"
)

// Pod is what the decision reads of a Kubernetes Pod.
type Pod struct {
	Namespace, Name string
	Labels          map[string]string
	Annotations     map[string]string
	InitContainers  []Container
	Containers      []Container
	PodIPs          []string // status.podIP and status.podIPs[].ip

	// NamespaceAnnotations are the pod's namespace's annotations, which
	// Linkerd's settings fall back to; nil when not read.
	NamespaceAnnotations map[string]string
	// Linkerd is the node's Linkerd settings; nil gives DefaultLinkerd.
	Linkerd *LinkerdConfig
	// APIServerPorts are the default/kubernetes Service's ports and numeric
	// target ports, which a Linkerd control plane pod's outbound capture
	// skips; nil gives linkerd-cni's fallback when it cannot read them,
	// 443 and 6443.
	APIServerPorts []string
}

// Container is what the decision reads of a container.
type Container struct {
	Name       string
	Args       []string
	Env        []EnvVar
	RunAsUser  *int64 // securityContext.runAsUser
	RunAsGroup *int64 // securityContext.runAsGroup
}

// EnvVar is a container env entry; Value is empty for valueFrom entries
// (Istio does not resolve them either).
type EnvVar struct{ Name, Value string }

// Decide decides whether pod gets sidecar capture rules and with which Spec.
//
// A pod with a linkerd-proxy container is Linkerd's, decided as
// linkerd-cni decides (decideLinkerd); every other pod is Istio's:
//
// The checks follow Istio's CNI plugin, in its order: an istio-init
// container (init or regular: the pod redirects itself); DISABLE_ENVOY=true
// on the proxy (proxyless); no istio-proxy container (init containers
// count, for native sidecars); proxy args "proxy X" with X not "sidecar"
// (a gateway); sidecar.istio.io/inject false (the label overrides the
// annotation); no sidecar.istio.io/status annotation (not injected). As in
// Istio, an unparsable DISABLE_ENVOY or inject value is not a skip.
// Unlike Istio, interceptionMode NONE is a skip too: the injector writes it
// (and no init container) when the user asks for no interception, and
// failing the sandbox would help nobody.
//
// An in-mesh pod's Spec starts from redirect.DefaultSpec, takes the proxy's
// runAsUser/runAsGroup (0 or unset keeps 1337) and its literal, non-empty
// ISTIO_META_DNS_CAPTURE, INVALID_DROP and ISTIO_DUAL_STACK, predicts IPv6
// capture from the pod's IPs (IPv6Capture), then applies the annotations.
// All problems come back at once as a *redirect.ValidationError, with
// inMesh true so that the caller fails closed rather than skipping.
func Decide(pod *Pod) (inMesh bool, reason string, spec redirect.Spec, err error) {
	if pod == nil {
		return false, "", redirect.Spec{}, fmt.Errorf("deciding capture: no pod")
	}
	if proxy, init := linkerdProxy(pod); proxy {
		return decideLinkerd(pod, init)
	}
	var proxy *Container
	hasInit := false
	// Later containers win, as a name is unique per pod in valid objects.
	for _, list := range [][]Container{pod.InitContainers, pod.Containers} {
		for i := range list {
			switch list[i].Name {
			case InitContainer:
				hasInit = true
			case ProxyContainer:
				proxy = &list[i]
			}
		}
	}
	if hasInit {
		return false, ReasonIstioInit, redirect.Spec{}, nil
	}
	env := literalEnv(proxy)
	if v, ok := env[EnvDisableEnvoy]; ok {
		if b, perr := strconv.ParseBool(v); perr == nil && b {
			return false, ReasonEnvoyDisabled, redirect.Spec{}, nil
		}
	}
	if proxy == nil {
		return false, ReasonNoProxy, redirect.Spec{}, nil
	}
	if len(proxy.Args) >= 2 && proxy.Args[0] == "proxy" && proxy.Args[1] != "sidecar" {
		return false, ReasonNotSidecar, redirect.Spec{}, nil
	}
	if v, ok := pod.Labels[redirect.AnnotationInject]; ok {
		if b, perr := strconv.ParseBool(v); perr == nil && !b {
			return false, ReasonInjectLabelFalse, redirect.Spec{}, nil
		}
	} else if v, ok := pod.Annotations[redirect.AnnotationInject]; ok {
		if b, perr := strconv.ParseBool(v); perr == nil && !b {
			return false, ReasonInjectAnnotationOff, redirect.Spec{}, nil
		}
	}
	if _, ok := pod.Annotations[redirect.AnnotationSidecarStatus]; !ok {
		return false, ReasonNotInjected, redirect.Spec{}, nil
	}
	if redirect.WantsNoCapture(pod.Annotations) {
		return false, ReasonInterceptionNone, redirect.Spec{}, nil
	}

	spec, err = specFor(pod, proxy, env)
	if err != nil {
		return true, ReasonInvalid, redirect.Spec{}, fmt.Errorf("reading capture settings of pod %s: %w", quote.TextN(pod.Namespace+"/"+pod.Name, quote.MaxValue), err)
	}
	return true, ReasonInMesh, spec, nil
}

// literalEnv returns the proxy container's env vars with a literal,
// non-empty value. Later duplicates win, as in the kubelet.
func literalEnv(c *Container) map[string]string {
	env := map[string]string{}
	if c == nil {
		return env
	}
	for _, e := range c.Env {
		if e.Value == "" {
			delete(env, e.Name)
			continue
		}
		env[e.Name] = e.Value
	}
	return env
}

func specFor(pod *Pod, proxy *Container, env map[string]string) (redirect.Spec, error) {
	base := redirect.DefaultSpec()
	var problems []redirect.FieldError

	if id, fe := proxyID("runAsUser", proxy.RunAsUser); fe != nil {
		problems = append(problems, *fe)
	} else if id != 0 {
		base.ProxyUIDs = []uint32{id}
	}
	if id, fe := proxyID("runAsGroup", proxy.RunAsGroup); fe != nil {
		problems = append(problems, *fe)
	} else if id != 0 {
		base.ProxyGIDs = []uint32{id}
	}

	boolEnv := func(name string, dst *bool) {
		v, ok := env[name]
		if !ok {
			return
		}
		b, err := strconv.ParseBool(v)
		if err != nil {
			problems = append(problems, redirect.FieldError{
				Field:  "istio-proxy env " + name,
				Value:  v,
				Reason: "is not a boolean (want true or false)",
			})
			return
		}
		*dst = b
	}
	boolEnv(EnvDNSCapture, &base.CaptureDNS)
	boolEnv(EnvInvalidDrop, &base.DropInvalid)
	boolEnv(EnvDualStack, &base.DualStack)
	// A prediction; callers holding the netns decide from its addresses.
	base.IPv6 = IPv6Capture(KernelOrder(parseIPs(pod.PodIPs)), base.DualStack)

	spec, err := redirect.ParseAnnotations(base, pod.Annotations)
	if len(problems) == 0 {
		return spec, err
	}
	omitted := 0
	if ve, ok := err.(*redirect.ValidationError); ok {
		problems = append(problems, ve.Problems...)
		omitted = ve.Omitted
	} else if err != nil {
		return redirect.Spec{}, err
	}
	return redirect.Spec{}, redirect.NewValidationError(problems, omitted)
}

// proxyID reads a runAsUser/runAsGroup value; nil and 0 give 0 (the
// default 1337 stays, as in Istio).
func proxyID(field string, v *int64) (uint32, *redirect.FieldError) {
	if v == nil {
		return 0, nil
	}
	if *v < 0 || *v > math.MaxUint32 {
		return 0, &redirect.FieldError{
			Field:  "istio-proxy securityContext." + field,
			Value:  strconv.FormatInt(*v, 10),
			Reason: "is not a user or group id (want 0-4294967295)",
		}
	}
	return uint32(*v), nil
}
