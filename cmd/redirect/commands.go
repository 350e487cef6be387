package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/nftmesh/nftmesh/capture"
	"github.com/nftmesh/nftmesh/internal/phase"
	"github.com/nftmesh/nftmesh/podinfo/meshpod"
	"github.com/nftmesh/nftmesh/redirect"
	"github.com/nftmesh/nftmesh/redirect/quote"
)

func newRenderCmd() *cobra.Command {
	var sf specFlags
	var output string
	cmd := &cobra.Command{
		Use:   "render (-f FILE | --annotation k=v ... | --defaults) [-o nft|iptables|json|plan] [--ipv6]",
		Short: "Print the rules a pod would get (no root needed)",
		Long: `Output formats (-o):
  nft       the nftables ruleset nftmesh installs (nft -f syntax), plus routes as comments
  iptables  the same plan in iptables-save syntax (what the iptables-legacy backend installs);
            with --ipv6 the ip6tables-save part follows
  json      the backend-neutral plan as JSON
  plan      the backend-neutral plan, one line per set, chain and rule

Chains are named as nft list ruleset shows them (nat-istio-output), here as in
trace and inspect; iptables-save syntax keeps Istio's names (ISTIO_OUTPUT in
table nat), which are the chains' names there.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			p, r, err := sf.planIn(cmd.Flags(), "")
			if r.mesh == meshpod.MeshLinkerd {
				// The rules are the same for every output format; where
				// they come from is said beside them, not in them.
				fmt.Fprintf(cmd.ErrOrStderr(), "redirect: %s\n", r.subject)
			}
			if err != nil {
				return err
			}
			out, err := render(p, output)
			if err != nil {
				return err
			}
			_, err = fmt.Fprint(cmd.OutOrStdout(), out)
			return err
		},
	}
	sf.register(cmd.Flags(), false)
	sf.requireInput(cmd.Flags())
	outputFlag(cmd, &output, "nft", "output `FORMAT`: nft, iptables, json or plan", "nft", "iptables", "json", "plan")
	return cmd
}

func newValidateCmd() *cobra.Command {
	var sf specFlags
	var output string
	cmd := &cobra.Command{
		Use:   "validate (-f FILE | --annotation k=v ... | --defaults) [-o text|json]",
		Short: "Check a pod's capture settings and report every problem at once",
		Long: `Prints "ok" and the resolved settings, or every bad annotation with its value.
Warns (stderr) about a manifest's *.istio.io annotations that look like capture
settings but are not read, e.g. a misspelling, with the key it probably meant.
With -o json, prints one JSON document on stdout in every case that reaches the
settings (valid, invalid, not in the mesh), with the same exit codes.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if output != "text" && output != "json" {
				return usageErr("--output %s: want text or json", quote.Value(output))
			}
			p, r, err := sf.planIn(cmd.Flags(), "")
			if output == "json" {
				if doc, ok := validateJSON(p, r, err); ok {
					if werr := writeJSON(cmd.OutOrStdout(), doc); werr != nil {
						return failure(werr)
					}
				}
				return err
			}
			for _, w := range r.warnings {
				fmt.Fprintf(cmd.ErrOrStderr(), "redirect: warning: %s: %s\n", r.subject, w)
			}
			if err != nil {
				return err
			}
			writeSettings(cmd.OutOrStdout(), r, p)
			return nil
		},
	}
	sf.register(cmd.Flags(), false)
	sf.requireInput(cmd.Flags())
	outputFlag(cmd, &output, "text", "output `FORMAT`: text or json", "text", "json")
	return cmd
}

