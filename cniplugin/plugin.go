package cniplugin

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"runtime/debug"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"github.com/nftmesh/nftmesh/capture"
	"github.com/nftmesh/nftmesh/internal/phase"
	"github.com/nftmesh/nftmesh/podinfo/agentsock"
	"github.com/nftmesh/nftmesh/podinfo/cniconf"
	"github.com/nftmesh/nftmesh/podinfo/meshpod"
	"github.com/nftmesh/nftmesh/podinfo/podget"
	"github.com/nftmesh/nftmesh/redirect"
	"github.com/nftmesh/nftmesh/redirect/quote"
)

// Plugin-specific CNI error codes (the spec reserves 100+ for plugins).
const (
	// CodePodLookup: the pod could not be read (not found, forbidden by
	// RBAC, unauthorized, invalid kubeconfig).
	CodePodLookup uint = 100
	// CodeInvalidCapture: the pod's annotations or proxy settings are
	// invalid; the details name each field and value.
	CodeInvalidCapture uint = 101
	// CodeApply: the capture rules could not be programmed.
	CodeApply uint = 102
	// CodeDrift: CHECK found live rules that differ from the pod's plan,
	// or another installer's capture (Istio's) next to them.
	CodeDrift uint = 103
	// CodeBackendUnsupported: "backend": "iptables-legacy" for a pod whose
	// netns is owned by its own user namespace (hostUsers: false), where the
	// kernel refuses the iptables owner match; only auto or nftables can.
	CodeBackendUnsupported uint = 104
)

// applyErrorCode is the CNI code for a failed Apply or Check: def, or
// CodeBackendUnsupported when the backend was refused for the namespace.
func applyErrorCode(err error, def uint) uint {
	if errors.Is(err, capture.ErrUserNamespaced) {
		return CodeBackendUnsupported
	}
	return def
}

// pipeline does the kernel work of every verb whose Env names none: the
// running kernel, or in the root-free tests an in-memory one.
var pipeline = capture.Linux()

// applyTimeout bounds the kernel work of one verb; it is milliseconds
// normally, so this only stops a wedged netlink socket from hanging kubelet.
const applyTimeout = 30 * time.Second

// guard turns a panic into a CNI error, so the runtime gets an answer on
// stdout instead of a Go trace, and the pod fails closed.
func (r *run) guard(verb string, f func(*cmdArgs) error) func(*cmdArgs) error {
	return func(args *cmdArgs) (err error) {
		defer func() {
			if p := recover(); p != nil {
				fmt.Fprintf(r.env.Stderr, "nftmesh-cni %s panic: %v\n%s", verb, p, debug.Stack())
				err = types.NewError(types.ErrInternal, fmt.Sprintf("nftmesh-cni %s: internal error", verb), fmt.Sprint(p))
			}
		}()
		return f(args)
	}
}

// invocation is one plugin run: its config, pod identity and logger.
type invocation struct {
	r     *run
	verb  string
	start time.Time
	// lookupMS is how long the pod lookup took, if lookedUp; lookupPath is
	// lookupAgent or lookupAPI; agentMiss says why the agent did not answer.
	lookupMS              float64
	lookedUp              bool
	lookupPath, agentMiss string
	args                  *cmdArgs
	conf                  *cniconf.Config
	k8s                   cniconf.K8sArgs
	log                   zerolog.Logger
	// record takes the decision line when log's level hides it.
	record zerolog.Logger
}

// begin parses what every verb needs. On error the returned close is
// still safe to call.
func (r *run) begin(verb string, args *cmdArgs) (*invocation, func(), error) {
	phase.Mark("verb")
	inv := &invocation{r: r, verb: verb, start: time.Now(), args: args, record: zerolog.Nop()}
	conf, err := cniconf.ParseConfig(args.StdinData)
	if err != nil {
		inv.log, _, _ = newLoggers(r.env, nil, verb)
		inv.log.Error().Str("error", detail(err)).Msg("invalid plugin config")
		return inv, func() {}, types.NewError(types.ErrInvalidNetworkConfig, "nftmesh-cni: invalid plugin config", detail(err))
	}
	if r.env.RunDir != "" && conf.AgentRunDir != r.env.RunDir {
		// Its log and kubeconfig are another agent's.
		return inv, func() {}, r.decline()
	}
	inv.conf = conf
	var closeLog func()
	inv.log, inv.record, closeLog = newLoggers(r.env, conf, verb)
	if verb == "STATUS" || verb == "GC" {
		return inv, closeLog, nil
	}
	if err := conf.ParsePrevResult(); err != nil {
		return inv, closeLog, inv.fail(types.NewError(types.ErrDecodingFailure, "nftmesh-cni: invalid prevResult", err.Error()))
	}
	if inv.k8s, err = cniconf.ParseK8sArgs(args.Args); err != nil {
		return inv, closeLog, inv.fail(types.NewError(types.ErrInvalidEnvironmentVariables, "nftmesh-cni: invalid CNI_ARGS", err.Error()))
	}
	phase.Mark("config")
	return inv, closeLog, nil
}

