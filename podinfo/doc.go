// Package podinfo adapts client-go's corev1.Pod to the pure in-mesh
// decision of podinfo/meshpod, for the Go code that holds corev1 objects
// (the agent, tests).
//
// Its subpackages are the plugin's pieces: cniconf (plugin config,
// CNI_ARGS), agentsock (asking the node agent first) and podget (the pod
// GET, failing closed, when the agent does not answer). Nothing here
// programs anything or logs.
package podinfo