func newApplyCmd() *cobra.Command {
	var sf specFlags
	var netns, backend, runDir string
	var allowOwn, force bool
	cmd := &cobra.Command{
		Use:   "apply --netns PATH (-f FILE | --annotation k=v ... | --defaults) [--backend auto|nftables|iptables-legacy]",
		Short: "Install the capture rules into a network namespace (root)",
		Long: `Installs the rules in one atomic step, replacing what nftmesh installed there
before. On failure nothing is left behind. PATH is a netns file such as
/run/netns/NAME or /proc/PID/ns/net, or the NAME alone (ip netns).`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			phase.Mark("parsed")
			if err := checkTarget(&netns, backend); err != nil {
				return err
			}
			p, r, err := sf.planIn(cmd.Flags(), netns)
			if err != nil {
				return err
			}
			phase.Mark("planned")
			pipeline = pipeline.AllowingOwnNetns(allowOwn)
			ns, ctx, done, err := openVerb(cmd, netns, true)
			if err != nil {
				return err
			}
			defer done()
			phase.Mark("opened")
			start := time.Now()
			// Istio's own capture is looked for by Apply, under the
			// namespace's lock and in the visit that writes ours.
			res, err := pipeline.Apply(ctx, ns, p, capture.Options{Backend: backend, RunDir: runDir, Locked: holdInterrupt, RefuseForeign: !force})
			phase.Mark("applied")
			if fe := (*capture.ForeignError)(nil); errors.As(err, &fe) {
				return failure(fmt.Errorf("not applying capture rules for %s in %s: istio-cni capture present (%s), and a second capture would act on the same traffic; remove Istio's rules first (uninstall istio-cni, restart the pod), or pass --force to stack ours on them",
					r.subject, netns, strings.Join(fe.Found, ", ")))
			}
			if err != nil {
				return failure(fmt.Errorf("applying capture rules for %s in %s: %w", r.subject, netns, err))
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "applied capture rules for %s in %s with %s (%s) in %s\n",
				r.subject, netns, res.Backend, res.Why, time.Since(start).Round(10*time.Microsecond))
			return nil
		},
	}
	sf.register(cmd.Flags(), true)
	sf.requireInput(cmd.Flags())
	netnsFlag(cmd, &netns)
	cmd.Flags().StringVar(&backend, "backend", capture.Auto, "rule `BACKEND`: auto, nftables or iptables-legacy")
	runDirFlag(cmd, &runDir)
	cmd.Flags().BoolVar(&allowOwn, "allow-own-netns", false, "allow PATH to be the namespace redirect itself runs in (refused by default: that is usually the host's)")
	cmd.Flags().BoolVar(&force, "force", false, "apply even where Istio's own capture (istio-init or istio-cni rules) is present")
	return cmd
}

func newInspectCmd() *cobra.Command {
	var sf specFlags
	var netns, backend, output, runDir string
	cmd := &cobra.Command{
		Use:   "inspect (NAMESPACE/NAME | --netns PATH [-f FILE | --annotation k=v ...])",
		Short: "Show the capture rules live in a pod's network namespace, or their drift from its plan (root)",
		Long: `With NAMESPACE/NAME, asks the nftmesh agent on this node for that pod and its
network namespace (on the node as root, or in the agent's container through
kubectl exec; any repair mode) and compares the live rules with what the pod
should have. With --netns and no spec, prints what nftmesh installed there;
with --pod or --annotation, compares the live rules with what that pod should
have. Differences are printed ("-" expected but missing, "+" present but
unexpected), with the packets they treat otherwise than planned, and exit 3;
with -o json as {"schemaVersion", "netns", "subject", "backend", "inSync",
"drift", "foreign", "effects"}. Chains are named as render and nft list
ruleset name them.`,
		Args: podRefArg,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 1 {
				if netns != "" || sf.pod != "" || len(sf.annotations) > 0 {
					return usageErr("inspect %s asks the agent for the pod: --netns, --pod and --annotation do not go with it", quote.Value(args[0]))
				}
				path, done, err := askAgent(cmd, args[0], runDir, &sf)
				if err != nil {
					return err
				}
				defer done()
				netns = path
			}
			if err := checkTarget(&netns, backend); err != nil {
				return err
			}
			if !outputFormats[output] {
				return badOutput(output)
			}
			ns, ctx, done, err := openVerb(cmd, netns, false)
			if err != nil {
				return err
			}
			defer done()
			in := inspection{ctx: ctx, ns: ns, netns: netns, opts: capture.Options{Backend: backend, RunDir: runDir}, output: output, w: cmd.OutOrStdout()}
			if !sf.hasPod() && len(sf.annotations) == 0 {
				return in.live()
			}
			want, r, err := sf.planIn(cmd.Flags(), netns)
			if err != nil {
				return err
			}
			c, err := in.check(want)
			if err != nil {
				return err
			}
			if output == "json" && (c.err == nil || c.drift != nil) {
				return in.writeDoc(c, r.subject)
			}
			return in.report(c, r.subject)
		},
	}
	sf.register(cmd.Flags(), true)
	netnsFlag(cmd, &netns)
	cmd.Flags().StringVar(&backend, "backend", capture.Auto, "rule `BACKEND`: auto, nftables or iptables-legacy")
	outputFlag(cmd, &output, "nft", "output `FORMAT` of the live rules: nft, iptables, json or plan", "nft", "iptables", "json", "plan")
	runDirFlag(cmd, &runDir)
	return cmd
}