// decide starts the run's one decision line at level l: through the run's
// logger when its level allows, else to the log file alone marked
// record_only (see newLoggers). A call the agent runs hands its decision
// to the agent here.
func (inv *invocation) decide(l zerolog.Level, backend, decision, errText string) *zerolog.Event {
	took := time.Since(inv.start)
	if tell := inv.r.env.Decided; tell != nil {
		d := agentsock.Decision{Command: inv.verb, Decision: decision, Namespace: inv.k8s.PodNamespace, Pod: inv.k8s.PodName,
			RanBy: inv.ranBy(), Error: errText, Took: took, LookupTook: -1}
		if inv.lookedUp {
			d.Lookup, d.LookupTook = inv.lookupPath, time.Duration(inv.lookupMS*float64(time.Millisecond))
		}
		tell(d)
	}
	e := inv.log.WithLevel(l)
	if e == nil {
		e = inv.record.WithLevel(l)
	}
	return inv.event(e, backend, took).Str("decision", decision)
}

func (inv *invocation) event(e *zerolog.Event, backend string, took time.Duration) *zerolog.Event {
	e = e.Str("pod", inv.k8s.PodName).
		Str("namespace", inv.k8s.PodNamespace).
		Str("container_id", inv.args.ContainerID).
		Str("netns", inv.args.Netns).
		Str("backend", backend).
		Float64("duration_ms", float64(took.Microseconds())/1000).
		Str("ran_by", inv.ranBy())
	if inv.r.env.Phases && inv.conf != nil && inv.conf.LogLevel == "debug" {
		// Where this run's time went, from the process's start (µs).
		e = e.Str("phases_us", phase.String())
	}
	if inv.lookedUp {
		e = e.Str("lookup", inv.lookupPath).Float64("lookup_ms", inv.lookupMS)
		if inv.agentMiss != "" {
			e = e.Str("agent_miss", inv.agentMiss)
		}
	}
	return e
}

// declineHere reports whether a call the agent runs is declined for err:
// the kernel refused err's operation (EPERM, EACCES) to the agent, whose
// container may hold fewer capabilities than the plugin's process on the
// host, or the agent ran out of a resource (StarvedOf: descriptors,
// memory, socket buffers) that a process of its own may well have. The
// front then runs the standalone plugin, which does the call from scratch
// (every verb is idempotent). Callers ask only where the namespace is as
// the call found it (see addFailed), or, for DEL, where any state leads to
// the same end.
func (inv *invocation) declineHere(err error) bool {
	return inv.r.env.Ask != nil && (errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES) || agentsock.StarvedOf(err) != "")
}

// ranBy names the process that ran the call.
func (inv *invocation) ranBy() string {
	if inv.r.env.Ask != nil {
		return RanByAgent
	}
	return RanByStandalone
}

// Values of the decision line's ran_by field.
const (
	RanByAgent      = "agent"
	RanByStandalone = "standalone"
)

// decided logs the one decision line of a successful run.
func (inv *invocation) decided(decision, reason string) {
	inv.decide(zerolog.InfoLevel, inv.conf.Backend, decision, "").Str("reason", reason).Msg(inv.verb + " " + decision)
}

// fail logs the decision line of a failed run and returns err.
func (inv *invocation) fail(err *types.Error) error {
	return inv.failWith(inv.conf.Backend, err)
}

func (inv *invocation) podRef() string { return inv.k8s.PodNamespace + "/" + inv.k8s.PodName }

// printPrevResult passes the primary plugin's result on unchanged, or an
// empty result of the config's version when there is none.
func (inv *invocation) printPrevResult() error {
	conf, w := inv.conf, inv.r.env.Stdout
	var res types.Result = &current.Result{CNIVersion: current.ImplementedSpecVersion}
	if conf.PrevResult != nil {
		if raw := conf.PrevResultUnchanged(); raw != nil {
			// Already of the config's version: the bytes the runtime gave,
			// without encoding a result again.
			_, err := w.Write(raw)
			return err
		}
		res = conf.PrevResult
	}
	out, err := res.GetAsVersion(conf.CNIVersion)
	if err != nil {
		return err
	}
	return out.PrintTo(w)
}

