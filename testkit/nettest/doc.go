// Package nettest is the real-traffic harness of nftmesh: it proves with
// actual sockets where connections land once a backend has programmed a
// pod's network namespace.
//
// It owns: a throw-away topology (a "pod" and a "peer" network namespace
// joined by a veth pair, the peer owning the "external" destinations), the
// listeners that stand in for Envoy (15001, 15006), the DNS proxy (15053), the
// app and the outside world, each answering with where the connection landed
// and its original destination; probes sent as any UID/GID without executing
// a binary; and the expected landing of every probe per scenario, derived
// from Istio's documented chain semantics (ISTIO-REFERENCE.md §5), never from
// what a backend produced.
//
// It does not own capture rules: backends apply a redirect.Plan into
// Topology.PodNetnsPath() and this package only observes traffic. It never
// runs a binary, because the `redirect demo` command ships it. Everything it
// does needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN).
package nettest
