// Command nftmesh-cni is the chained CNI plugin of nftmesh. It must run
// after a primary plugin (bridge, Calico, Cilium, ...) in a conflist: on ADD
// it looks the pod up in the Kubernetes API, decides with podinfo whether
// the pod has an injected Istio sidecar, and if so installs the sidecar
// capture rules inside the pod's network namespace in one atomic batch. It
// prints the primary plugin's result unchanged.
//
// It fails closed: when the API server cannot be reached within api_timeout,
// the pod is not found, RBAC forbids the lookup, an annotation is invalid or
// the rules cannot be programmed, ADD returns a CNI error and leaves no rules
// behind, so a mesh pod never starts without its capture. Namespaces in
// exclude_namespaces and the agent's own pods (name prefix "nftmesh-agent-"
// in pod_namespace) are let through before any Kubernetes client exists.
//
// DEL removes our rules, from every backend that holds them, when the netns
// still exists, and succeeds when the netns, the pod or the API is gone.
// CHECK compares the live rules with the pod's plan. STATUS reports the
// plugin unavailable while the agent has not written the kubeconfig. GC has
// nothing to collect: all state lives in pod network namespaces, which die
// with their pods.
//
// Logs are JSON (zerolog) on stderr and in a size-capped file in
// agent_run_dir, never on stdout, which carries the CNI result.
//
//go:debug updatemaxprocs=0
package main

import (
	"fmt"
	"os"
	"runtime/debug"

	cniversion "github.com/containernetworking/cni/pkg/version"

	_ "github.com/nftmesh/nftmesh/internal/oneproc" // GOMAXPROCS 1 from package initialisation
	"github.com/nftmesh/nftmesh/internal/phase"
	"github.com/nftmesh/nftmesh/internal/version"
)

// supportedVersions are the CNI spec versions a conflist may use. A chained
// plugin needs prevResult, which exists from 0.3.x.
var supportedVersions = cniversion.PluginSupports("0.3.1", "0.4.0", "1.0.0", "1.1.0")

func main() {
	phase.Mark("main")
	// A plugin run lives for milliseconds and allocates a few MB: collecting
	// garbage only costs latency. The memory limit still bounds the heap
	// should a huge prevResult or pod object arrive.
	debug.SetGCPercent(-1)
	debug.SetMemoryLimit(128 << 20)
	// The //go:debug line above keeps the runtime from starting the
	// goroutine (and thread) that re-reads the cgroup's CPU limit while the
	// process runs: a run lasts milliseconds. (Go reads the cgroup files
	// once at start whatever the settings.) GOMAXPROCS is 1 from package
	// initialisation on (internal/oneproc): one goroutine works at a time,
	// and with a second P the runtime wakes idle threads at every goroutine
	// started or readied (measured on a whole ADD with the agent answering,
	// 60 + 60 interleaved at load 0.6-1.4: p50 0.85-0.93x, CPU 4.98-5.33
	// vs 6.12-6.24 ms); setting it here in main instead stopped the world
	// for ~0.25 ms.
	// A runtime never passes arguments and always sets CNI_COMMAND, so
	// --version cannot be mistaken for a CNI call.
	if len(os.Args) == 2 && os.Args[1] == "--version" && os.Getenv("CNI_COMMAND") == "" {
		fmt.Println(version.Line("nftmesh-cni"))
		return
	}
	if err := dispatch(cniEnv{getenv: os.Getenv, stdin: os.Stdin, stdout: os.Stdout, stderr: os.Stderr}, cniFuncs(), supportedVersions, about()); err != nil {
		// The CNI protocol: the error as JSON on stdout, exit status 1.
		if perr := err.Print(); perr != nil {
			fmt.Fprintln(os.Stderr, "nftmesh-cni: writing the error to stdout:", perr)
		}
		os.Exit(1)
	}
}

// about is what the plugin prints on stderr when run without CNI_COMMAND.
func about() string {
	return "nftmesh-cni " + version.Get() + ": chained CNI plugin installing Istio sidecar capture rules"
}

func cniFuncs() verbs {
	return verbs{
		Add:    guard("ADD", cmdAdd),
		Del:    guard("DEL", cmdDel),
		Check:  guard("CHECK", cmdCheck),
		Status: guard("STATUS", cmdStatus),
		GC:     guard("GC", cmdGC),
	}
}
