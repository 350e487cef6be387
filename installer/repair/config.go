// Package repair is the node agent's repair controller: it watches this
// node's pods and, for each one that started without capture (its
// validation init container last exited with the configured code; with
// Linkerd support, also a Linkerd pod whose linkerd-network-validator
// exited with Linkerd's code), runs the configured mode's Strategy: repair
// in place, delete the pod, or label it. It counts every outcome under nftmesh's and Istio's metric
// names and tracks whether it reaches the API server.
//
// It programs no capture rules: repair in place goes through a
// PodRepairer (installer/inplace). The controller and its strategies log
// to the agent's logger, as a long-running loop whose events matter to an
// operator; nothing else here logs.
package repair

// Mode is the single repair action the controller takes.
type Mode string

// Repair modes, in Istio's order of precedence; also the mode (ours) and
// type (Istio's) label of the repair metrics.
const (
	None    Mode = ""
	InPlace Mode = "repair"
	Delete  Mode = "delete"
	Label   Mode = "label"
)

// Config configures the repair controller with Istio's repair settings.
type Config struct {
	Enabled                         bool
	RepairPods                      bool
	DeletePods                      bool
	LabelPods                       bool
	NodeName                        string
	InitContainerName               string
	InitContainerExitCode           int
	InitContainerTerminationMessage string
	SidecarAnnotation               string
	BrokenPodLabelKey               string
	BrokenPodLabelValue             string
	LabelSelectors                  string
	FieldSelectors                  string
	// HostProc is the host's /proc as the agent sees it, where repair in
	// place finds pod namespaces.
	HostProc string
	// Linkerd also makes a Linkerd pod whose network validator failed
	// broken (LinkerdBroken), whatever the Istio settings above say: the
	// agent's --linkerd.
	Linkerd bool
}

// What marks a Linkerd pod that started without capture, as Linkerd's own
// repair controller (linkerd-cni-repair-controller) reads it: the label
// Linkerd's injector puts on every data plane pod, and the validator init
// container's name and failure exit code (95, EOPNOTSUPP). Linkerd does not
// make them configurable.
const (
	LinkerdPodLabel           = "linkerd.io/control-plane-ns"
	LinkerdValidatorContainer = "linkerd-network-validator"
	LinkerdValidatorExitCode  = 95
)

// DefaultConfig is Istio's defaults (its validation container, exit code,
// annotation and label), disabled: the agent's flag defaults.
func DefaultConfig() Config {
	return Config{
		InitContainerName:     "istio-validation",
		InitContainerExitCode: 126,
		SidecarAnnotation:     "sidecar.istio.io/status",
		BrokenPodLabelKey:     "cni.istio.io/uninitialized",
		BrokenPodLabelValue:   "true",
		HostProc:              "/host/proc",
	}
}

// Mode is the action the controller takes, by Istio's precedence.
func (r Config) Mode() Mode {
	switch {
	case !r.Enabled:
		return None
	case r.RepairPods:
		return InPlace
	case r.DeletePods:
		return Delete
	case r.LabelPods:
		return Label
	}
	return None
}
