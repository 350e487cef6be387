// Package redirect owns the sidecar capture model: the Spec (what Istio's
// annotations and proxy settings ask for, with Istio's defaults and quirks),
// its parsing and validation, the backend-neutral Plan (tables, chains, sets,
// rules made of a closed vocabulary of matches and verdicts), the pure
// Build(Spec) (Plan, error), and the Backend interface the nftables and
// iptables-legacy backends implement.
//
// It does no I/O and imports nothing kernel- or Kubernetes-specific: the
// model can be built, rendered and tested without root. Backends translate a
// Plan; they never decide policy.
package redirect
