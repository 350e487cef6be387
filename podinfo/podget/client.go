// Package podget reads one pod from the API server as the CNI plugin needs
// it when the node agent does not answer: a kubeconfig read by clientcmd,
// one GET through client-go's rest client with bounded retries, failing
// closed, and only the fields the in-mesh decision reads (meshpod.Pod)
// plus the UID. Nothing of the connection is kept on disk: this is a
// fallback path, where a TLS handshake per run costs a millisecond or two.
//
// The transport is wrapped in kubeconf.Guard: no credential of the request
// reaches an error, redirects are not followed, an answer is bounded. It
// decides nothing (meshpod does) and does not log.
package podget

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

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/nftmesh/nftmesh/internal/kubeconf"
	"github.com/nftmesh/nftmesh/podinfo/meshpod"
	"github.com/nftmesh/nftmesh/redirect/quote"
)

// Client reads pods from one API server.
type Client struct {
	rc *rest.RESTClient
	// secrets are the config's credentials, redacted from every error
	// GetPod returns (the guard covers the request; this also covers what
	// client-go says before one).
	secrets []string
	// attemptTime bounds one GET, so a server that stalls is asked again.
	attemptTime time.Duration
}

// Bounds on the kubeconfig file (one with a CA bundle and client
// certificates is a few KiB) and on what an error quotes of clientcmd's
// message, which may quote the file.
const (
	maxKubeconfig      = 4 << 20
	maxKubeconfigError = 1024
)

// LoadKubeconfig reads a kubeconfig file as kubectl does (clientcmd) into a
// client config. Credentials that would make the plugin run a program
// (exec, auth-provider) are an error naming the user: product code never
// execs a binary, and the plugin fails closed.
func LoadKubeconfig(path string) (*rest.Config, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("loading kubeconfig %s: %w", path, err)
	}
	if st.Size() > maxKubeconfig {
		return nil, fmt.Errorf("loading kubeconfig %s: %d bytes, over the %d-byte limit", path, st.Size(), maxKubeconfig)
	}
	raw, err := (&clientcmd.ClientConfigLoadingRules{ExplicitPath: path}).Load()
	if err != nil {
		return nil, fmt.Errorf("loading kubeconfig %s: %s", path, quote.TextN(err.Error(), maxKubeconfigError))
	}
	cc := clientcmd.NewDefaultClientConfig(*raw, &clientcmd.ConfigOverrides{})
	if ctx, ok := raw.Contexts[raw.CurrentContext]; ok {
		if user, ok := raw.AuthInfos[ctx.AuthInfo]; ok {
			switch {
			case user.Exec != nil:
				return nil, fmt.Errorf("loading kubeconfig %s: user %s: exec credential plugins are not supported by nftmesh-cni (use a token or client certificate)", path, quote.Value(ctx.AuthInfo))
			case user.AuthProvider != nil:
				return nil, fmt.Errorf("loading kubeconfig %s: user %s: auth-provider is not supported by nftmesh-cni (use a token or client certificate)", path, quote.Value(ctx.AuthInfo))
			}
		}
	}
	// ConfirmUsable also refuses a context naming a user not in the file,
	// which ClientConfig would read as anonymous.
	err = clientcmd.ConfirmUsable(*raw, raw.CurrentContext)
	var cfg *rest.Config
	if err == nil {
		cfg, err = cc.ClientConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("loading kubeconfig %s: %s", path, quote.TextN(kubeconf.Redact(err.Error(), kubeconfigSecrets(raw)...), maxKubeconfigError))
	}
	return cfg, nil
}

// NewFromFile loads a kubeconfig (see LoadKubeconfig) and builds a client.
func NewFromFile(path string) (*Client, error) {
	cfg, err := LoadKubeconfig(path)
	if err != nil {
		return nil, err
	}
	return New(cfg)
}

// maxBody bounds an answer: etcd caps an object at about 1.5 MiB.
const maxBody = 16 << 20

