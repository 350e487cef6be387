// Command registry serves an OCI registry (go-containerregistry's) in
// plain HTTP on a loopback address, to try `make push` and `helm install`
// on one machine without a registry account, and for tests that need a
// registry process rather than one in their own.
//
//	registry [--addr 127.0.0.1:5000] [--dir DIR] [--referrers=false]
//	# then: make push REGISTRY=127.0.0.1:5000/mesh
//
// It prints "listening on ADDR" once it accepts connections. Blobs live
// in memory unless --dir names a directory; manifests always do, so what
// it holds is gone when it stops.
package main

import (
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/spf13/pflag"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr, nil))
}

// run serves until the listener fails; ready, when not nil, gets the
// address once it listens (for tests).
func run(args []string, stdout, stderr io.Writer, ready chan<- string) int {
	fs := pflag.NewFlagSet("registry", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "127.0.0.1:5000", "the loopback address to listen on (port 0: any free one)")
	dir := fs.String("dir", "", "keep blobs in this directory instead of memory")
	referrers := fs.Bool("referrers", true, "serve the OCI 1.1 referrers API (without it clients fall back to the sha256-<digest> tag, as with ghcr.io)")
	verbose := fs.Bool("v", false, "log every request")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return 0
		}
		return 2
	}
	host, _, err := net.SplitHostPort(*addr)
	if ip := net.ParseIP(host); err != nil || (host != "localhost" && (ip == nil || !ip.IsLoopback())) {
		fmt.Fprintf(stderr, "registry: --addr %q: want a loopback host:port (it serves plain HTTP without authentication)\n", *addr)
		return 2
	}
	logOut := io.Discard
	if *verbose {
		logOut = stderr
	}
	opts := []registry.Option{registry.Logger(log.New(logOut, "", log.LstdFlags)), registry.WithReferrersSupport(*referrers)}
	if *dir != "" {
		// The disk handler writes into the directory without making it:
		// a missing one failed every push with a 500 on the first blob.
		if err := os.MkdirAll(*dir, 0o755); err != nil {
			fmt.Fprintf(stderr, "registry: --dir: %v\n", err)
			return 1
		}
		opts = append(opts, registry.WithBlobHandler(registry.NewDiskBlobHandler(*dir)))
	}
	l, err := net.Listen("tcp", *addr)
	if err != nil {
		fmt.Fprintf(stderr, "registry: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "listening on %s\n", l.Addr())
	if ready != nil {
		ready <- l.Addr().String()
	}
	srv := &http.Server{Handler: registry.New(opts...), ReadHeaderTimeout: 10 * time.Second}
	if err := srv.Serve(l); err != nil {
		fmt.Fprintf(stderr, "registry: %v\n", err)
		return 1
	}
	return 0
}
