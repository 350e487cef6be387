package capture

import (
	"errors"
	"net/netip"

	"github.com/nftmesh/nftmesh/podinfo/meshpod"
	"github.com/nftmesh/nftmesh/redirect"
)

// Decision is what a pod gets: whether it is in the mesh, why, and in the
// mesh its spec (IPv6 capture decided) and plan.
type Decision struct {
	InMesh bool
	Reason string
	Spec   redirect.Spec
	Plan   redirect.Plan
}

// AddrSource reads the addresses of the pod's network namespace in the
// kernel's order. Plan calls it only for a pod in the mesh.
type AddrSource func() ([]netip.Addr, error)

// Steps of Plan, as PlanError names them.
const (
	// StepDecide: the pod's annotations or proxy settings are invalid;
	// the pod must change, retrying cannot help.
	StepDecide = "decide"
	// StepAddrs: the namespace's addresses could not be read.
	StepAddrs = "addresses"
	// StepBuild: the decided spec does not build.
	StepBuild = "build"
)

// PlanError is the error of Plan and Add: the step that failed and its
// error, whose text it keeps unchanged.
type PlanError struct {
	Step string
	Err  error
}

func (e *PlanError) Error() string { return e.Err.Error() }
func (e *PlanError) Unwrap() error { return e.Err }

// PlanStep returns the step of a *PlanError in err's chain, or "".
func PlanStep(err error) string {
	var pe *PlanError
	if errors.As(err, &pe) {
		return pe.Step
	}
	return ""
}

// Plan decides what pod gets, for every front end: meshpod.Decide, then
// for a pod in the mesh IPv6 capture as Istio decides it, from the
// addresses inside the pod's namespace (addrs; nil keeps Decide's
// prediction from the pod's IPs) and the sidecar's ISTIO_DUAL_STACK, then
// redirect.Build. Capturing IPv6 for a sidecar that does not listen on it
// would break the app's IPv6 connections. Errors are *PlanError.
func Plan(pod *meshpod.Pod, addrs AddrSource) (Decision, error) {
	in, reason, spec, err := meshpod.Decide(pod)
	if err != nil {
		return Decision{InMesh: in, Reason: reason, Spec: spec}, &PlanError{Step: StepDecide, Err: err}
	}
	if !in {
		return Decision{Reason: reason}, nil
	}
	if meshpod.MeshOf(reason) == meshpod.MeshLinkerd {
		// linkerd-cni writes IPv6 rules as its node setting says, whatever
		// the pod's addresses.
		addrs = nil
	}
	d, err := PlanSpec(spec, addrs)
	d.Reason = reason
	return d, err
}

// PlanSpec is Plan for a spec already decided (the CLI's annotations and
// flags): IPv6 capture from addrs (nil keeps spec.IPv6), then Build.
func PlanSpec(spec redirect.Spec, addrs AddrSource) (Decision, error) {
	d := Decision{InMesh: true, Spec: spec}
	if addrs != nil {
		list, err := addrs()
		if err != nil {
			return d, &PlanError{Step: StepAddrs, Err: err}
		}
		d.Spec.IPv6 = meshpod.IPv6Capture(list, spec.DualStack)
	}
	p, err := redirect.Build(d.Spec)
	if err != nil {
		return d, &PlanError{Step: StepBuild, Err: err}
	}
	d.Plan = p
	return d, nil
}
