//go:build tools

// Package tools records the binaries this module exists to build.
package tools

import _ "k8s.io/kubernetes/cmd/kube-apiserver"
