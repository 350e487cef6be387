// Command nftmesh-cni-standalone is nftmesh's whole chained CNI plugin in
// one process (package cniplugin): it looks the pod up, decides
// and programs the capture rules itself. The nftmesh-cni front process runs
// it (execve, same environment and config) whenever the node agent does not
// take a call; run on its own it is a complete CNI plugin.
//
//go:debug updatemaxprocs=0
package main

import "github.com/nftmesh/nftmesh/cniplugin"

// The //go:debug line above keeps the runtime from starting the goroutine
// (and thread) that re-reads the cgroup's CPU limit while the process runs:
// a run lasts milliseconds. (Go reads the cgroup files once at start
// whatever the settings.) GOMAXPROCS is 1 when the nftmesh-cni front runs
// it (it sets GOMAXPROCS=1 in the plugin's environment unless the runtime
// set one: its standaloneEnv; docs/performance.md has the 100-ADD burst's
// figures), the runtime's default when run on its own.
func main() { cniplugin.Main() }
