//go:build tools

// Package tools records the binaries this module exists to build: the
// kube-apiserver the kubetest helper starts, and the rest of a single-node
// cluster (controller-manager, scheduler, kubelet, kube-proxy, kubectl) that
// the cluster end-to-end test runs.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
