// Package iptables is the iptables-legacy (x_tables) backend of the redirect
// engine: a Plan's iptables-save rendering (Render, the contract for the
// legacy backend and `redirect render -o iptables`), a pure-Go x_tables
// encoder/decoder for the few matches and targets Istio's capture needs, and
// the Backend that installs them with IPT_SO_SET_REPLACE /
// IP6T_SO_SET_REPLACE on a raw socket made inside the pod's namespace. It
// runs no iptables binary and takes its Plan from redirect.Build. Other
// software's entries stay opaque: only our chains (ISTIO_*) and the rules we
// tag "nftmesh" in builtin chains are ours. Backend selection
// (LegacyAvailable, Sockets.Probe) lives here, on the same socket and reader.
package iptables
