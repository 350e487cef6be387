package podinfo

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/nftmesh/nftmesh/redirect/quote"
)

// PodClient reads pods from the API server. It is a bare REST client for
// core/v1 rather than the typed clientset: the clientset's scheme registers
// every API group at init, which costs milliseconds on each plugin run.
type PodClient struct {
	rest     rest.Interface
	sessions *fileSessionCache // nil without WithTLSSessionDir
	// attemptTime bounds one GET inside GetPod's deadline, so a server
	// that accepted the connection but stalls is asked again.
	attemptTime time.Duration
}

// ClientOption configures NewPodClient.
type ClientOption func(*clientOptions)

type clientOptions struct {
	sessionDir string
}

// WithTLSSessionDir keeps the TLS session with the API server in a file in
// dir (the agent's run dir), so the next process resumes it instead of a
// full handshake (see tlssession.go). Configs with an exec or auth-provider
// plugin, a custom transport or plain HTTP are left as they are.
func WithTLSSessionDir(dir string) ClientOption {
	return func(o *clientOptions) { o.sessionDir = dir }
}

// NewPodClient builds a client from a kubeconfig file. A missing or invalid
// kubeconfig is an error (the caller fails closed).
func NewPodClient(kubeconfig string, opts ...ClientOption) (*PodClient, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("loading kubeconfig %s: %w", kubeconfig, err)
	}
	return NewPodClientForConfig(cfg, opts...)
}

// NewPodClientForConfig builds a client from a rest.Config.
func NewPodClientForConfig(cfg *rest.Config, opts ...ClientOption) (*PodClient, error) {
	var o clientOptions
	for _, opt := range opts {
		opt(&o)
	}
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
	pc := &PodClient{attemptTime: maxAttemptTime}
	if o.sessionDir != "" {
		sessions, err := withSessionCache(c, o.sessionDir)
		if err != nil {
			return nil, fmt.Errorf("building TLS config for %s: %w", cfg.Host, err)
		}
		pc.sessions = sessions
	}
	rc, err := rest.RESTClientFor(c)
	if err != nil {
		return nil, fmt.Errorf("building REST client for %s: %w", cfg.Host, err)
	}
	pc.rest = rc
	return pc, nil
}

// withSessionCache gives c a transport of its own whose TLS config keeps
// sessions in a file in dir. client-go has no hook for a session cache, so
// the TLS config client-go would build is built here (rest.TLSConfigFor:
// CA, client certificates, server name, insecure flag) and handed to an
// HTTP/1.1 transport; client-go still wraps it with the bearer token and
// user agent. It returns nil, leaving c alone, where that cannot be done
// faithfully.
func withSessionCache(c *rest.Config, dir string) (*fileSessionCache, error) {
	if c.Transport != nil || c.WrapTransport != nil || c.ExecProvider != nil || c.AuthProvider != nil || c.Dial != nil {
		return nil, nil
	}
	if strings.HasPrefix(strings.ToLower(c.Host), "http://") {
		return nil, nil
	}
	tc, err := rest.TLSConfigFor(c)
	if err != nil || tc == nil {
		return nil, err // tc == nil: plain HTTP
	}
	ca := c.CAData
	if len(ca) == 0 && c.CAFile != "" {
		if ca, err = os.ReadFile(c.CAFile); err != nil {
			return nil, err
		}
	}
	cache := &fileSessionCache{path: sessionFileName(dir, c.Host, tc.ServerName, ca)}
	cache.install(tc)
	proxy := c.Proxy
	if proxy == nil {
		// As client-go's own transports: NO_PROXY may hold CIDRs.
		proxy = utilnet.NewProxierWithNoProxyCIDR(http.ProxyFromEnvironment)
	}
	c.Transport = &http.Transport{
		Proxy:               proxy,
		DialContext:         (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSClientConfig:     tc,
		TLSHandshakeTimeout: 10 * time.Second,
		MaxIdleConnsPerHost: 2,
	}
	// The TLS settings now live in the transport (client-go refuses both).
	c.TLSClientConfig = rest.TLSClientConfig{}
	c.Insecure = false
	return cache, nil
}

// TLSResumed reports whether the last TLS handshake resumed a kept session.
func (c *PodClient) TLSResumed() bool {
	if c.sessions == nil {
		return false
	}
	c.sessions.mu.Lock()
	defer c.sessions.mu.Unlock()
	return c.sessions.resumed
}

// SessionWriteErr is the last error keeping the TLS session for the next
// run (nil when there was none or no session cache is used).
func (c *PodClient) SessionWriteErr() error {
	if c.sessions == nil {
		return nil
	}
	return c.sessions.WriteErr()
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
	// maxServerDelay bounds the pause a server's Retry-After imposes
	// between attempts (the deadline bounds the whole).
	maxServerDelay = 5 * time.Second
)

// GetPod fetches a pod, retrying what may get better by waiting (an
// unreachable or slow server, 429, 5xx) with backoff until timeout has
// passed. Every other answer comes back at once with its own cause: not
// found, forbidden (RBAC), unauthorized, bad request, an answer that is not
// a Pod, a request client-go refuses to build. kubelet retries the whole
// sandbox creation, so the caller fails closed on any error.
//
// The first read is served from the API server's watch cache (the same
// cache kubelet learned about the pod from), which saves an etcd round
// trip; wantUID, when set, guards against a stale copy of an earlier pod
// with the same name. A cached miss or a UID mismatch is re-read with a
// consistent read, so staleness can cost time but never a wrong answer
// about which pod this is.
//
// The answer must be the pod asked for: a Pod with another namespace or
// name (a misrouted or forged answer) is an error naming both, whether or
// not wantUID is known.
func (c *PodClient) GetPod(ctx context.Context, namespace, name, wantUID string, timeout time.Duration) (*corev1.Pod, error) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	delay := firstRetryDelay
	cached := true
	for attempt := 1; ; attempt++ {
		actx, acancel := context.WithTimeout(ctx, c.attemptTime)
		pod, err := c.get(actx, namespace, name, cached)
		acancel()
		if err == nil && (pod.Namespace != namespace || pod.Name != name) {
			return nil, fmt.Errorf("getting pod %s/%s: the API server answered with pod %s: %w",
				namespace, name, quote.Value(pod.Namespace+"/"+pod.Name), ErrWrongPod)
		}
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
		wait := delay
		if secs, ok := apierrors.SuggestsClientDelay(err); ok && secs > 0 {
			// The server asked for a pause (Retry-After on a 429 or a
			// server timeout): asking sooner only adds to its load.
			wait = max(wait, min(time.Duration(secs)*time.Second, maxServerDelay))
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("getting pod %s/%s: %s within %s (%d attempts): %w",
				namespace, name, transientWhat(err), time.Since(start).Round(time.Millisecond), attempt, err)
		case <-time.After(wait):
		}
		delay = min(2*delay, maxRetryDelay)
	}
}

