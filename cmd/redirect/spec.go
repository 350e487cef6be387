package main

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/pflag"

	"github.com/nftmesh/nftmesh/capture"
	"github.com/nftmesh/nftmesh/podinfo/meshpod"
	"github.com/nftmesh/nftmesh/podinfo/meshpod/manifest"
	"github.com/nftmesh/nftmesh/redirect"
	"github.com/nftmesh/nftmesh/redirect/quote"
)

// specFlags are the flags that say which capture spec to use: a Pod
// manifest, or annotations plus the proxy container's settings.
type specFlags struct {
	pod         string
	name        string
	annotations []string
	needInput   bool // see requireInput
	defaults    bool
	ipv6        bool
	dualStack   bool
	dns         bool
	dropInvalid bool
	uids        string
	gids        string
	// live, when set, is the pod read from the agent (inspect
	// NAMESPACE/NAME) in place of a --pod manifest.
	live *manifest.Object
}

// hasPod says whether the spec comes from a pod: a manifest or a live one.
func (f *specFlags) hasPod() bool { return f.pod != "" || f.live != nil }

// register adds the spec flags; netns says whether the command takes
// --netns, whose addresses then decide IPv6 capture.
func (f *specFlags) register(fs *pflag.FlagSet, netns bool) {
	// A `WORD` in a usage is the flag's value name in --help (pflag).
	fs.StringVarP(&f.pod, "pod", "f", "", "manifest `FILE` (YAML or JSON; - reads standard input) of a Pod, or of a workload whose pod template to read ("+manifest.WorkloadKinds+"; istioctl kube-inject output too), to take the spec from as the CNI plugin would")
	fs.StringVar(&f.name, "name", "", "with --pod: the Pod or workload to take when the manifest holds several (documents or a List), as `NAME`, NAMESPACE/NAME or KIND/NAME")
	fs.StringArrayVarP(&f.annotations, "annotation", "a", nil, "pod annotation `key=value` (repeatable), e.g. traffic.sidecar.istio.io/excludeOutboundIPRanges=10.0.0.0/8")
	ipv6, dual := "also capture IPv6 and add ::6/128 to lo", "the sidecar is dual-stack (ISTIO_DUAL_STACK=true)"
	if netns {
		ipv6 += "; without it, decided from the namespace's addresses as Istio does"
		dual += ": capture IPv6 whenever the namespace has an IPv6 address, not only when its first address is IPv6"
	}
	fs.BoolVar(&f.ipv6, "ipv6", false, ipv6)
	fs.BoolVar(&f.dualStack, "dual-stack", false, dual)
	fs.BoolVar(&f.dns, "dns-capture", false, "capture DNS to the agent on 15053 (ISTIO_META_DNS_CAPTURE=true)")
	fs.BoolVar(&f.dropInvalid, "drop-invalid", false, "drop conntrack-invalid packets (INVALID_DROP=true)")
	fs.StringVar(&f.uids, "proxy-uid", "1337", "proxy `UIDs` whose traffic is never captured (comma list)")
	fs.StringVar(&f.gids, "proxy-gid", "1337", "proxy `GIDs` whose traffic is never captured (comma list)")
}

// requireInput makes the command refuse to run without --pod, --annotation
// or --defaults, which it registers: Istio's defaults are used when asked
// for, never because the input was forgotten (`redirect render` alone, or
// a manifest piped in without --pod -).
func (f *specFlags) requireInput(fs *pflag.FlagSet) {
	f.needInput = true
	fs.BoolVar(&f.defaults, "defaults", false, "use Istio's default capture (no --pod or --annotation): all outbound, all inbound ports")
}

// stdinPiped says whether standard input is a pipe or a file (a manifest
// may be waiting there), not a terminal or /dev/null.
var stdinPiped = func() bool {
	st, err := os.Stdin.Stat()
	return err == nil && (st.Mode()&os.ModeNamedPipe != 0 || st.Mode().IsRegular())
}

// noInputErr says that no capture settings were given, and how to give them.
func noInputErr() error {
	hint := ""
	if stdinPiped() {
		hint = " (standard input is read only with --pod -)"
	}
	return usageErr("no capture settings given: use --pod FILE, --annotation key=value, or --defaults for Istio's default capture%s", hint)
}

// stdin is where --pod - reads the manifest from.
var stdin io.Reader = os.Stdin