// New builds a client for cfg (not modified).
func New(cfg *rest.Config) (*Client, error) {
	c := &Client{attemptTime: maxAttemptTime}
	cfg = rest.CopyConfig(cfg)
	c.secrets = []string{cfg.BearerToken, cfg.Password}
	if cfg.BearerTokenFile != "" {
		if b, err := os.ReadFile(cfg.BearerTokenFile); err == nil {
			c.secrets = append(c.secrets, strings.TrimSpace(string(b)))
		}
	}
	cfg.UserAgent = "nftmesh-cni"
	// GetPod retries with backoff; client-go's rate limiter would only add
	// waits.
	cfg.QPS, cfg.Burst, cfg.RateLimiter = -1, 0, nil
	cfg.Timeout = 0
	cfg.WarningHandler = rest.NoWarnings{}
	// One GET per process: HTTP/2's set-up buys nothing (interleaved
	// standalone ADDs, 60 each at load ~17: CPU p50 39.6 vs 44.4 ms with h2).
	cfg.NextProtos = []string{"http/1.1"}
	guard := kubeconf.Guard(maxBody)
	if wrap := cfg.WrapTransport; wrap != nil {
		cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { return wrap(guard(rt)) }
	} else {
		cfg.WrapTransport = guard
	}
	cfg.APIPath = "/api"
	cfg.GroupVersion = &schema.GroupVersion{Version: "v1"}
	cfg.ContentType, cfg.AcceptContentTypes = "application/json", "application/json"
	// Codecs for the API server's Status answers only: meshpod reads the pod.
	scheme := runtime.NewScheme()
	metav1.AddToGroupVersion(scheme, schema.GroupVersion{Version: "v1"})
	cfg.NegotiatedSerializer = serializer.NewCodecFactory(scheme).WithoutConversion()
	rc, err := rest.RESTClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("building the API client for %s: %s", quote.Value(cfg.Host), quote.Text(kubeconf.Redact(err.Error(), c.secrets...)))
	}
	c.rc = rc
	return c, nil
}

// Pod is what GetPod returns: the decision fields and the UID.
type Pod struct {
	UID string
	*meshpod.Pod
}

// kubeconfigSecrets are the tokens and passwords of every user in cfg.
func kubeconfigSecrets(cfg *clientcmdapi.Config) []string {
	var out []string
	for _, u := range cfg.AuthInfos {
		out = append(out, u.Token, u.Password)
	}
	return out
}

// Retry bounds for GetPod.
const (
	maxAttemptTime = 5 * time.Second
	// maxServerDelay bounds the pause a server's Retry-After imposes
	// between attempts (the deadline bounds the whole).
	maxServerDelay = 5 * time.Second
)

// GetPod fetches a pod, retrying what waiting may cure (an unreachable or
// slow server, 429, 5xx) with backoff until timeout has passed; any other
// failure comes back at once with its cause (Retryable). kubelet retries
// the sandbox, so the caller fails closed on any error. No credential is
// in the error.
//
// The first read is served from the API server's watch cache (where
// kubelet learned of the pod), saving an etcd round trip; wantUID, when
// set, guards against a stale copy of an earlier pod of the same name. A
// cached miss or UID mismatch is read again consistently, so staleness can
// cost time but never a wrong answer. A Pod with another namespace or name
// (misrouted or forged) is an error naming both.
func (c *Client) GetPod(ctx context.Context, namespace, name, wantUID string, timeout time.Duration) (*Pod, error) {
	pod, err := c.getPod(ctx, namespace, name, wantUID, timeout)
	if err != nil {
		return nil, &Error{msg: kubeconf.Redact(err.Error(), c.secrets...), err: err}
	}
	return pod, nil
}

// Error is GetPod's error, without credentials in its message. What
// Unwrap leads to may hold what the server sent: print only Error.
type Error struct {
	msg string
	err error
}

func (e *Error) Error() string { return e.msg }
func (e *Error) Unwrap() error { return e.err }

func (c *Client) getPod(ctx context.Context, namespace, name, wantUID string, timeout time.Duration) (*Pod, error) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	// 50 ms doubling to 1 s; the deadline ends the retries, not Steps.
	backoff := wait.Backoff{Duration: 50 * time.Millisecond, Factor: 2, Cap: time.Second, Steps: 1 << 30}
	cached := true
	// prev: the last error that was the server's doing; an attempt cut
	// short by the overall deadline says less.
	var prev error
	for attempt := 1; ; attempt++ {
		actx, acancel := context.WithTimeout(ctx, c.attemptTime)
		pod, err := c.get(actx, namespace, name, cached)
		acancel()
		if err == nil && (pod.Namespace != namespace || pod.Name != name) {
			return nil, fmt.Errorf("getting pod %s/%s: the API server answered with pod %s: %w",
				namespace, name, quote.Value(pod.Namespace+"/"+pod.Name), ErrWrongPod)
		}
		if err == nil && cached && wantUID != "" && pod.UID != wantUID {
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
			return nil, fmt.Errorf("getting pod %s/%s: %w", namespace, name, explain(err))
		}
		pause := backoff.Step()
		if s, ok := apierrors.SuggestsClientDelay(err); ok && s > 0 {
			// Retry-After: asking sooner only adds to the server's load.
			pause = max(pause, min(time.Duration(s)*time.Second, maxServerDelay))
		}
		if ctx.Err() != nil && prev != nil && errors.Is(err, context.DeadlineExceeded) {
			err = prev
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("getting pod %s/%s: %s within %s (%d attempts): %w",
				namespace, name, transientWhat(err), time.Since(start).Round(time.Millisecond), attempt, explain(err))
		case <-time.After(pause):
		}
		prev = err
	}
}

