// Package e2e holds the one-machine end-to-end test of nftmesh: the built
// nftmesh-agent installs the built nftmesh-cni and its companion
// nftmesh-cni-standalone into a temporary "host" (CNI bin and conf dirs with the reference bridge plugin, a run dir and a
// service account of a real kube-apiserver), a container runtime's view of
// the chain is driven through libcni inside a throw-away host network
// namespace for a mesh pod stored in the API server, real connections prove
// the capture, a pod that started before the agent is repaired in place
// (found through /proc), and the agent's SIGTERM leaves the host as it was.
//
// It has no non-test code; it needs root, the kube-apiserver test binary
// (make kube-apiserver), etcd and Debian's containernetworking-plugins, and
// skips with a message saying which is missing.
package node
