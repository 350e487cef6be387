// Package podinfo turns a Kubernetes pod into a capture decision: is the pod
// in the mesh (Istio's sidecar selection rules, in Istio's order), and if so
// which redirect.Spec it gets from its istio-proxy container and annotations.
// It also owns the CNI side of that lookup: the plugin's JSON config, the
// K8S_* CNI_ARGS, and fetching the pod from the API server with a bounded
// retry (fail closed).
//
// It does not program anything: backends apply the Plan built from the Spec,
// and cmd/nftmesh-cni wires the pieces and logs. Nothing here logs.
package podinfo