// inspection is one `redirect inspect` of an open network namespace.
type inspection struct {
	ctx    context.Context
	ns     *capture.Netns
	netns  string
	opts   capture.Options
	output string
	w      io.Writer
}

// live prints what nftmesh installed in the namespace.
func (in inspection) live() error {
	live, name, err := pipeline.List(in.ctx, in.ns, in.opts)
	if err != nil {
		return failure(fmt.Errorf("reading capture rules in %s: %w", in.netns, err))
	}
	foreign, err := pipeline.Foreign(in.ctx, in.ns)
	if err != nil {
		return failure(err)
	}
	if len(foreign) > 0 && in.output != "json" {
		fmt.Fprintf(in.w, "# %s\n", foreignLine(in.netns, foreign))
	}
	if live.Empty() && in.output != "json" {
		fmt.Fprintf(in.w, "# no nftmesh capture rules in %s (%s)\n", in.netns, name)
		if len(foreign) > 0 {
			return &exitError{exitDrift, nil}
		}
		return nil
	}
	out, err := render(live, in.output)
	if err != nil {
		return failure(err)
	}
	fmt.Fprint(in.w, out)
	return nil
}

// checked is the namespace's live rules compared with a plan.
type checked struct {
	backend string
	err     error // from the check; a *redirect.DriftError is drift
	drift   *redirect.DriftError
	foreign []string
	effects []redirect.DriftEffect
}

// check compares the live rules with want; the error is one of reading
// the foreign capture.
func (in inspection) check(want redirect.Plan) (checked, error) {
	var c checked
	c.backend, c.err = pipeline.Check(in.ctx, in.ns, want, in.opts)
	// Our rules matching the plan is not "in sync" while another
	// installer's capture acts on the same traffic.
	if c.err == nil || errors.As(c.err, &c.drift) {
		var ferr error
		if c.foreign, ferr = pipeline.Foreign(in.ctx, in.ns); ferr != nil {
			return c, failure(ferr)
		}
	}
	// The traces of representative packets through the planned and the
	// live rules go through nftmesh's rules only: with Istio's rules acting
	// too, "live accept" would be wrong. Best effort: if the live rules or
	// the addresses cannot be read, the drift lines stand alone.
	if c.drift != nil && len(c.foreign) == 0 {
		if live, _, err := pipeline.List(in.ctx, in.ns, in.opts); err == nil {
			addrs, _ := pipeline.Addrs(in.netns)
			c.effects = redirect.ExplainDrift(&want, &live, addrs)
		}
	}
	return c, nil
}