// readPod reads the --pod manifest (a file, or standard input for "-"):
// the Pod or workload --name names.
func (f *specFlags) readPod() (manifest.Object, error) {
	if f.live != nil {
		return *f.live, nil
	}
	if f.pod != "-" {
		o, err := manifest.ReadWorkload(f.pod, f.name)
		if errors.Is(err, fs.ErrNotExist) && outputFormats[f.pod] {
			// -f was the format flag before it became kubectl's file flag.
			err = fmt.Errorf("%w (-f is the Pod manifest, as in kubectl; the output format is -o %s)", err, f.pod)
		}
		return o, err
	}
	data, err := manifest.ReadCapped(stdin, "from standard input")
	if err != nil {
		return manifest.Object{}, err
	}
	o, err := manifest.ParseWorkload(data, f.name)
	if err != nil {
		return manifest.Object{}, fmt.Errorf("reading pod manifest from standard input: %w", manifest.Source(err, "standard input"))
	}
	return o, nil
}

// resolved is the outcome of reading the spec flags.
type resolved struct {
	spec    redirect.Spec
	inMesh  bool
	reason  string
	subject string // "pod ns/name", "the given annotations", "Istio's defaults"
	// mesh is the mesh whose rules these are (meshpod.MeshIstio, MeshLinkerd).
	mesh string
	// podIPs are the manifest's status.podIP(s) that parse (for trace:
	// a connection to one of them stays on lo).
	podIPs []netip.Addr
	// warnings name the manifest's annotations that look like capture
	// settings but are not read (misspellings, mostly).
	warnings []string
}

// resolve builds the Spec. Flags that describe the proxy container conflict
// with --pod (the manifest says it), except --ipv6, which a manifest cannot
// know before the pod has IPs (planIn decides it from a namespace).
func (f *specFlags) resolve(fs *pflag.FlagSet) (resolved, error) {
	switch {
	case f.name != "" && f.pod == "":
		return resolved{}, usageErr("--name picks a Pod from the --pod manifest: give --pod too")
	case f.defaults && (f.hasPod() || len(f.annotations) > 0):
		return resolved{}, usageErr("--defaults cannot be combined with --pod or --annotation: it stands for a pod without capture annotations")
	case f.needInput && !f.hasPod() && len(f.annotations) == 0 && !f.defaults:
		return resolved{}, noInputErr()
	}
	if f.hasPod() {
		return f.resolvePod(fs)
	}
	ann, err := parseAnnotationFlags(f.annotations)
	if err != nil {
		return resolved{}, err
	}
	if redirect.WantsNoCapture(ann) {
		// As for a pod with this annotation: no capture, said with exit 4.
		return resolved{subject: "a pod with these annotations", reason: meshpod.ReasonInterceptionNone}, nil
	}
	base := redirect.DefaultSpec()
	base.IPv6, base.DualStack, base.CaptureDNS, base.DropInvalid = f.ipv6, f.dualStack, f.dns, f.dropInvalid
	if base.ProxyUIDs, err = parseIDs("--proxy-uid", f.uids); err != nil {
		return resolved{}, err
	}
	if base.ProxyGIDs, err = parseIDs("--proxy-gid", f.gids); err != nil {
		return resolved{}, err
	}
	subject := "the given annotations"
	if f.defaults {
		subject = "Istio's defaults"
	}
	spec, err := redirect.ParseAnnotations(base, ann)
	if err != nil {
		return resolved{subject: subject}, usageErr("%w", err)
	}
	return resolved{spec: spec, inMesh: true, subject: subject}, nil
}

