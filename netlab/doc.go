// Package netlab builds throw-away network labs and sends real traffic
// through them: a "pod" and a "peer" network namespace joined by a veth pair
// (the peer owning the "external" destinations), listeners that stand in for
// Envoy (15001, 15006), the DNS proxy (15053), the app and the outside world,
// each answering with where a connection landed and its original
// destination, and probes sent as any UID/GID without executing a binary.
//
// It does not own capture rules: a backend applies a redirect.Plan into
// Topology.PodNetnsPath() and this package only observes traffic. It is
// product code because the `redirect demo` command ships it, so it never runs
// a binary; the test kit's testkit/nettest builds its expectations and
// scenario runs on it. Everything it does needs root (CAP_SYS_ADMIN and
// CAP_NET_ADMIN).
package netlab