func (in inspection) writeDoc(c checked, subject string) error {
	doc := inspectDoc{SchemaVersion: schemaVersion, Netns: in.netns, Subject: subject, Backend: c.backend, InSync: c.err == nil && len(c.foreign) == 0, Drift: []string{}, Foreign: c.foreign}
	if c.drift != nil {
		doc.Drift = c.drift.Lines
	}
	for _, e := range c.effects {
		doc.Effects = append(doc.Effects, effectDoc{Packet: e.Packet.String(), Planned: e.Planned.String(), Live: e.Live.String(), Why: e.Why})
	}
	if werr := writeJSON(in.w, doc); werr != nil {
		return failure(werr)
	}
	if doc.InSync {
		return nil
	}
	return &exitError{exitDrift, nil}
}

func (in inspection) report(c checked, subject string) error {
	w, netns, name := in.w, in.netns, c.backend
	if len(c.foreign) > 0 {
		fmt.Fprintf(w, "%s\n", foreignLine(netns, c.foreign))
	}
	switch {
	case c.err == nil && len(c.foreign) > 0:
		fmt.Fprintf(w, "nftmesh's own rules match the plan of %s (%s)\n", subject, name)
		return &exitError{exitDrift, nil}
	case c.err == nil:
		fmt.Fprintf(w, "in sync: %s has exactly the capture rules of %s (%s)\n", netns, subject, name)
		return nil
	case c.drift != nil:
		fmt.Fprintf(w, "drift: %s differs from the plan of %s (%s):\n%s\n", netns, subject, name, strings.Join(c.drift.Lines, "\n"))
		if len(c.effects) > 0 {
			fmt.Fprintf(w, "effect (traced through the planned and the live rules):\n")
			for i, e := range c.effects {
				if i == maxEffectsShown {
					fmt.Fprintf(w, "  ... and %d more (-o json lists all)\n", len(c.effects)-i)
					break
				}
				fmt.Fprintf(w, "  %s\n", e)
			}
		}
		return &exitError{exitDrift, nil}
	default:
		return failure(fmt.Errorf("checking %s against %s: %w", netns, subject, c.err))
	}
}

