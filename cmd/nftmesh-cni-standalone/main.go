// Command nftmesh-cni-standalone is nftmesh's whole chained CNI plugin in
// one process (package internal/cniplugin): it looks the pod up, decides
// and programs the capture rules itself. The nftmesh-cni front process runs
// it (execve, same environment and config) whenever the node agent does not
// take a call; run on its own it is a complete CNI plugin.
//
//go:debug updatemaxprocs=0
package main

import (
	"github.com/nftmesh/nftmesh/internal/cniplugin"
	_ "github.com/nftmesh/nftmesh/internal/oneproc" // GOMAXPROCS 1 from package initialisation
)

// The //go:debug line above keeps the runtime from starting the goroutine
// (and thread) that re-reads the cgroup's CPU limit while the process runs:
// a run lasts milliseconds. (Go reads the cgroup files once at start
// whatever the settings.) GOMAXPROCS is 1 from package initialisation on
// (internal/oneproc): one goroutine works at a time, and with a second P the
// runtime wakes idle threads at every goroutine started or readied
// (measured on a whole ADD with the agent answering, 60 + 60 interleaved at
// load 0.6-1.4: p50 0.85-0.93x, CPU 4.98-5.33 vs 6.12-6.24 ms); setting it
// in main instead stopped the world for ~0.25 ms.
func main() { cniplugin.Main() }
