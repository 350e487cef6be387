package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/signal"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/nftmesh/nftmesh/capture"
	"github.com/nftmesh/nftmesh/netlab"
	"github.com/nftmesh/nftmesh/redirect"
)

func newDemoCmd() *cobra.Command {
	var keep bool
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Show capture at work: a throw-away pod netns, real connections, where each landed (root)",
		Long: `Builds a "pod" network namespace and a "peer" namespace joined by a veth pair,
applies the default sidecar capture (dual-stack, with 192.0.2.0/24 excluded as
a pod annotation would), starts tiny listeners for the proxy ports (15001,
15006, 15053) and an app (8080), then sends real connections as the app
(UID 1000), as the proxy (UID 1337), from 127.0.0.6, and in from the peer, and
prints where each one landed and the original destination the proxy would see.
Everything is removed afterwards, also on Ctrl-C. Touches nothing outside its
own namespaces.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if os.Geteuid() != 0 {
				return usageErr("demo needs root: it creates network namespaces (try: sudo redirect demo)")
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return runDemo(ctx, cmd.OutOrStdout(), keep)
		},
	}
	// No backquotes in a usage: pflag takes a `word` for the value's name.
	cmd.Flags().BoolVar(&keep, "keep", false, "keep the namespaces and their rules afterwards, to look at them with \"ip netns exec NAME nft list ruleset\" (remove them with \"ip netns del NAME\")")
	return cmd
}

type demoCase struct {
	what   string
	probe  netlab.Probe
	landed string
	orig   netip.AddrPort // expected original destination; zero: not checked
}

func runDemo(ctx context.Context, w io.Writer, keep bool) (err error) {
	topo, err := netlab.NewTopology(netlab.TopologyOptions{Prefix: "demo-"})
	if err != nil {
		return failure(fmt.Errorf("creating the demo namespaces: %w", err))
	}
	defer func() {
		if keep {
			fmt.Fprintf(w, "\nkept: ip netns exec %s nft list ruleset   (remove: ip netns del %s; ip netns del %s)\n", topo.PodNetns, topo.PodNetns, topo.PeerNetns)
			return
		}
		if cerr := topo.Close(); cerr != nil && err == nil {
			err = failure(fmt.Errorf("removing the demo namespaces: %w", cerr))
		} else if cerr == nil {
			fmt.Fprintf(w, "\nremoved namespaces %s and %s\n", topo.PodNetns, topo.PeerNetns)
		}
	}()
	ls, err := netlab.StartListeners(topo, netlab.ListenerOptions{})
	if err != nil {
		return failure(fmt.Errorf("starting the demo listeners: %w", err))
	}
	defer ls.Close()

	spec := redirect.DefaultSpec()
	spec.IPv6 = true
	spec.OutboundIPRangesExclude = []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}
	d, err := capture.PlanSpec(spec, nil)
	if err != nil {
		return failure(err)
	}
	ns, err := capture.Linux().Open(topo.PodNetnsPath())
	if err != nil {
		return failure(err)
	}
	defer ns.Close()
	opts := capture.Options{Backend: capture.NFTables}
	start := time.Now()
	res, err := capture.Linux().Apply(ctx, ns, d.Plan, opts)
	if err != nil {
		return failure(fmt.Errorf("applying the capture rules: %w", err))
	}
	took := time.Since(start)
	fmt.Fprintf(w, "pod netns %s (%s, %s) <-veth-> peer netns %s (external hosts %s, %s, %s)\n",
		topo.PodNetns, netlab.PodV4, netlab.PodV6, topo.PeerNetns, netlab.OtherV4Host, netlab.OtherV6Host, netlab.ExcludedV4Host)
	fmt.Fprintf(w, "applied the default sidecar capture (%s, %s, IPv4+IPv6, excludeOutboundIPRanges=192.0.2.0/24) with %s in %s, one netlink batch\n\n",
		plural(res.Rules, "rule", "rules"), plural(len(d.Plan.Sets), "set", "sets"), res.Backend, took.Round(10*time.Microsecond))

	cases := demoCases()
	failed, err := probeAll(ctx, w, topo, cases)
	if err != nil {
		return err
	}
	if !keep {
		if _, err := capture.Linux().Remove(ctx, ns, opts); err != nil {
			return failure(fmt.Errorf("removing the capture rules: %w", err))
		}
	}
	if failed > 0 {
		return failure(fmt.Errorf("%d of %d connections did not land where Istio's rules send them", failed, len(cases)))
	}
	fmt.Fprintf(w, "\nall %d connections landed where Istio's sidecar rules send them.\n", len(cases))
	return nil
}

// demoCases are the connections the demo makes and where Istio's rules
// send each.
func demoCases() []demoCase {
	app := func(dst netip.AddrPort) netlab.Probe {
		return netlab.Probe{From: netlab.FromApp, UID: netlab.AppUID, GID: netlab.AppGID, Proto: redirect.ProtoTCP, Dst: dst}
	}
	proxy := func(dst netip.AddrPort) netlab.Probe {
		return netlab.Probe{From: netlab.FromApp, UID: redirect.DefaultProxyID, GID: redirect.DefaultProxyID, Proto: redirect.ProtoTCP, Dst: dst}
	}
	ext4 := netip.AddrPortFrom(netlab.OtherV4Host, 80)
	ext6 := netip.AddrPortFrom(netlab.OtherV6Host, 443)
	excl := netip.AddrPortFrom(netlab.ExcludedV4Host, 80)
	pod8080 := netip.AddrPortFrom(netlab.PodV4, 8080)
	pod6 := netip.AddrPortFrom(netlab.PodV6, 8080)
	probe := netip.AddrPortFrom(redirect.InboundPassthroughV4.Addr(), redirect.ValidationProbePort)
	return []demoCase{
		{"app calls an external service", app(ext4), netlab.ListenerOutbound, ext4},
		{"app calls an external service (IPv6)", app(ext6), netlab.ListenerOutbound, ext6},
		{"app calls an excluded CIDR", app(excl), netlab.PeerListener(excl), netip.AddrPort{}},
		{"proxy (uid 1337) calls upstream", proxy(ext4), netlab.PeerListener(ext4), netip.AddrPort{}},
		{"client in the peer calls the pod", netlab.Probe{From: netlab.FromPeer, Proto: redirect.ProtoTCP, Dst: pod8080}, netlab.ListenerInbound, pod8080},
		{"client in the peer calls the pod (IPv6)", netlab.Probe{From: netlab.FromPeer, Proto: redirect.ProtoTCP, Dst: pod6}, netlab.ListenerInbound, pod6},
		{"proxy hands inbound to the app (127.0.0.6)", netlab.Probe{From: netlab.FromPassthrough, UID: redirect.DefaultProxyID, GID: redirect.DefaultProxyID, Proto: redirect.ProtoTCP, Dst: pod8080}, netlab.AppListener(8080), netip.AddrPort{}},
		{"app calls itself over the pod IP", app(pod8080), netlab.AppListener(8080), netip.AddrPort{}},
		{"istio-validation probe (uid 1337 -> 127.0.0.6:15002)", proxy(probe), netlab.ListenerInbound, probe},
	}
}

// probeAll makes each connection of cases in topo and prints a table of
// where it landed; failed counts those that landed elsewhere.
func probeAll(ctx context.Context, w io.Writer, topo *netlab.Topology, cases []demoCase) (failed int, err error) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CONNECTION\tFROM\tTO\tLANDED ON\tORIGINAL DST\tAS ISTIO")
	for _, c := range cases {
		if ctx.Err() != nil {
			return failed, errors.New("interrupted")
		}
		r := topo.Probe(c.probe)
		ok := r.Landed == c.landed && (!c.orig.IsValid() || r.OrigDst == c.orig)
		mark := "yes"
		if !ok {
			mark = "NO (want " + c.landed + ")"
			failed++
		}
		orig := "-"
		if r.OrigDst.IsValid() {
			orig = r.OrigDst.String()
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", c.what, fromLabel(c.probe), c.probe.Dst, r.Landed, orig, mark)
	}
	tw.Flush()
	return failed, nil
}

func fromLabel(p netlab.Probe) string {
	switch p.From {
	case netlab.FromPeer:
		return "peer"
	case netlab.FromPassthrough:
		return fmt.Sprintf("pod uid %d, src 127.0.0.6", p.UID)
	}
	return fmt.Sprintf("pod uid %d", p.UID)
}
