// Package installer is the node agent's install job: it puts the
// nftmesh-cni plugin on a node and keeps it there.
//
// It owns the agent's configuration (config.go: one table of flags, with
// Istio's install-cni variables accepted), the atomic copy of the plugin's two
// binaries (the front and its companion, binarySources) into the host's CNI bin
// dirs, the plugin's kubeconfig built from the agent's service account, the
// insertion of our entry (cniconf.PluginConf) into the primary CNI config (or
// a standalone file for Multus) with compare-and-swap writes (installer.go),
// the fsnotify watch (watch.go) and loop (run.go) that put the entry back when
// the primary CNI rewrites its file, and the cleanup (cleanup.go) that leaves
// the primary config byte-identical to what it would be without us, from the
// undo record it keeps in the conf dir (undo.go), so that a reboot between
// install and cleanup changes nothing.
//
// The agent's other jobs live in subpackages, which never import this one:
// installer/conflist (CNI config documents as runtimes load them),
// installer/repair (the repair controller), installer/inplace (repair in
// place), installer/pluginlog (the plugin's log) and installer/metrics.
//
// It programs no capture rules and imports no backend. Functions return
// errors and never log, except Run, the long-running loop whose events
// matter to an operator.
package installer