func newCleanCmd() *cobra.Command {
	var netns, backend, runDir string
	cmd := &cobra.Command{
		Use:   "clean --netns PATH [--backend auto|nftables|iptables-legacy]",
		Short: "Remove nftmesh's capture rules from a network namespace (root)",
		Long: `Removes what nftmesh installed: with auto (the default) from every backend that
holds it, else from the named one; our nftables table, our iptables-legacy chains
and tagged rules, the TPROXY policy routes and the ::6 address. Other rules stay,
including another installer's ISTIO_* chains. Prints what it removed from which
backend; nothing installed is success ("nothing to remove"). The CNI plugin's DEL
does exactly the same.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkTarget(&netns, backend); err != nil {
				return err
			}
			ns, ctx, done, err := openVerb(cmd, netns, true)
			if err != nil {
				return err
			}
			defer done()
			removal, err := pipeline.Remove(ctx, ns, capture.Options{Backend: backend, RunDir: runDir, Locked: holdInterrupt})
			if err != nil {
				if len(removal) > 0 {
					err = fmt.Errorf("%w (before the failure: %s)", err, removal)
				}
				return failure(fmt.Errorf("removing capture rules from %s: %w", netns, err))
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "%s: %s\n", netns, removal)
			return nil
		},
	}
	netnsFlag(cmd, &netns)
	cmd.Flags().StringVar(&backend, "backend", capture.Auto, "rule `BACKEND`: auto (every backend holding nftmesh rules), nftables or iptables-legacy")
	runDirFlag(cmd, &runDir)
	return cmd
}

// verbTimeout bounds one kernel verb of the CLI, waiting for the
// namespace's lock included (the plugin or the agent may hold it).
const verbTimeout = 30 * time.Second

// holdInterrupt ignores SIGINT for the rest of the run once the verb holds
// the namespace's lock: an interrupt before that ends the process with
// nothing written, one after it lets the verb finish, so a Ctrl-C never
// leaves a table without its routes or half a removal. Not signal.Notify
// (nor signal.Reset afterwards): its goroutine and threads measured a third
// of an apply's wall time on a loaded machine.
func holdInterrupt() { signal.Ignore(os.Interrupt) }

// runDirFlag registers --run-dir: where the per-namespace lock files are,
// shared with the plugin and the agent on a node.
func runDirFlag(cmd *cobra.Command, dir *string) {
	cmd.Flags().StringVar(dir, "run-dir", "", "the per-netns lock files' `DIR`, shared with the plugin and agent (default "+capture.DefaultRunDir+", or a temp dir if that cannot be created)")
}

// portList lists ports as an interval set holds them: each once, sorted,
// merged into ranges ("8080,15020-15021,15090"); "" for none.
func portList(ps []uint16) string {
	rs := redirect.MergePorts(ps)
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = r.String()
	}
	return strings.Join(out, ",")
}

// writeSettings prints validate's report of valid settings.
func writeSettings(w io.Writer, r resolved, p redirect.Plan) {
	s := r.spec
	fmt.Fprintf(w, "ok: %s\n", r.subject)
	fmt.Fprintf(w, "  interception mode:   %s\n", s.InterceptionMode)
	fmt.Fprintf(w, "  inbound ports:       %s\n", inboundPorts(s, p))
	fmt.Fprintf(w, "  outbound ranges:     %s (excluded: %s)\n", cmp.Or(s.OutboundIPRanges.String(), "none"), cmp.Or(redirect.CIDRSelector{Prefixes: s.OutboundIPRangesExclude}.String(), "none"))
	fmt.Fprintf(w, "  outbound ports:      included %s, excluded %s\n", cmp.Or(portList(s.OutboundPorts), "none"), cmp.Or(portList(s.OutboundPortsExclude), "none"))
	fmt.Fprintf(w, "  proxy uid/gid:       %s / %s\n", joinIDs(s.ProxyUIDs), joinIDs(s.ProxyGIDs))
	fmt.Fprintf(w, "  dns capture, ipv6:   %t, %t (dual-stack sidecar: %t)\n", s.CaptureDNS, s.IPv6, s.DualStack)
	// Counted as clean counts what it removes: the chains' netfilter
	// tables named (nftables holds them all in one table, inet nftmesh).
	tables := make([]string, len(p.Tables))
	chains := 0
	for i, t := range p.Tables {
		tables[i], chains = string(t.Name), chains+len(t.Chains)
	}
	fmt.Fprintf(w, "  plan:                %s in %s (%s), %s\n", plural(capture.RuleCount(p), "rule", "rules"),
		plural(chains, "chain", "chains"), strings.Join(tables, ", "), plural(len(p.Sets), "set", "sets"))
}

// inboundPortsExcluded is the plan's set of the inbound ports not captured:
// the annotation's and the ones Istio always excludes (15020, 15021, 15090).
const inboundPortsExcluded = "inbound-exclude-ports"

// inboundPorts says which inbound ports are captured: all but the excluded
// ones (as the plan's set holds them: each once, merged), a list of ports,
// or none.
func inboundPorts(s redirect.Spec, p redirect.Plan) string {
	switch {
	case s.InboundPorts.All:
		var excl []uint16
		if set := p.Set(inboundPortsExcluded); set != nil {
			excl = set.Ports
		}
		return "* (excluded: " + cmp.Or(portList(excl), "none") + ")"
	case len(s.InboundPorts.Ports) == 0:
		return "none"
	case len(s.InboundPortsExclude) > 0:
		return portList(s.InboundPorts.Ports) + " (excludeInboundPorts does not apply to a port list, as in Istio)"
	}
	return portList(s.InboundPorts.Ports)
}

func joinIDs(ids []uint32) string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = strconv.FormatUint(uint64(id), 10)
	}
	return strings.Join(out, ",")
}

// plural is "1 table", "0 tables", "2 tables".
func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return strconv.Itoa(n) + " " + many
}

// checkTarget validates the --netns and --backend flags every kernel
// command takes, and turns an `ip netns` name in netns into its path.
func checkTarget(netns *string, backend string) error {
	if *netns == "" {
		return usageErr("--netns is required")
	}
	path, err := netnsPath(*netns, netnsDir)
	if err != nil {
		return err
	}
	*netns = path
	if err := capture.ValidateBackend(backend); err != nil {
		return usageErr("--%v", err)
	}
	return nil
}

// outputFlag registers -o/--output, and --format as its deprecated alias
// (from before kubectl's -o; -f is --pod, as kubectl's -f is a file).
func outputFlag(cmd *cobra.Command, output *string, def, usage string, values ...string) {
	cmd.Flags().StringVarP(output, "output", "o", def, usage)
	_ = cmd.RegisterFlagCompletionFunc("output", cobra.FixedCompletions(values, cobra.ShellCompDirectiveNoFileComp))
	cmd.Flags().StringVar(output, "format", def, usage)
	// Hidden, not MarkDeprecated: pflag prints that notice on stdout, into
	// the rules or JSON; warnDeprecated writes it to stderr.
	_ = cmd.Flags().MarkHidden("format")
}

// warnDeprecated tells on stderr that a deprecated flag was used.
func warnDeprecated(cmd *cobra.Command, _ []string) {
	if f := cmd.Flags().Lookup("format"); f != nil && f.Changed {
		fmt.Fprintln(cmd.ErrOrStderr(), "redirect: --format is deprecated, use -o/--output")
	}
}

// maxEffectsShown bounds the drift effects inspect prints as text.
const maxEffectsShown = 10

// pipeline does the kernel work of every command: the running kernel, or
// in the root-free tests an in-memory one.
var pipeline = capture.Linux()

// netnsDir is where `ip netns add NAME` mounts its namespaces.
var netnsDir = "/run/netns"

func netnsFlag(cmd *cobra.Command, netns *string) {
	cmd.Flags().StringVar(netns, "netns", "", "network namespace: a `PATH` (/proc/PID/ns/net, /run/netns/NAME) or a NAME from ip netns")
}

// netnsPath is the namespace file --netns names: a value with a "/" is a
// path, as given; a bare NAME is `ip netns`'s, dir/NAME, which must exist
// (a relative path to a file here is ./NAME).
func netnsPath(v, dir string) (string, error) {
	if strings.Contains(v, "/") {
		return v, nil
	}
	if v == "" || v == "." || v == ".." || strings.ContainsRune(v, 0) || len(v) > 255 {
		// 255: NAME_MAX, the longest file name, so the longest ip netns name.
		return "", usageErr("--netns %s: not a namespace name or path", quote.Value(v))
	}
	p := filepath.Join(dir, v)
	if _, err := os.Stat(p); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return "", usageErr("--netns %s: no namespace of that name in %s (see ip netns list); a file here is ./%s", quote.Value(v), dir, v)
		}
		return "", failure(fmt.Errorf("looking up namespace %s: %w", quote.Value(v), err))
	}
	return p, nil
}

// foreignLine reports Istio's own capture found in a namespace.
func foreignLine(netns string, foreign []string) string {
	return fmt.Sprintf("istio-cni capture present: %s holds the traffic capture of Istio's istio-cni or istio-init (foreign capture), which acts on the pod's traffic beside or instead of nftmesh's:\n  %s",
		netns, strings.Join(foreign, "\n  "))
}

// openVerb opens the network namespace at path for a verb, for writing
// (apply, clean: guarded against the host's own namespace) or reading, and
// the verb's context, bounded by verbTimeout; done closes both.
func openVerb(cmd *cobra.Command, path string, write bool) (*capture.Netns, context.Context, func(), error) {
	open := pipeline.OpenForReading
	if write {
		open = pipeline.Open
	}
	ns, err := open(path)
	if err != nil {
		return nil, nil, nil, failure(err)
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), verbTimeout)
	return ns, ctx, func() { cancel(); ns.Close() }, nil
}
