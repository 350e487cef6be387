//go:build nftmesh_pprof

package main

import (
	"net"
	"net/http"
	"net/http/pprof"
	"os"
)

// A build with -tags nftmesh_pprof (the benchmarks' memory profiles, never
// the shipped binary) serves Go's profiles on NFTMESH_PPROF_ADDR, a
// loopback address only.
func init() {
	addr := os.Getenv("NFTMESH_PPROF_ADDR")
	if addr == "" {
		return
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil || !net.ParseIP(host).IsLoopback() {
		return
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return
	}
	go func() { _ = http.Serve(ln, mux) }()
}
