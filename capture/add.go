package capture

import (
	"context"
	"errors"
	"io/fs"
	"net/netip"

	"github.com/nftmesh/nftmesh/internal/phase"
	"github.com/nftmesh/nftmesh/podinfo/meshpod"
)

// Steps of Add besides Plan's (StepDecide, StepAddrs, StepBuild), as
// PlanError names them.
const (
	// StepOpen: the namespace path cannot be opened, is no network
	// namespace, or is the host's.
	StepOpen = "open"
	// StepPod: the pod source failed; its error is passed on unchanged.
	StepPod = "pod"
	// StepApply: the plan could not be applied (see Apply).
	StepApply = "apply"
)

// PodSource returns the pod an Add captures. Add calls it once, after the
// namespace path passed its checks.
type PodSource func() (*meshpod.Pod, error)

// Added is what Add did: the decision and, for a pod in the mesh, what
// Apply did (its Backend is set once one was chosen, on failure too).
type Added struct {
	Decision
	Applied
}

// Add is a pod's ADD in one call:
//
//  1. the namespace at path is opened and checked (Open) before anything
//     else is read or written: a FIFO or other file there is refused
//     without blocking on it, and so is the host's namespace. A path that
//     does not exist goes on to the next step: it can neither block nor be
//     the host's, and the pod source's error, when it fails too, is the
//     more useful one;
//  2. the pod comes from pod, and Plan decides what it gets, from the
//     namespace's addresses (Addrs of path);
//  3. for a pod in the mesh, the namespace is opened again if it was
//     missing, and the plan applied (Apply).
//
// A pod that is not in the mesh is an Added with InMesh false and its
// reason: nothing is written. Errors are *PlanError naming the step that
// failed (StepOpen, StepPod, Plan's steps, StepApply), whose text is its
// error's.
func (pl *Pipeline) Add(ctx context.Context, path string, pod PodSource, o Options) (Added, error) {
	n, err := pl.Open(path)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return Added{}, &PlanError{Step: StepOpen, Err: err}
	}
	defer func() { n.Close() }()
	p, err := pod()
	if err != nil {
		return Added{}, &PlanError{Step: StepPod, Err: err}
	}
	d, err := Plan(p, func() ([]netip.Addr, error) { return pl.Addrs(path) })
	a := Added{Decision: d}
	if err != nil {
		return a, err
	}
	phase.Mark("planned")
	if !d.InMesh {
		return a, nil
	}
	if n == nil {
		if n, err = pl.Open(path); err != nil {
			return a, &PlanError{Step: StepOpen, Err: err}
		}
	}
	if a.Applied, err = pl.Apply(ctx, n, d.Plan, o); err != nil {
		return a, &PlanError{Step: StepApply, Err: err}
	}
	return a, nil
}
