package podinfo

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// PodClient reads pods from the API server. It is a bare REST client for
// core/v1 rather than the typed clientset: the clientset's scheme registers
// every API group at init, which costs milliseconds on each plugin run.
type PodClient struct {
	rest rest.Interface
}

// NewPodClient builds a client from a kubeconfig file. A missing or invalid
// kubeconfig is an error (the caller fails closed).
func NewPodClient(kubeconfig string) (*PodClient, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("loading kubeconfig %s: %w", kubeconfig, err)
	}
	return NewPodClientForConfig(cfg)
}

// NewPodClientForConfig builds a client from a rest.Config.
func NewPodClientForConfig(cfg *rest.Config) (*PodClient, error) {
	// Only what a pod GET decodes: Pod, and Status for error answers.
	// Registering all of core/v1 costs a good part of a millisecond.
	scheme := runtime.NewScheme()
	scheme.AddKnownTypes(corev1.SchemeGroupVersion, &corev1.Pod{})
	metav1.AddToGroupVersion(scheme, corev1.SchemeGroupVersion)
	c := rest.CopyConfig(cfg)
	c.APIPath = "/api"
	c.GroupVersion = &corev1.SchemeGroupVersion
	c.NegotiatedSerializer = serializer.NewCodecFactory(scheme).WithoutConversion()
	c.ContentType = runtime.ContentTypeProtobuf
	c.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	// One GET per plugin run: no client-side rate limiting.
	c.QPS = -1
	// HTTP/1.1: a short-lived process makes one request, and HTTP/2's
	// connection set-up is pure overhead for it.
	c.NextProtos = []string{"http/1.1"}
	if c.UserAgent == "" {
		c.UserAgent = "nftmesh-cni"
	}
	rc, err := rest.RESTClientFor(c)
	if err != nil {
		return nil, fmt.Errorf("building REST client for %s: %w", cfg.Host, err)
	}
	return &PodClient{rest: rc}, nil
}

// Get fetches one pod, once, with a consistent (quorum) read.
func (c *PodClient) Get(ctx context.Context, namespace, name string) (*corev1.Pod, error) {
	return c.get(ctx, namespace, name, false)
}

// get fetches one pod. cached reads with resourceVersion=0, which the API
// server answers from its watch cache without an etcd round trip.
func (c *PodClient) get(ctx context.Context, namespace, name string, cached bool) (*corev1.Pod, error) {
	var pod corev1.Pod
	// GetPod owns retries and their deadline; client-go's own retry of
	// GETs would spend the whole deadline inside one attempt.
	req := c.rest.Get().MaxRetries(0).Namespace(namespace).Resource("pods").Name(name)
	if cached {
		req = req.Param("resourceVersion", "0")
	}
	if err := req.Do(ctx).Into(&pod); err != nil {
		return nil, err
	}
	return &pod, nil
}

// Retry bounds for GetPod.
const (
	firstRetryDelay = 50 * time.Millisecond
	maxRetryDelay   = time.Second
	maxAttemptTime  = 5 * time.Second
)

// GetPod fetches a pod, retrying transient failures (unreachable server,
// timeouts, 429/5xx) with backoff until timeout has passed. Answers that a
// retry cannot change come back at once: not found, forbidden (RBAC),
// unauthorized, bad request. kubelet retries the whole sandbox creation, so
// the caller fails closed on any error.
//
// The first read is served from the API server's watch cache (the same
// cache kubelet learned about the pod from), which saves an etcd round
// trip; wantUID, when set, guards against a stale copy of an earlier pod
// with the same name. A cached miss or a UID mismatch is re-read with a
// consistent read, so staleness can cost time but never a wrong answer
// about which pod this is.
func (c *PodClient) GetPod(ctx context.Context, namespace, name, wantUID string, timeout time.Duration) (*corev1.Pod, error) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	delay := firstRetryDelay
	cached := true
	for attempt := 1; ; attempt++ {
		actx, acancel := context.WithTimeout(ctx, maxAttemptTime)
		pod, err := c.get(actx, namespace, name, cached)
		acancel()
		if err == nil && cached && wantUID != "" && string(pod.UID) != wantUID {
			cached = false
			continue
		}
		if err == nil {
			return pod, nil
		}
		if cached && apierrors.IsNotFound(err) {
			cached = false
			continue
		}
		if !Retryable(err) {
			return nil, fmt.Errorf("getting pod %s/%s: %w", namespace, name, err)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("getting pod %s/%s: API server not reachable within %s (%d attempts): %w",
				namespace, name, time.Since(start).Round(time.Millisecond), attempt, err)
		case <-time.After(delay):
		}
		delay = min(2*delay, maxRetryDelay)
	}
}

// Retryable reports whether a failed pod GET may succeed when repeated.
func Retryable(err error) bool {
	var st apierrors.APIStatus
	if errors.As(err, &st) {
		code := st.Status().Code
		return code == http.StatusTooManyRequests || code >= 500 || code == 0
	}
	// Transport errors: refused, reset, DNS, TLS handshake timeouts.
	return true
}
