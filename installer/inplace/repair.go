package inplace

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"

	corev1 "k8s.io/api/core/v1"

	"github.com/nftmesh/nftmesh/capture"
	"github.com/nftmesh/nftmesh/installer/repair"
	"github.com/nftmesh/nftmesh/podinfo"
	"github.com/nftmesh/nftmesh/podinfo/cniconf"
	"github.com/nftmesh/nftmesh/podinfo/meshpod"
)

// Options configure a Repairer with the values the plugin on this node uses,
// so a repaired pod ends up exactly as if the plugin had seen it.
type Options struct {
	ProcDir           string   // the host's /proc (/host/proc in the DaemonSet)
	Backend           string   // auto|nftables|iptables-legacy
	ExcludeNamespaces []string // never captured
	PodNamespace      string   // the agent's own namespace
	// RunDir is the agent run dir shared with the plugin: the per-netns
	// locks there keep a repair and a plugin run from interleaving.
	RunDir string
	// Pipeline programs the namespace and Find locates it (the pod's UID
	// and IPs); nil is capture.Linux() and FindNetns over ProcDir. Tests
	// hand in capturetest's in-memory kernel and its namespaces.
	Pipeline *capture.Pipeline
	Find     func(uid string, ips []netip.Addr) (Netns, error)
	// Linkerd is the node's settings for Linkerd pods (the agent's
	// --linkerd-*, as the plugin's config holds them); nil: linkerd2-cni's
	// defaults, as the plugin.
	Linkerd *meshpod.LinkerdConfig
	// LinkerdFacts is what a Linkerd pod's decision reads beyond the pod
	// (the agent's namespace and Service watches); nil: a Linkerd pod that
	// needs them is not repaired.
	LinkerdFacts LinkerdFacts
}

// LinkerdFacts are a namespace's Linkerd override annotations and the API
// server's ports, false while unknown (installer/podcache's Watches).
type LinkerdFacts interface {
	NamespaceAnnotations(name string) (map[string]string, bool)
	APIServerPorts() ([]string, bool)
}

// Repairer implements repair.PodRepairer.
type Repairer struct {
	opts Options
	skip cniconf.Config
	// hostErr is why the host's network namespace could not be
	// registered (nil: it is refused like the caller's own).
	hostErr error
}

var _ repair.PodRepairer = (*Repairer)(nil)

// New checks the options without changing anything: the backend name is
// known and procDir is a proc file system (its self/ns/net resolves).
func New(opts Options) (*Repairer, error) {
	if err := capture.ValidateBackend(opts.Backend); err != nil {
		return nil, fmt.Errorf("configuring repair in place: %w", err)
	}
	if opts.ProcDir == "" {
		return nil, errors.New("configuring repair in place: no host /proc directory")
	}
	if _, err := nsIdentity(filepath.Join(opts.ProcDir, "self", "ns", "net")); err != nil {
		return nil, fmt.Errorf("configuring repair in place: %s is not a proc file system (mount the host's /proc there): %w", opts.ProcDir, err)
	}
	// The host's namespace (the agent's own /proc is its pod's). Without
	// SYS_PTRACE it cannot be read; nor can FindNetns see it then, so
	// repair goes on, but the agent runs no CNI call (HostNetns).
	_, hostErr := capture.AddHostNetnsFromProc(opts.ProcDir)
	if opts.Pipeline == nil {
		opts.Pipeline = capture.Linux()
	}
	if opts.Find == nil {
		procDir := opts.ProcDir
		opts.Find = func(uid string, ips []netip.Addr) (Netns, error) { return FindNetns(procDir, uid, ips) }
	}
	return &Repairer{
		opts:    opts,
		skip:    cniconf.Config{ExcludeNamespaces: opts.ExcludeNamespaces, PodNamespace: opts.PodNamespace},
		hostErr: hostErr,
	}, nil
}

// HostNetns is nil when New registered the host's network namespace (its
// PID 1's, through ProcDir) to be refused like the caller's own, else why
// it could not. Only then may the agent run a CNI call whose namespace a
// caller passes: the host's must never be programmed.
func (r *Repairer) HostNetns() error { return r.hostErr }

// PodIPs returns the pod's IPs from its status (podIPs, else podIP).
func PodIPs(pod *corev1.Pod) ([]netip.Addr, error) {
	var raw []string
	for _, ip := range pod.Status.PodIPs {
		raw = append(raw, ip.IP)
	}
	if len(raw) == 0 && pod.Status.PodIP != "" {
		raw = append(raw, pod.Status.PodIP)
	}
	out := make([]netip.Addr, 0, len(raw))
	for _, s := range raw {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return nil, fmt.Errorf("pod %s/%s status.podIPs: %q is not an IP address", pod.Namespace, pod.Name, s)
		}
		out = append(out, a.Unmap())
	}
	return out, nil
}