// get makes one GET of the pod; cached reads at resourceVersion 0 (the
// watch cache). client-go refuses a namespace or name that is not one path
// segment before any request.
func (c *Client) get(ctx context.Context, namespace, name string, cached bool) (*Pod, error) {
	req := c.rc.Get().Namespace(namespace).Resource("pods").Name(name).MaxRetries(0)
	if cached {
		req = req.Param("resourceVersion", "0")
	}
	res := req.Do(ctx)
	if err := res.Error(); err != nil {
		return nil, err
	}
	body, _ := res.Raw()
	var ctype string
	var code int
	res.ContentType(&ctype).StatusCode(&code)
	if len(body) == 0 {
		return nil, fmt.Errorf("0-length response with status code: %d and content type: %s", code, quote.Value(ctype))
	}
	if !isJSON(ctype) {
		return nil, fmt.Errorf("the API server answered with content type %s, not JSON: %s", quote.Value(ctype), quote.Value(string(body)))
	}
	p, uid, err := meshpod.DecodeAPIPod(body)
	if err != nil {
		return nil, err
	}
	return &Pod{UID: uid, Pod: p}, nil
}

// isJSON reports whether a Content-Type is application/json, parameters
// aside.
func isJSON(ctype string) bool {
	mt, _, _ := strings.Cut(ctype, ";")
	return strings.EqualFold(strings.TrimSpace(mt), "application/json")
}

// ErrWrongPod: the API server's answer is a Pod, but not the one asked for.
var ErrWrongPod = errors.New("not the pod asked for")

// Retryable reports whether a failed pod GET may succeed when repeated:
// the server was not reached or not in time, or it answered 429, 408 or
// 5xx. Anything else is final: another 4xx, a redirect, an answer that is
// not a Pod or too large, a name no request can carry, a refused TLS
// handshake or certificate, a cancelled caller.
func Retryable(err error) bool {
	if err == nil {
		return false
	}
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		st := status.Status()
		return st.Code == http.StatusTooManyRequests || st.Code == http.StatusRequestTimeout || st.Code >= 500 ||
			st.Reason == metav1.StatusReasonTimeout || st.Reason == metav1.StatusReasonServerTimeout || st.Reason == metav1.StatusReasonTooManyRequests
	}
	var redirect *kubeconf.RedirectError
	if errors.As(err, &redirect) || errors.Is(err, kubeconf.ErrAnswerTooLarge) || errors.Is(err, context.Canceled) {
		return false
	}
	// An attempt out of its own time; GetPod's deadline ends the retries.
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	// Waiting changes no certificate, CA or TLS version.
	if tlsRefused(err) != nil {
		return false
	}
	// Refused, reset, unreachable, DNS, timeouts, closed mid-answer. Every
	// HTTP client error is a *url.Error, itself a net.Error: what it wraps
	// decides ("server gave HTTP response to HTTPS client" is final).
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

// tlsRefused is the TLS handshake's own verdict in err, if any: the
// server's certificate did not verify, the server sent an alert, or this
// side refused what the server chose.
func tlsRefused(err error) error {
	var (
		unknownCA  x509.UnknownAuthorityError
		invalid    x509.CertificateInvalidError
		hostname   x509.HostnameError
		verifyFail *tls.CertificateVerificationError
		alert      tls.AlertError
	)
	if errors.As(err, &unknownCA) || errors.As(err, &invalid) || errors.As(err, &hostname) || errors.As(err, &verifyFail) || errors.As(err, &alert) {
		return err
	}
	// crypto/tls's own refusals ("tls: server selected unsupported protocol
	// version 301") have no type of their own.
	for e := err; e != nil; e = errors.Unwrap(e) {
		if strings.HasPrefix(e.Error(), "tls: ") {
			return e
		}
	}
	return nil
}

// explain adds to a final error what it means, where it does not say.
func explain(err error) error {
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		st := status.Status()
		return fmt.Errorf("%w (%s, HTTP %d)", err, st.Reason, st.Code)
	}
	if tlsRefused(err) != nil {
		return fmt.Errorf("the TLS handshake with the API server failed (retrying cannot help): %w", err)
	}
	return err
}

// transientWhat names, for the give-up message, what kept going wrong.
func transientWhat(err error) string {
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		if status.Status().Code == http.StatusTooManyRequests {
			return "API server still throttling"
		}
		return "API server still failing"
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return "no answer from the API server"
	}
	return "API server not reachable"
}
