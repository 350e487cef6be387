// Package podinfo turns a Kubernetes pod into a capture decision: is the pod
// in the mesh (Istio's sidecar selection rules, in Istio's order), and if so
// which redirect.Spec it gets from its istio-proxy container and annotations.
// It adapts client-go's corev1.Pod to the pure decision in podinfo/meshpod
// and reads Pod manifests, for the Go code that holds corev1 objects (the
// agent's repair, tests).
//
// The plugin's own pieces: podinfo/cniconf (plugin config, CNI_ARGS;
// re-exported here), podinfo/podget (the pod GET through client-go,
// failing closed, when the node agent does not answer) and
// podinfo/agentsock (asking the node agent first).
//
// It does not program anything: backends apply the Plan built from the Spec,
// and cniplugin wires the pieces and logs. Nothing here logs.
package podinfo
