// Package bench holds `make bench`'s side-by-side comparison of whole
// processes: nftmesh-cni against Istio's own istio-cni plugin (built from the
// istio.io/istio module into .cache/ by `make istio-cni`), run in the same
// benchmark, alternating, each ADD into a fresh network namespace, against
// the same pod served by the same API server; and the node agent's memory
// and idle CPU with a cluster's worth of pods in a real kube-apiserver.
// Everything is in the tests; the package has no code of its own.
package bench