// RepairPod decides the pod's capture as the plugin does (capture.Plan, with
// IPv6 capture decided from the addresses in the pod's network namespace),
// finding that namespace through ProcDir, and applies the plan with the
// backend the shared selection picks there.
func (r *Repairer) RepairPod(ctx context.Context, pod *corev1.Pod) (repair.Report, error) {
	var rep repair.Report
	if pod.Spec.HostNetwork {
		return rep, fmt.Errorf("%w: host network pod", repair.ErrNotNeeded)
	}
	if why := r.skip.SkipBeforeLookup(cniconf.K8sArgs{PodNamespace: pod.Namespace, PodName: pod.Name}); why != "" {
		return rep, fmt.Errorf("%w: %s", repair.ErrNotNeeded, why)
	}
	// capture.Plan calls it only for a pod in the mesh whose IPv6 capture
	// depends on its addresses (not a Linkerd pod's: located below).
	var ns Netns
	findNetns := func() ([]netip.Addr, error) {
		var err error
		if ns, err = r.locate(pod, &rep); err != nil {
			return nil, err
		}
		// Read before the identity re-check below, which also covers them.
		addrs, err := r.opts.Pipeline.Addrs(ns.Path)
		if err != nil {
			return nil, fmt.Errorf("reading the addresses of pod %s/%s: %w", pod.Namespace, pod.Name, err)
		}
		return addrs, nil
	}
	m := podinfo.Mesh(pod)
	if err := r.withLinkerd(m); err != nil {
		return rep, err
	}
	d, err := capture.Plan(m, findNetns)
	switch capture.PlanStep(err) {
	case "":
	case capture.StepAddrs:
		return rep, errors.Unwrap(err)
	case capture.StepDecide:
		// Bad annotations stay bad until the pod is recreated (the plugin
		// would have failed it closed): retrying cannot help.
		return rep, fmt.Errorf("%w: %w", repair.ErrImpossible, err)
	default:
		return rep, fmt.Errorf("%w: building capture rules for pod %s/%s: %w", repair.ErrImpossible, pod.Namespace, pod.Name, err)
	}
	if !d.InMesh {
		return rep, fmt.Errorf("%w: %s", repair.ErrNotNeeded, d.Reason)
	}
	if ns.Path == "" {
		if ns, err = r.locate(pod, &rep); err != nil {
			return rep, err
		}
	}

	// The PID could have exited and been reused since the walk: program
	// only the namespace that held the pod's IPs. The descriptor opened
	// here is what capture programs, so the check cannot go stale.
	target, err := r.opts.Pipeline.Open(ns.Path)
	if err == nil && (target.ID.Dev != ns.Dev || target.ID.Ino != ns.Inode) {
		target.Close()
		err = errors.New("the process left; its PID now belongs to another namespace")
	}
	if err != nil {
		return rep, fmt.Errorf("re-checking the network namespace %s of pod %s/%s: %w", ns.Path, pod.Namespace, pod.Name, err)
	}
	defer target.Close()
	res, err := r.opts.Pipeline.Apply(ctx, target, d.Plan, capture.Options{Backend: r.opts.Backend, RunDir: r.opts.RunDir})
	rep.Backend, rep.Why = res.Backend, res.Why
	if errors.Is(err, capture.ErrUserNamespaced) {
		// The configured backend can never program this pod (hostUsers:
		// false with iptables-legacy): retrying cannot help.
		return rep, fmt.Errorf("%w: programming capture rules for pod %s/%s in %s: %w", repair.ErrImpossible, pod.Namespace, pod.Name, ns.Path, err)
	}
	if err != nil {
		return rep, fmt.Errorf("programming capture rules for pod %s/%s in %s: %w", pod.Namespace, pod.Name, ns.Path, err)
	}
	rep.Rules = res.Rules
	return rep, nil
}

// locate finds pod's network namespace from its UID and IPs, noting what
// it found in rep.
func (r *Repairer) locate(pod *corev1.Pod, rep *repair.Report) (Netns, error) {
	ips, err := PodIPs(pod)
	if err != nil {
		return Netns{}, err
	}
	if len(ips) == 0 {
		return Netns{}, fmt.Errorf("pod %s/%s has no IP yet", pod.Namespace, pod.Name)
	}
	ns, err := r.opts.Find(string(pod.UID), ips)
	if err != nil {
		return Netns{}, fmt.Errorf("finding the network namespace of pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	rep.Netns, rep.PID, rep.Candidates, rep.Match = ns.Path, ns.PID, ns.Candidates, ns.Match
	return ns, nil
}

// withLinkerd gives m what the plugin's decision of a Linkerd pod reads
// beyond the pod: the node's settings, and from the agent's watches the
// namespace's override annotations and the API server's ports when the pod
// needs them. Not known yet is retried; not watched cannot be repaired.
func (r *Repairer) withLinkerd(m *meshpod.Pod) error {
	m.Linkerd = r.opts.Linkerd
	needNS, needAPI := meshpod.LinkerdNeedsNamespace(m), meshpod.LinkerdNeedsAPIServerPorts(m)
	if !needNS && !needAPI {
		return nil
	}
	facts := r.opts.LinkerdFacts
	if facts == nil {
		return fmt.Errorf("%w: Linkerd pod %s/%s needs its namespace's annotations or the API server's ports, which the agent watches only with --linkerd",
			repair.ErrImpossible, m.Namespace, m.Name)
	}
	if needNS {
		ann, ok := facts.NamespaceAnnotations(m.Namespace)
		if !ok {
			return fmt.Errorf("the annotations of namespace %s of Linkerd pod %s are not known yet", m.Namespace, m.Name)
		}
		m.NamespaceAnnotations = ann
	}
	if needAPI {
		ports, ok := facts.APIServerPorts()
		if !ok {
			return fmt.Errorf("the API server's ports, which Linkerd control plane pod %s/%s skips, are not known yet", m.Namespace, m.Name)
		}
		m.APIServerPorts = ports
	}
	return nil
}
