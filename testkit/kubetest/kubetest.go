// Package kubetest runs a real Kubernetes API server for tests: Debian's
// etcd plus a kube-apiserver binary built from the pinned tools module in
// ./kube-apiserver (see build-apiserver.sh; `make kube-apiserver`). There is
// no kubelet, scheduler or controller-manager: pods are plain API objects,
// which is all the CNI plugin and the agent read.
//
// The server uses token authentication (an admin token in system:masters),
// RBAC authorization, and ServiceAccount tokens from the TokenRequest API,
// so tests can check what a given Role really allows. It owns nothing
// outside its temporary directory and loopback ports.
package kubetest

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	neturl "net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/nftmesh/nftmesh/internal/kubeconf"
	"github.com/nftmesh/nftmesh/testkit/spawn"
)

// Version is the Kubernetes release the tools module pins.
const Version = "v1.35.4"

// ErrNoBinary means the kube-apiserver or etcd binary is not installed; tests
// skip on it.
var ErrNoBinary = errors.New("test binary missing")

// Server is a running etcd + kube-apiserver pair.
type Server struct {
	Host   string // https://127.0.0.1:PORT
	CAFile string // the self-signed serving certificate's CA bundle
	Dir    string // scratch directory (logs: etcd.log, kube-apiserver.log)

	adminToken string
	ca         []byte
	etcd       *proc
	apiserver  *proc
	stopOnce   sync.Once
	client     *kubernetes.Clientset
}

// APIServerBinary returns where the kube-apiserver binary is looked for:
// $KUBE_APISERVER, else <repo>/.cache/kube-apiserver.
func APIServerBinary() string {
	if p := os.Getenv("KUBE_APISERVER"); p != "" {
		return p
	}
	root, err := RepoRoot()
	if err != nil {
		return filepath.Join(".cache", "kube-apiserver")
	}
	return filepath.Join(root, ".cache", "kube-apiserver")
}

// RepoRoot walks up from the working directory (a package directory under
// `go test`) to the main module's go.mod.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && bytes.HasPrefix(bytes.TrimSpace(data), []byte("module github.com/nftmesh/nftmesh\n")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no nftmesh go.mod above the working directory")
		}
		dir = parent
	}
}

