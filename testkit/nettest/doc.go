// Package nettest holds backends to Istio's semantics with real traffic. On
// top of netlab's topology, listeners and probes it owns the
// expected landing of every probe per scenario, derived from a model of
// Istio's iptables chains (nat OUTPUT/ISTIO_OUTPUT for local senders, nat
// PREROUTING/ISTIO_INBOUND or the TPROXY mangle chains for what arrives),
// never from what a backend produced, and the runner that applies a
// scenario with a backend and compares every probe's landing with it.
//
// Tests import it; no binary does.
package nettest