// fetchPod fetches the pod from the node agent, else the API server. When
// the agent runs this call and has no answer, the call is declined.
func (inv *invocation) fetchPod(ctx context.Context) (*meshpod.Pod, error) {
	start := time.Now()
	inv.lookedUp = true
	defer func() { inv.lookupMS = durationMS(start) }()
	pod := inv.askAgent(ctx)
	phase.Mark("asked")
	if pod != nil {
		return inv.withLinkerdInputs(ctx, pod, start)
	}
	if inv.r.env.Ask != nil {
		// The plugin's own process asks the API server.
		return nil, inv.r.decline()
	}
	pod, terr := inv.getPod(ctx, inv.conf.APITimeout-time.Since(start))
	if terr != nil {
		// The error line carries the lookup time.
		inv.lookupMS = durationMS(start)
		return nil, inv.fail(terr)
	}
	return inv.withLinkerdInputs(ctx, pod, start)
}

// lookup fetches the pod and decides.
func (inv *invocation) lookup(ctx context.Context) (capture.Decision, error) {
	pod, err := inv.fetchPod(ctx)
	if err != nil {
		return capture.Decision{}, err
	}
	d, err := capture.Plan(pod, func() ([]netip.Addr, error) { return inv.r.pipeline().Addrs(inv.args.Netns) })
	if err != nil {
		return capture.Decision{}, inv.planFailed(err)
	}
	phase.Mark("planned")
	return d, nil
}

// planFailed is the logged CNI error of a failed step of capture.Plan (or
// of capture.Add's planning), or the call declined (declineHere): nothing
// has been written yet.
func (inv *invocation) planFailed(err error) error {
	if inv.declineHere(err) {
		return inv.r.declineFor(err)
	}
	switch capture.PlanStep(err) {
	case capture.StepDecide:
		return inv.fail(types.NewError(CodeInvalidCapture,
			fmt.Sprintf("nftmesh-cni: invalid capture settings for pod %s", inv.podRef()), detail(err)))
	case capture.StepAddrs:
		return inv.fail(types.NewError(types.ErrIOFailure,
			fmt.Sprintf("nftmesh-cni: reading the addresses of pod %s", inv.podRef()), err.Error()))
	}
	return inv.fail(types.NewError(CodeInvalidCapture,
		fmt.Sprintf("nftmesh-cni: cannot build capture rules for pod %s", inv.podRef()), err.Error()))
}

// detail is the per-field text of a validation error (each annotation or
// env var with its value), or the error itself, bounded: it goes into the
// CNI error kubelet shows and into the log.
func detail(err error) string {
	var ve *redirect.ValidationError
	if errors.As(err, &ve) {
		return quote.Text(ve.Error())
	}
	return quote.Text(err.Error())
}

func (r *run) cmdAdd(args *cmdArgs) error {
	inv, closeLog, err := r.begin("ADD", args)
	defer closeLog()
	if err != nil {
		return err
	}
	if reason := inv.conf.SkipBeforeLookup(inv.k8s); reason != "" {
		inv.decided("skip", reason)
		return inv.printPrevResult()
	}
	ctx := r.ctx()
	opts := inv.captureOptions()
	opts.ApplyTimeout = applyTimeout
	added, err := r.pipeline().Add(ctx, args.Netns, func() (*meshpod.Pod, error) { return inv.fetchPod(ctx) }, opts)
	if err != nil {
		return inv.addFailed(added, err)
	}
	if !added.InMesh {
		inv.decided("skip", added.Reason)
		return inv.printPrevResult()
	}
	phase.Mark("applied")
	inv.decide(zerolog.InfoLevel, added.Backend, "capture", "").Str("reason", added.Reason).Str("why", added.Why).
		Int("rules", added.Rules).Bool("ipv6", len(added.Plan.LoopbackAddrs) > 0). // ::6 comes with IPv6 capture
		Msg("ADD capture")
	return inv.printPrevResult()
}

