package cluster

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/nftmesh/nftmesh/internal/hostns"
	"github.com/nftmesh/nftmesh/testkit/spawn"
)

// loopRegistry is an OCI registry (tools/imagebuild's registry command:
// go-containerregistry's, blobs on disk, a process of its own, since this
// module does not link the image library) at one address,
// 127.0.0.1:<port>, on two loopbacks: the machine's, where the registry
// listens and `make push` and helm run as a user's shell would (with the
// module proxy in reach), and the node's, where containerd pulls through a
// reverse proxy the test serves, which records each request. One registry
// under one name for both.
type loopRegistry struct {
	Addr string // 127.0.0.1:<port>, the same on both sides

	proc    *exec.Cmd
	servers []*http.Server
	mu      sync.Mutex
	reqs    []regRequest
}

// regRequest is one request the registry answered on the node's side.
type regRequest struct {
	side          string // "node": the loopback it came in on
	method, path  string
	agent         string
	status        int
	responseBytes int64
}

// startRegistry starts the registry on a port free on both loopbacks.
func (c *Cluster) startRegistry(dir string) (*loopRegistry, error) {
	if err := os.MkdirAll(filepath.Join(dir, "blobs"), 0o755); err != nil {
		return nil, fmt.Errorf("creating the registry's directory: %w", err)
	}
	// The kernel picks a free port on the machine's loopback; the node's
	// has few sockets, but an outgoing connection of one of its components
	// can hold the same port there: then try another.
	var lastErr error
	for range 20 {
		r, err := c.tryRegistry(dir)
		if err == nil {
			return r, nil
		}
		if lastErr = err; !errors.Is(err, syscall.EADDRINUSE) {
			break
		}
	}
	return nil, lastErr
}

// tryRegistry starts the registry process on a free port of the machine's
// loopback and the recording proxy on the same port of the node's.
func (c *Cluster) tryRegistry(dir string) (*loopRegistry, error) {
	logFile, err := os.OpenFile(filepath.Join(dir, "registry.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("creating the registry's log: %w", err)
	}
	defer logFile.Close()
	goBin := os.Getenv("GO")
	if goBin == "" {
		goBin = "go"
	}
	cmd := exec.Command(goBin, "-C", filepath.Join(repo, "tools", "imagebuild"), "run", "./registry",
		"--addr", "127.0.0.1:0", "--dir", filepath.Join(dir, "blobs"), "--v")
	cmd.Stderr = logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := spawn.Start(cmd); err != nil {
		return nil, fmt.Errorf("starting tools/imagebuild's registry: %w", err)
	}
	r := &loopRegistry{proc: cmd}
	line, err := bufio.NewReader(out).ReadString('\n')
	addr, ok := strings.CutPrefix(strings.TrimSpace(line), "listening on ")
	if err != nil || !ok {
		r.Close()
		return nil, fmt.Errorf("tools/imagebuild's registry did not say where it listens (%q, %v; see %s)", line, err, logFile.Name())
	}
	r.Addr = addr
	node, err := c.listenInNode(addr)
	if err != nil {
		r.Close()
		return nil, err
	}
	target := &url.URL{Scheme: "http", Host: addr}
	srv := &http.Server{Handler: r.record("node", httputil.NewSingleHostReverseProxy(target)), ReadHeaderTimeout: 10 * time.Second}
	r.servers = append(r.servers, srv)
	go func() { _ = srv.Serve(node) }()
	return r, nil
}

// listenInNode opens a TCP listener inside the node's network namespace: a
// socket stays in the namespace it was created in, so the test process
// serves it from anywhere.
func (c *Cluster) listenInNode(addr string) (net.Listener, error) {
	n, err := hostns.Borrow(int(c.netNS.Fd()), c.netNS.Name())
	if err != nil {
		return nil, err
	}
	var l net.Listener
	err = n.Do(func() error {
		var err error
		l, err = net.Listen("tcp", addr)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("listening on %s in the node's network namespace: %w", addr, err)
	}
	return l, nil
}

// record logs each request with the side it came in on.
func (r *loopRegistry) record(side string, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		h.ServeHTTP(sw, req)
		r.mu.Lock()
		r.reqs = append(r.reqs, regRequest{side: side, method: req.Method, path: req.URL.Path,
			agent: req.UserAgent(), status: sw.status, responseBytes: sw.n})
		r.mu.Unlock()
	})
}

