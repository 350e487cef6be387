// Package installer is the nftmesh node agent's library: it puts the
// nftmesh-cni plugin on a node and keeps it there.
//
// It owns the agent's configuration (flags and environment, with Istio's
// install-cni names accepted), the atomic copy of the plugin binary into the
// host's CNI bin dirs, the plugin's kubeconfig built from the agent's
// service account, discovery of the primary CNI config the way the container
// runtime does it, the insertion of our plugin entry into that config (or a
// standalone file for Multus), the fsnotify watch that puts the entry back
// when the primary CNI rewrites its file, the cleanup that leaves the primary
// config byte-identical to what it would be without us, the health, readiness
// and Prometheus endpoints, and the repair controller for pods that started
// before the plugin was in place.
//
// It also surfaces the plugin's log file in the agent's log
// (PluginLogFollower).
//
// It does not program any capture rules and imports no backend: in-place
// repair reaches the backends through the PodRepairer interface, which
// installer/inplace implements and the command wires in. Functions return errors and never log, except Run and the
// repair controller, which take the agent's zerolog logger because they are
// long-running loops whose events matter to an operator.
package installer
