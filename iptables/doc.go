// Package iptables is the iptables-legacy (x_tables) backend of the redirect
// engine: the iptables-save rendering of a Plan (Render, the contract for
// the legacy backend and `redirect render -o iptables`), the pure-Go
// x_tables encoder/decoder for the few matches and targets Istio's capture
// needs, and the Backend that installs them with IPT_SO_SET_REPLACE /
// IP6T_SO_SET_REPLACE on a raw socket created inside the pod's network
// namespace. It never runs an iptables binary and does not decide policy
// (the Plan comes from redirect.Build). Entries of other software in the
// same tables are kept opaque: only our chains (ISTIO_*) and the rules we
// tag with the comment "nftmesh" in builtin chains are ours. Backend
// selection (LegacyAvailable, Probe) lives here too, as it needs the same
// socket and table reader.
package iptables