// addFailed is the logged CNI error of a failed capture.Add, by the step
// that failed, or the call declined (declineHere) where the namespace is as
// the call found it: every step before the apply writes nothing, and an
// apply that failed says whether it left the namespace as it was
// (capture.Untouched). A failed write over an earlier run's rules fails
// the call as before: the standalone plugin would start from what the
// write left, not from what the call found.
func (inv *invocation) addFailed(added capture.Added, err error) error {
	step := capture.PlanStep(err)
	var pe *capture.PlanError
	if step == capture.StepPod && errors.As(err, &pe) {
		// The pod source's own error, already logged (or a decline).
		return pe.Err
	}
	if inv.declineHere(err) && (step != capture.StepApply || capture.Untouched(err)) {
		return inv.r.declineFor(err)
	}
	switch step {
	case capture.StepOpen:
		return inv.fail(netnsError(inv.args.Netns, err))
	case capture.StepApply:
		return inv.failWith(added.Backend, types.NewError(applyErrorCode(err, CodeApply),
			fmt.Sprintf("nftmesh-cni: programming capture rules for pod %s in %s", inv.podRef(), inv.args.Netns), err.Error()))
	}
	return inv.planFailed(err)
}

// failWith is fail naming the backend actually chosen.
func (inv *invocation) failWith(backend string, err *types.Error) error {
	// Every error a verb returns passes here: one bound on what it echoes.
	err.Msg, err.Details = quote.Text(err.Msg), quote.Text(err.Details)
	inv.decide(zerolog.ErrorLevel, backend, "error", err.Error()).Uint("code", err.Code).Str("error", err.Error()).Msg(inv.verb + " failed")
	return err
}

func (r *run) cmdCheck(args *cmdArgs) error {
	inv, closeLog, err := r.begin("CHECK", args)
	defer closeLog()
	if err != nil {
		return err
	}
	if reason := inv.conf.SkipBeforeLookup(inv.k8s); reason != "" {
		inv.decided("skip", reason)
		return nil
	}
	ctx := r.ctx()
	ns, d, err := inv.netnsAndPlan(ctx)
	if err != nil {
		return err
	}
	defer ns.Close()
	actx, cancel := context.WithTimeout(ctx, applyTimeout)
	defer cancel()
	// Not in the mesh, d.Plan is empty: no rules of ours.
	backend, err := r.pipeline().Check(actx, ns, d.Plan, inv.captureOptions())
	if inv.declineHere(err) {
		return r.declineFor(err)
	}
	if err != nil {
		code := CodeDrift
		if !redirect.IsDrift(err) {
			code = applyErrorCode(err, types.ErrIOFailure)
		}
		return inv.failWith(backend, types.NewError(code,
			fmt.Sprintf("nftmesh-cni: capture rules of pod %s in %s are not as planned", inv.podRef(), args.Netns), err.Error()))
	}
	// Our rules as planned is not a pass while another installer's
	// capture (Istio's) acts on the same traffic.
	foreign, err := r.pipeline().Foreign(actx, ns)
	if inv.declineHere(err) {
		return r.declineFor(err)
	}
	if err != nil {
		return inv.failWith(backend, types.NewError(types.ErrIOFailure,
			fmt.Sprintf("nftmesh-cni: looking for foreign capture rules of pod %s in %s", inv.podRef(), args.Netns), err.Error()))
	}
	if len(foreign) > 0 {
		return inv.failWith(backend, types.NewError(CodeDrift,
			fmt.Sprintf("nftmesh-cni: pod %s has another installer's traffic capture next to ours", inv.podRef()),
			(&capture.ForeignError{Netns: args.Netns, Found: foreign}).Error()))
	}
	decision := "capture"
	if !d.InMesh {
		decision = "skip"
	}
	inv.decide(zerolog.InfoLevel, backend, decision, "").Str("reason", d.Reason).Msg("CHECK ok")
	return nil
}