// ErrWrongPod: the API server's answer is a Pod, but not the one asked for.
var ErrWrongPod = errors.New("not the pod asked for")

// Retryable reports whether a failed pod GET may succeed when repeated:
// the server was not reached or did not answer in time, or it answered
// 429, 408 or 5xx. Anything else is final: a 4xx answer, an answer that
// does not decode as a Pod, a request client-go refused to build (an
// invalid name), a certificate the server presented that does not verify,
// or a cancelled caller.
func Retryable(err error) bool {
	if err == nil {
		return false
	}
	var st apierrors.APIStatus
	if errors.As(err, &st) {
		s := st.Status()
		switch {
		case s.Code == http.StatusTooManyRequests, s.Code == http.StatusRequestTimeout, s.Code >= 500:
			return true
		case s.Reason == metav1.StatusReasonTimeout, s.Reason == metav1.StatusReasonServerTimeout, s.Reason == metav1.StatusReasonTooManyRequests:
			return true
		}
		return false
	}
	if errors.Is(err, context.Canceled) {
		return false
	}
	// An attempt that ran out of its own time; GetPod's overall deadline
	// still ends the retries.
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	// Certificate problems are transport errors too, but waiting does not
	// change the certificate the server presents or the CA we trust.
	var (
		unknownCA  x509.UnknownAuthorityError
		invalid    x509.CertificateInvalidError
		hostname   x509.HostnameError
		verifyFail *tls.CertificateVerificationError
	)
	if errors.As(err, &unknownCA) || errors.As(err, &invalid) || errors.As(err, &hostname) || errors.As(err, &verifyFail) {
		return false
	}
	// Refused, reset, unreachable, DNS, dial and TLS handshake timeouts, a
	// connection closed mid-answer. Every error of the HTTP client is a
	// *url.Error, itself a net.Error: what it wraps decides ("server gave
	// HTTP response to HTTPS client" is final).
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	var ne net.Error
	if errors.As(err, &ne) {
		return true
	}
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// transientWhat names, for the give-up message, what kept going wrong.
func transientWhat(err error) string {
	var st apierrors.APIStatus
	if errors.As(err, &st) {
		if st.Status().Code == http.StatusTooManyRequests {
			return "API server still throttling"
		}
		return "API server still failing"
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return "no answer from the API server"
	}
	return "API server not reachable"
}