// resolvePod decides from the --pod manifest.
func (f *specFlags) resolvePod(fs *pflag.FlagSet) (resolved, error) {
	if len(f.annotations) > 0 {
		return resolved{}, usageErr("--pod and --annotation cannot be combined: put the annotations in the manifest")
	}
	for _, name := range []string{"dns-capture", "drop-invalid", "dual-stack", "proxy-uid", "proxy-gid"} {
		if fs.Changed(name) {
			return resolved{}, usageErr("--%s cannot be combined with --pod: the manifest's istio-proxy container decides it", name)
		}
	}
	o, err := f.readPod()
	if err != nil {
		return resolved{}, usageErr("%v", err)
	}
	pod := o.Pod
	in, reason, spec, err := meshpod.Decide(pod)
	subject, mesh := o.Subject(), meshpod.MeshOf(reason)
	if mesh == meshpod.MeshLinkerd {
		// Istio's stays unsaid: it is what the CLI shows by default.
		subject += linkerdSubject
	}
	warnings := redirect.UnknownAnnotationWarnings(pod.Annotations)
	if err != nil {
		// Named as the manifest names it (Decide says "pod NS/NAME",
		// which is "pod /NAME" for a template without a namespace).
		return resolved{subject: subject, warnings: warnings}, usageErr("reading capture settings of %s: %w", subject, cmp.Or(errors.Unwrap(err), err))
	}
	if fs.Changed("ipv6") {
		spec.IPv6 = f.ipv6
	}
	var ips []netip.Addr
	for _, s := range pod.PodIPs {
		if a, err := netip.ParseAddr(s); err == nil {
			ips = append(ips, a.Unmap())
		}
	}
	return resolved{spec: spec, inMesh: in, reason: reason, subject: subject, mesh: mesh, podIPs: ips, warnings: warnings}, nil
}

// linkerdSubject follows a Linkerd pod's name wherever the CLI names it.
const linkerdSubject = ", a Linkerd pod: Linkerd's capture as linkerd-cni sets it up, with linkerd2-cni's default node settings"

// parseAnnotationFlags reads --annotation key=value flags: each key once,
// and each a capture annotation.
func parseAnnotationFlags(kvs []string) (map[string]string, error) {
	ann := map[string]string{}
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || strings.TrimSpace(k) == "" {
			return nil, usageErr("--annotation %s: want key=value", quote.Value(kv))
		}
		k = strings.TrimSpace(k)
		if _, dup := ann[k]; dup {
			return nil, usageErr("--annotation %s given twice", quote.Value(k))
		}
		ann[k] = v
	}
	for k := range ann {
		if !slices.Contains(redirect.CaptureAnnotations, k) {
			if s := redirect.SuggestAnnotation(k); s != "" && slices.Contains(redirect.CaptureAnnotations, s) {
				return nil, usageErr("--annotation %s: not a capture annotation; did you mean %q?", quote.Value(k), s)
			}
			return nil, usageErr("--annotation %s: not a capture annotation (known: %s)", quote.Value(k), strings.Join(redirect.CaptureAnnotations, ", "))
		}
	}
	return ann, nil
}

func parseIDs(flag, v string) ([]uint32, error) {
	var out []uint32
	for _, s := range strings.Split(v, ",") {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		n, err := strconv.ParseUint(s, 10, 32)
		if err != nil || n == 0 {
			return nil, usageErr("%s %s: not a non-zero numeric ID", flag, quote.Value(s))
		}
		out = append(out, uint32(n))
	}
	if len(out) == 0 {
		return nil, usageErr("%s %s: at least one ID is required", flag, quote.Value(v))
	}
	return out, nil
}

// planIn resolves the flags and builds the plan (a pod the CNI would skip
// is exit code 4) for a pod in the network namespace at netns (none if ""):
// unless --ipv6 is given, IPv6 capture is decided from its addresses, as the
// CNI plugin does.
func (f *specFlags) planIn(fs *pflag.FlagSet, netns string) (redirect.Plan, resolved, error) {
	r, err := f.resolve(fs)
	if err != nil {
		return redirect.Plan{}, r, err
	}
	if !r.inMesh {
		return redirect.Plan{}, r, &exitError{exitNotInMesh, fmt.Errorf("%s is not in the mesh: %s", r.subject, r.reason)}
	}
	var addrs capture.AddrSource
	// Linkerd's IPv6 capture is a node setting, not the pod's addresses.
	if netns != "" && !fs.Changed("ipv6") && r.mesh != meshpod.MeshLinkerd {
		addrs = func() ([]netip.Addr, error) { return pipeline.Addrs(netns) }
	}
	d, err := capture.PlanSpec(r.spec, addrs)
	r.spec = d.Spec
	switch capture.PlanStep(err) {
	case "":
	case capture.StepAddrs:
		return redirect.Plan{}, r, failure(errors.Unwrap(err))
	default:
		return redirect.Plan{}, r, usageErr("%s: %w", r.subject, errors.Unwrap(err))
	}
	return d.Plan, r, nil
}