func (r *run) cmdDel(args *cmdArgs) error {
	inv, closeLog, err := r.begin("DEL", args)
	defer closeLog()
	if err != nil {
		return err
	}
	if args.Netns == "" {
		inv.decided("skip", "no netns")
		return nil
	}
	ns, err := r.pipeline().Open(args.Netns)
	if inv.declineHere(err) {
		return r.declineFor(err)
	}
	if gone(err) {
		inv.decided("skip", "netns already gone")
		return nil
	}
	if err != nil {
		return inv.fail(netnsError(args.Netns, err))
	}
	defer ns.Close()
	ctx, cancel := context.WithTimeout(r.ctx(), applyTimeout)
	defer cancel()
	// From every backend that holds ours, whatever the config names now:
	// rules an earlier backend setting left would make the next ADD in
	// this namespace refuse to add the new backend's beside them.
	opts := inv.captureOptions()
	opts.Backend = capture.Auto
	removal, err := r.pipeline().Remove(ctx, ns, opts)
	if inv.declineHere(err) {
		return r.declineFor(err)
	}
	if err != nil {
		// Our descriptor keeps the namespace alive, but its bind mount may
		// be undone while we work (the backends open the path again): then
		// our rules go with the namespace.
		again, oerr := r.pipeline().OpenForReading(args.Netns)
		if gone(oerr) {
			inv.decided("skip", "netns gone during removal")
			return nil
		}
		again.Close()
		return inv.fail(types.NewError(types.ErrIOFailure,
			fmt.Sprintf("nftmesh-cni: removing capture rules of pod %s from %s", inv.podRef(), args.Netns), err.Error()))
	}
	decision := "remove"
	if len(removal) == 0 {
		decision = "skip"
	}
	inv.decided(decision, removal.String())
	return nil
}

// gone reports whether opening a netns path failed because the namespace
// is gone: the path was deleted, or its bind mount was undone and left the
// empty regular file the runtime created as the mount point.
func gone(err error) bool {
	var ne *capture.NotNetnsError
	return errors.Is(err, fs.ErrNotExist) || (errors.As(err, &ne) && ne.Kind == "regular file")
}

// netnsError is the CNI error for a CNI_NETNS that cannot be used: not a
// network namespace, or the host's own.
func netnsError(path string, err error) *types.Error {
	msg := fmt.Sprintf("nftmesh-cni: CNI_NETNS %s is not a pod network namespace", path)
	if errors.Is(err, capture.ErrHostNetns) {
		msg = fmt.Sprintf("nftmesh-cni: CNI_NETNS %s is the host's network namespace: refusing to touch its rules", path)
	}
	return types.NewError(types.ErrInvalidEnvironmentVariables, msg, err.Error())
}

// openNetns opens and checks CNI_NETNS before anything else reads or
// writes: a FIFO there is refused without blocking on it, and so is the
// host's namespace, by identity. With missingOK, a missing path gives (nil,
// nil): it can neither block nor be the host's, and the pod lookup that
// follows has the more useful error; the caller opens it again later.
func (inv *invocation) openNetns(missingOK bool) (*capture.Netns, error) {
	ns, err := inv.r.pipeline().Open(inv.args.Netns)
	if inv.declineHere(err) {
		return nil, inv.r.declineFor(err)
	}
	if missingOK && errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, inv.fail(netnsError(inv.args.Netns, err))
	}
	return ns, nil
}

// netnsAndPlan is the start of CHECK (ADD's is capture.Add): CNI_NETNS
// checked (openNetns), the pod looked up and decided, then the namespace
// opened if it was missing before.
func (inv *invocation) netnsAndPlan(ctx context.Context) (*capture.Netns, capture.Decision, error) {
	ns, err := inv.openNetns(true)
	if err != nil {
		return nil, capture.Decision{}, err
	}
	d, err := inv.lookup(ctx)
	if err != nil {
		ns.Close()
		return nil, d, err
	}
	if ns == nil {
		if ns, err = inv.openNetns(false); err != nil {
			return nil, d, err
		}
	}
	return ns, d, nil
}

func (inv *invocation) captureOptions() capture.Options {
	return capture.Options{Backend: inv.conf.Backend, RunDir: inv.conf.AgentRunDir}
}

func (r *run) cmdStatus(args *cmdArgs) error {
	inv, closeLog, err := r.begin("STATUS", args)
	defer closeLog()
	if err != nil {
		return err
	}
	if _, err := podget.LoadKubeconfig(inv.conf.Kubeconfig); err != nil {
		if inv.declineHere(err) {
			return r.declineFor(err)
		}
		return inv.fail(types.NewError(types.ErrPluginNotAvailable,
			fmt.Sprintf("nftmesh-cni: not ready: kubeconfig %s is missing or invalid (the nftmesh agent writes it)", inv.conf.Kubeconfig), err.Error()))
	}
	inv.log.Debug().Msg("STATUS ready")
	return nil
}

// cmdGC has nothing to collect: nftmesh keeps no state outside pod network
// namespaces, and those are deleted with their pods.
func (r *run) cmdGC(args *cmdArgs) error {
	inv, closeLog, err := r.begin("GC", args)
	defer closeLog()
	if err != nil {
		return err
	}
	inv.log.Debug().Int("valid_attachments", len(inv.conf.ValidAttachments)).Msg("GC: no host-side state")
	return nil
}