// Start runs a fresh server for one test (or a whole package, via
// StartServer in TestMain) and stops it in t.Cleanup. Without the binaries
// the test is skipped with a message naming `make kube-apiserver`; with
// -short it is skipped too.
func Start(t testing.TB) *Server {
	t.Helper()
	if testing.Short() {
		t.Skip("skipping: -short (starts etcd and kube-apiserver)")
	}
	dir := t.TempDir()
	s, err := StartServer(dir)
	if errors.Is(err, ErrNoBinary) {
		t.Skipf("skipping: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s
}

// StartServer starts etcd and kube-apiserver with their state in dir (which
// the caller removes) and waits until /readyz answers. The caller must Stop it.
func StartServer(dir string) (*Server, error) {
	bin := APIServerBinary()
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("%w: kube-apiserver not found at %s; build it with `make kube-apiserver` (testkit/kubetest/build-apiserver.sh)", ErrNoBinary, bin)
	}
	etcdBin, err := exec.LookPath("etcd")
	if err != nil {
		return nil, fmt.Errorf("%w: etcd not found in PATH; install Debian's etcd-server", ErrNoBinary)
	}

	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating server directory: %w", err)
	}
	s := &Server{Dir: dir, adminToken: randomToken()}
	ok := false
	defer func() {
		if !ok {
			s.Stop()
		}
	}()

	ports, err := freePorts(3)
	if err != nil {
		return nil, err
	}
	clientURL := fmt.Sprintf("http://127.0.0.1:%d", ports[0])
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", ports[1])
	s.etcd, err = startLogged(filepath.Join(dir, "etcd.log"), etcdBin,
		"--data-dir", filepath.Join(dir, "etcd"),
		"--name", "default",
		"--listen-client-urls", clientURL, "--advertise-client-urls", clientURL,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "default="+peerURL,
		// Tests create a few objects; fsync on every write only slows them.
		"--unsafe-no-fsync",
	)
	if err != nil {
		return nil, fmt.Errorf("starting etcd: %w", err)
	}

	keyFile := filepath.Join(dir, "sa.key")
	if err := writeRSAKey(keyFile); err != nil {
		return nil, err
	}
	tokenFile := filepath.Join(dir, "tokens.csv")
	if err := os.WriteFile(tokenFile, []byte(s.adminToken+`,admin,admin-uid,"system:masters"`+"\n"), 0o600); err != nil {
		return nil, fmt.Errorf("writing token file: %w", err)
	}
	certDir := filepath.Join(dir, "certs")
	s.Host = fmt.Sprintf("https://127.0.0.1:%d", ports[2])
	s.apiserver, err = startLogged(filepath.Join(dir, "kube-apiserver.log"), bin,
		"--etcd-servers", clientURL,
		"--bind-address", "127.0.0.1",
		"--advertise-address", "127.0.0.1",
		"--secure-port", strconv.Itoa(ports[2]),
		"--cert-dir", certDir,
		"--token-auth-file", tokenFile,
		"--authorization-mode", "RBAC",
		"--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file", keyFile,
		"--service-account-signing-key-file", keyFile,
		"--service-cluster-ip-range", "10.96.0.0/16",
		// No controller-manager creates the default ServiceAccounts.
		"--disable-admission-plugins", "ServiceAccount",
		"--profiling=false",
	)
	if err != nil {
		return nil, fmt.Errorf("starting kube-apiserver: %w", err)
	}
	if err := s.waitReady(90 * time.Second); err != nil {
		return nil, err
	}
	s.CAFile = filepath.Join(certDir, "apiserver.crt")
	if s.ca, err = os.ReadFile(s.CAFile); err != nil {
		return nil, fmt.Errorf("reading the serving certificate: %w", err)
	}
	if s.client, err = kubernetes.NewForConfig(s.AdminConfig()); err != nil {
		return nil, fmt.Errorf("building admin client: %w", err)
	}
	ok = true
	return s, nil
}

func randomToken() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%x", b)
}

// freePorts reserves n distinct loopback ports by binding and releasing them.
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("reserving a loopback port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func writeRSAKey(path string) error {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return fmt.Errorf("generating service-account key: %w", err)
	}
	block := &pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}
	if err := os.WriteFile(path, pem.EncodeToMemory(block), 0o600); err != nil {
		return fmt.Errorf("writing service-account key: %w", err)
	}
	return nil
}

// proc is a started child process; done closes when it has exited.
type proc struct {
	cmd  *exec.Cmd
	done chan struct{}
}

func startLogged(logPath, bin string, args ...string) (*proc, error) {
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Own process group, and die with the test binary if it is killed
	// (spawn: with it, not with whichever of its threads forked it).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := spawn.Start(cmd); err != nil {
		logf.Close()
		return nil, err
	}
	p := &proc{cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	return p, nil
}

func (s *Server) waitReady(timeout time.Duration) error {
	hc := &http.Client{
		Timeout:   2 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}},
	}
	deadline := time.Now().Add(timeout)
	var last string
	for time.Now().Before(deadline) {
		select {
		case <-s.apiserver.done:
			return fmt.Errorf("kube-apiserver exited during start-up; log tail:\n%s", tail(filepath.Join(s.Dir, "kube-apiserver.log"), 20))
		default:
		}
		req, _ := http.NewRequest(http.MethodGet, s.Host+"/readyz", nil)
		req.Header.Set("Authorization", "Bearer "+s.adminToken)
		resp, err := hc.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = resp.Status
		} else {
			last = err.Error()
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("kube-apiserver not ready within %s (last: %s); log tail:\n%s", timeout, last, tail(filepath.Join(s.Dir, "kube-apiserver.log"), 20))
}

func tail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return strings.Join(lines, "\n")
}

// Stop stops the API server and etcd. It is idempotent; after it the API is
// unreachable (tests of the plugin's fail-closed path rely on that).
func (s *Server) Stop() {
	s.stopOnce.Do(func() {
		for _, p := range []*proc{s.apiserver, s.etcd} {
			if p == nil {
				continue
			}
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-p.done:
			case <-time.After(10 * time.Second):
				_ = p.cmd.Process.Kill()
				<-p.done
			}
		}
	})
}