// Requests returns the requests answered since mark (a count Mark gave).
func (r *loopRegistry) Requests(mark int) []regRequest {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]regRequest(nil), r.reqs[mark:]...)
}

// Mark is the number of requests answered so far.
func (r *loopRegistry) Mark() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.reqs)
}

// containerdPulls counts, since mark, what containerd fetched of
// repo:tag on the node's loopback: manifest requests for the tag, and
// blobs of the repository with their bytes.
func (r *loopRegistry) containerdPulls(mark int, repo, tag string) (manifests, blobs int, fetched int64) {
	for _, q := range r.Requests(mark) {
		if q.side != "node" || !strings.HasPrefix(q.agent, "containerd/") || q.status != http.StatusOK {
			continue
		}
		switch {
		case q.path == "/v2/"+repo+"/manifests/"+tag:
			manifests++
		case strings.HasPrefix(q.path, "/v2/"+repo+"/blobs/") && q.method == http.MethodGet:
			blobs++
			fetched += q.responseBytes
		}
	}
	return manifests, blobs, fetched
}

func (r *loopRegistry) Close() {
	for _, s := range r.servers {
		_ = s.Close()
	}
	if r.proc != nil && r.proc.Process != nil {
		_ = syscall.Kill(-r.proc.Process.Pid, syscall.SIGKILL)
		_ = r.proc.Wait()
	}
}

type statusWriter struct {
	http.ResponseWriter
	status int
	n      int64
}

func (w *statusWriter) WriteHeader(code int) {
	w.status = code
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	n, err := w.ResponseWriter.Write(b)
	w.n += int64(n)
	return n, err
}

// writeRegistryHosts tells the node's containerd (the CRI plugin's
// config_path, read at each pull) that the registry at addr speaks plain
// HTTP.
func (c *Cluster) writeRegistryHosts(addr string) error {
	return writeFile(filepath.Join(c.path("registry-hosts"), addr, "hosts.toml"), fmt.Sprintf(`server = "http://%s"

[host."http://%s"]
  capabilities = ["pull", "resolve"]
`, addr, addr), 0o644)
}

// apiForwarder makes the apiserver, which listens on the node's loopback,
// reachable on the machine's: a kubeconfig pointing there lets helm run
// outside the node's namespace (the apiserver's certificate names
// 127.0.0.1, whatever the port).
type apiForwarder struct{ l net.Listener }

// forwardAPIServer starts the forwarder and writes a copy of the admin
// kubeconfig that uses it to file.
func (c *Cluster) forwardAPIServer(file string) (*apiForwarder, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("listening for the apiserver forwarder: %w", err)
	}
	f := &apiForwarder{l: l}
	go f.serve(c.dialer)
	cfg, err := clientcmd.LoadFromFile(c.AdminKubeconfig)
	if err == nil {
		for _, cl := range cfg.Clusters {
			cl.Server = "https://" + l.Addr().String()
		}
		err = clientcmd.WriteToFile(*cfg, file)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("writing the forwarder's kubeconfig: %w", err)
	}
	return f, nil
}

func (f *apiForwarder) serve(d *netnsDialer) {
	for {
		in, err := f.l.Accept()
		if err != nil {
			return
		}
		go func() {
			defer in.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			out, err := d.DialContext(ctx, "tcp", strings.TrimPrefix(apiServer, "https://"))
			cancel()
			if err != nil {
				return
			}
			defer out.Close()
			go func() {
				_, _ = io.Copy(out, in)
				_ = out.(*net.TCPConn).CloseWrite()
			}()
			_, _ = io.Copy(in, out)
		}()
	}
}

// Close stops accepting; connections still open end with their peers.
func (f *apiForwarder) Close() {
	_ = f.l.Close()
}
