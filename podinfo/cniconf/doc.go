// Package cniconf is the plugin's side of its CNI invocation: the plugin
// config from the conflist (with Istio's older field names), the pod
// identity in CNI_ARGS, and the decisions made before any lookup. It
// imports nothing from Kubernetes, so the plugin that links it starts
// without client-go's package initialisation.
package cniconf