// AdminConfig is a rest.Config authenticated as a system:masters user.
func (s *Server) AdminConfig() *rest.Config {
	return s.configFor(s.adminToken)
}

func (s *Server) configFor(token string) *rest.Config {
	return &rest.Config{
		Host:            s.Host,
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{CAData: s.ca},
		QPS:             1000,
		Burst:           1000,
	}
}

// ConfigFor is a rest.Config authenticated with token.
func (s *Server) ConfigFor(token string) *rest.Config { return s.configFor(token) }

// Client is a typed clientset with admin rights, for test setup.
func (s *Server) Client() *kubernetes.Clientset { return s.client }

// EnsureNamespace creates a namespace if it does not exist.
func (s *Server) EnsureNamespace(t testing.TB, name string) {
	t.Helper()
	_, err := s.client.CoreV1().Namespaces().Create(context.Background(),
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("creating namespace %s: %v", name, err)
	}
}

// ServiceAccount creates a ServiceAccount (and its namespace) bound to a
// Role with exactly rules (none: no Role at all), and returns a token for it
// from the TokenRequest API.
func (s *Server) ServiceAccount(t testing.TB, namespace, name string, rules ...rbacv1.PolicyRule) string {
	t.Helper()
	ctx := context.Background()
	s.EnsureNamespace(t, namespace)
	_, err := s.client.CoreV1().ServiceAccounts(namespace).Create(ctx,
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("creating service account %s/%s: %v", namespace, name, err)
	}
	if len(rules) > 0 {
		s.Grant(t, namespace, name, false, rules...)
	}
	return s.TokenFor(t, namespace, name)
}

// Grant binds the ServiceAccount namespace/name to rules: a Role and
// RoleBinding in its namespace, or with cluster set a ClusterRole and
// ClusterRoleBinding. The objects are named after the account.
func (s *Server) Grant(t testing.TB, namespace, name string, cluster bool, rules ...rbacv1.PolicyRule) {
	t.Helper()
	ctx := context.Background()
	roleName := "kubetest-" + namespace + "-" + name
	subject := []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: namespace, Name: name}}
	var err error
	if cluster {
		_, err = s.client.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
			ObjectMeta: metav1.ObjectMeta{Name: roleName}, Rules: rules}, metav1.CreateOptions{})
		if err == nil {
			_, err = s.client.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
				ObjectMeta: metav1.ObjectMeta{Name: roleName},
				RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: roleName},
				Subjects:   subject,
			}, metav1.CreateOptions{})
		}
	} else {
		_, err = s.client.RbacV1().Roles(namespace).Create(ctx, &rbacv1.Role{
			ObjectMeta: metav1.ObjectMeta{Name: roleName}, Rules: rules}, metav1.CreateOptions{})
		if err == nil {
			_, err = s.client.RbacV1().RoleBindings(namespace).Create(ctx, &rbacv1.RoleBinding{
				ObjectMeta: metav1.ObjectMeta{Name: roleName},
				RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: roleName},
				Subjects:   subject,
			}, metav1.CreateOptions{})
		}
	}
	if err != nil {
		t.Fatalf("granting rules to %s/%s: %v", namespace, name, err)
	}
	scope := namespace
	if cluster {
		scope = ""
	}
	s.WaitAllowed(t, namespace, name, scope, rules...)
}

