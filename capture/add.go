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
	StepOpen  = "open"  // the path cannot be opened, is no netns, or is the host's
	StepPod   = "pod"   // the pod source failed
	StepApply = "apply" // see Apply
)

// PodSource returns the pod an Add captures, called once after the path
// passed its checks.
type PodSource func() (*meshpod.Pod, error)

// Added is what Add did: the decision and what Apply did (its Backend set
// once one was chosen, on failure too).
type Added struct {
	Decision
	Applied
}

// Add is a pod's ADD in one call: the namespace at path is checked (Open)
// before anything else is read or written, Plan decides what the pod gets
// from the namespace's addresses, and for a pod in the mesh Apply writes
// the plan; a pod not in the mesh gets nothing written. A path that does
// not exist goes on (it can neither block nor be the host's, and the pod
// source's error, when it fails too, is the more useful one) and is opened
// again before Apply. Errors are *PlanError.
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
