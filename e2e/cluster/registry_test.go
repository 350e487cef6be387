package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/registry"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/nftmesh/nftmesh/internal/hostns"
)

// loopRegistry is an OCI registry (go-containerregistry's pkg/registry,
// blobs on disk) that the test process serves at one address,
// 127.0.0.1:<port>, on two loopbacks: the machine's, where `make push` and
// helm run as a user's shell would (with the module proxy in reach), and the
// node's, where containerd pulls. Same handler, same storage: one registry
// under one name for both.
type loopRegistry struct {
	Addr string // 127.0.0.1:<port>, the same on both sides

	servers []*http.Server
	mu      sync.Mutex
	reqs    []regRequest
}

// regRequest is one request the registry answered.
type regRequest struct {
	side          string // "machine" or "node": the loopback it came in on
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
	logFile, err := os.Create(filepath.Join(dir, "registry.log"))
	if err != nil {
		return nil, fmt.Errorf("creating the registry's log: %w", err)
	}
	h := registry.New(registry.WithBlobHandler(registry.NewDiskBlobHandler(filepath.Join(dir, "blobs"))),
		registry.WithReferrersSupport(true), registry.Logger(log.New(logFile, "", log.LstdFlags)))
	var machine, node net.Listener
	// The kernel picks a free port on the machine's loopback; the node's
	// has few sockets, but an outgoing connection of one of its components
	// can hold the same port there: then try another.
	for range 20 {
		if machine, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			return nil, fmt.Errorf("listening on the machine's loopback: %w", err)
		}
		node, err = c.listenInNode(machine.Addr().String())
		if err == nil {
			break
		}
		machine.Close()
		if !errors.Is(err, syscall.EADDRINUSE) {
			return nil, err
		}
	}
	if err != nil {
		return nil, err
	}
	r := &loopRegistry{Addr: machine.Addr().String()}
	for side, l := range map[string]net.Listener{"machine": machine, "node": node} {
		srv := &http.Server{Handler: r.record(side, h), ReadHeaderTimeout: 10 * time.Second}
		r.servers = append(r.servers, srv)
		go func() { _ = srv.Serve(l) }()
	}
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