// WaitAllowed waits until the API server's authorizer lets ServiceAccount
// namespace/name do everything rules name (in namespace scope; "" = every
// namespace). RBAC objects reach the authorizer through an informer, so a
// request made right after creating a binding can still be forbidden; tests
// that create RBAC by other means (helm) call this before relying on it.
func (s *Server) WaitAllowed(t testing.TB, namespace, name, scope string, rules ...rbacv1.PolicyRule) {
	t.Helper()
	user := "system:serviceaccount:" + namespace + ":" + name
	groups := []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"}
	var attrs []authorizationv1.ResourceAttributes
	for _, r := range rules {
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				for _, v := range r.Verbs {
					a := authorizationv1.ResourceAttributes{Namespace: scope, Verb: v, Group: g, Resource: res}
					if base, sub, ok := strings.Cut(res, "/"); ok {
						a.Resource, a.Subresource = base, sub
					}
					if len(r.ResourceNames) > 0 {
						a.Name = r.ResourceNames[0]
					}
					attrs = append(attrs, a)
				}
			}
		}
	}
	deadline := time.Now().Add(20 * time.Second)
	for _, a := range attrs {
		for {
			sar, err := s.client.AuthorizationV1().SubjectAccessReviews().Create(context.Background(),
				&authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
					User: user, Groups: groups, ResourceAttributes: &a}}, metav1.CreateOptions{})
			if err == nil && sar.Status.Allowed {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s is still not allowed to %s %s/%s in %q after 20 s (err %v)", user, a.Verb, a.Resource, a.Subresource, scope, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// TokenFor returns a one-hour token for an existing ServiceAccount, from
// the TokenRequest API (as kubelet's projected tokens are).
func (s *Server) TokenFor(t testing.TB, namespace, name string) string {
	t.Helper()
	exp := int64(3600)
	tr, err := s.client.CoreV1().ServiceAccounts(namespace).CreateToken(context.Background(), name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &exp}},
		metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("requesting a token for %s/%s: %v", namespace, name, err)
	}
	return tr.Status.Token
}

// AdminToken is the system:masters bearer token.
func (s *Server) AdminToken() string { return s.adminToken }

// WriteKubeconfig writes a kubeconfig for this server authenticating with
// token (mode 0600), like the one the agent writes for the plugin.
func (s *Server) WriteKubeconfig(path, token string) error {
	return s.WriteKubeconfigHost(path, s.Host, token)
}

// WriteKubeconfigHost is WriteKubeconfig with another server URL, for a
// client that reaches this server through a forwarder (e.g. from another
// network namespace). The serving certificate is valid for 127.0.0.1.
func (s *Server) WriteKubeconfigHost(path, host, token string) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["kubetest"] = &clientcmdapi.Cluster{Server: host, CertificateAuthorityData: s.ca}
	cfg.AuthInfos["kubetest"] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["kubetest"] = &clientcmdapi.Context{Cluster: "kubetest", AuthInfo: "kubetest"}
	cfg.CurrentContext = "kubetest"
	// JSON, as the agent writes the plugin's.
	b, err := kubeconf.JSON(*cfg)
	if err != nil {
		return fmt.Errorf("writing kubeconfig %s: %w", path, err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		return err
	}
	return os.Chmod(path, 0o600)
}

// Forward copies every connection accepted on ln to target, dialled from
// this process's own netns. Tests listen inside a throw-away "host" netns so
// the API server's address is reachable from there as well as from here.
func Forward(ln net.Listener, target string) { ForwardTo(ln, "tcp", target) }

// ForwardTo is Forward to target on another network ("unix" for a socket
// file).
func ForwardTo(ln net.Listener, network, target string) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			u, err := net.Dial(network, target)
			if err != nil {
				return
			}
			defer u.Close()
			done := make(chan struct{}, 2)
			go func() { _, _ = io.Copy(u, c); done <- struct{}{} }()
			go func() { _, _ = io.Copy(c, u); done <- struct{}{} }()
			<-done
		}()
	}
}

// Proxy starts a TLS reverse proxy to the API server that hands every
// request to observe before forwarding it (so a test can count what a
// client asks, e.g. pod GETs per pod start); the func observe returns, if
// not nil, is called when the request has been answered (a watch: when
// its stream ends). It returns the proxy's URL and its serving
// certificate (PEM) to trust; it stops when the test ends.
func (s *Server) Proxy(t testing.TB, observe func(*http.Request) func()) (url string, caPEM []byte) {
	t.Helper()
	target, err := neturl.Parse(s.Host)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(s.ca)
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.Transport = &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if done := observe(r); done != nil {
			defer done()
		}
		rp.ServeHTTP(w, r)
	}))
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv.URL, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
}
