package main

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/nftmesh/nftmesh/redirect"
	"github.com/nftmesh/nftmesh/redirect/quote"
)

// Defaults of redirect trace for what the command line does not say.
const (
	defaultTraceID    = "1000" // an app's UID/GID: not the proxy's 1337
	defaultTraceIface = "eth0"
)

// Remote sources assumed for an arriving packet without --src
// (documentation ranges: no plan matches them unless told to).
var (
	defaultInSrcV4 = netip.MustParseAddr("192.0.2.1")
	defaultInSrcV6 = netip.MustParseAddr("2001:db8::1")
)

// traceInput is the command line of redirect trace, as given.
type traceInput struct {
	dir, dst       string
	uid, gid       string
	src, iface     string
	proto          string
	uidSet, gidSet bool
}

// parseTrace checks the trace arguments strictly and returns the packet;
// Src and Iface stay empty when not given (fillTraceDefaults decides them
// from the pod). Errors name the flag or argument and its value.
func parseTrace(in traceInput) (redirect.Packet, error) {
	var pkt redirect.Packet
	switch in.dir {
	case "out":
		pkt.Dir = redirect.DirOut
	case "in":
		pkt.Dir = redirect.DirIn
	default:
		return pkt, usageErr("direction %s: want out or in", quote.Value(in.dir))
	}
	dst, err := netip.ParseAddrPort(in.dst)
	switch {
	case err != nil:
		return pkt, usageErr("destination %s: want IP:PORT (an IPv6 address in brackets, e.g. [2001:db8::1]:443)", quote.Value(in.dst))
	case dst.Addr().Zone() != "":
		return pkt, usageErr("destination %s: an address with a zone is not a pod destination", quote.Value(in.dst))
	case dst.Addr().Is4In6():
		return pkt, usageErr("destination %s: an IPv4-mapped address; give the IPv4 form", quote.Value(in.dst))
	case dst.Port() == 0:
		return pkt, usageErr("destination %s: port 0 is not a destination port", quote.Value(in.dst))
	}
	pkt.Dst = dst
	switch in.proto {
	case "tcp":
		pkt.Proto = redirect.ProtoTCP
	case "udp":
		pkt.Proto = redirect.ProtoUDP
	default:
		return pkt, usageErr("--proto %s: want tcp or udp", quote.Value(in.proto))
	}
	if pkt.Dir == redirect.DirIn && (in.uidSet || in.gidSet) {
		flag := "--gid"
		if in.uidSet {
			flag = "--uid"
		}
		return pkt, usageErr("%s applies to out only: an arriving packet has no local sender", flag)
	}
	if pkt.Dir == redirect.DirOut {
		if pkt.UID, err = parseTraceID("--uid", in.uid); err != nil {
			return pkt, err
		}
		if pkt.GID, err = parseTraceID("--gid", in.gid); err != nil {
			return pkt, err
		}
	}
	if in.src != "" {
		a, err := netip.ParseAddr(in.src)
		switch {
		case err != nil:
			return pkt, usageErr("--src %s: not an IP address", quote.Value(in.src))
		case a.Zone() != "":
			return pkt, usageErr("--src %s: an address with a zone is not supported", quote.Value(in.src))
		case a.Is4In6():
			return pkt, usageErr("--src %s: an IPv4-mapped address; give the IPv4 form", quote.Value(in.src))
		case a.Is4() != dst.Addr().Is4():
			return pkt, usageErr("--src %s: not of the family of the destination %s", quote.Value(in.src), dst)
		}
		pkt.Src = a
	}
	if in.iface != "" {
		if why := badIfaceName(in.iface); why != "" {
			return pkt, usageErr("--iface %s: %s", quote.Value(in.iface), why)
		}
		pkt.Iface = in.iface
	}
	return pkt, nil
}

func parseTraceID(flag, v string) (uint32, error) {
	n, err := strconv.ParseUint(v, 10, 32)
	if err != nil {
		return 0, usageErr("%s %s: not a numeric ID (0-4294967295)", flag, quote.Value(v))
	}
	return uint32(n), nil
}

// badIfaceName says why name cannot be a Linux interface name, or "".
func badIfaceName(name string) string {
	switch {
	case len(name) > 15:
		return "longer than 15 bytes, the kernel's limit"
	case name == "." || name == "..":
		return "not an interface name"
	case strings.ContainsAny(name, "/:") || strings.IndexFunc(name, func(r rune) bool { return r <= ' ' || r == 0x7f }) >= 0:
		return "has '/', ':', a space or a control character"
	}
	return ""
}

// fillTraceDefaults decides what the command line left out as the kernel
// would: a connection to loopback, ::6 or a pod IP leaves on lo from the
// destination (127.0.0.1 for 127/8), others on eth0 from the pod IP of that
// family if known; an arriving one comes in on eth0 from a remote address.
func fillTraceDefaults(pkt *redirect.Packet, podIPs []netip.Addr) {
	dst := pkt.Dst.Addr()
	if pkt.Dir == redirect.DirIn {
		if pkt.Iface == "" {
			pkt.Iface = defaultTraceIface
		}
		if !pkt.Src.IsValid() {
			pkt.Src = defaultInSrcV4
			if dst.Is6() {
				pkt.Src = defaultInSrcV6
			}
		}
		return
	}
	local := dst.IsLoopback() || dst == redirect.InboundPassthroughV6.Addr() || slices.Contains(podIPs, dst)
	if pkt.Iface == "" {
		pkt.Iface = defaultTraceIface
		if local {
			pkt.Iface = "lo"
		}
	}
	if pkt.Src.IsValid() {
		return
	}
	switch {
	case dst.Is4() && dst.IsLoopback():
		pkt.Src = netip.AddrFrom4([4]byte{127, 0, 0, 1})
	case local:
		pkt.Src = dst
	default:
		for _, a := range podIPs {
			if a.Is4() == dst.Is4() {
				pkt.Src = a
				break
			}
		}
	}
}

func newTraceCmd() *cobra.Command {
	var sf specFlags
	var in traceInput
	var output string
	cmd := &cobra.Command{
		Use:   "trace (-f FILE | --annotation k=v ... | --defaults) [--uid N] [--gid N] [--src IP] [--iface NAME] [--proto tcp|udp] [-o text|json] (out|in) DST_IP:PORT",
		Short: "Show where a connection would go through a pod's capture rules, and why (no root needed)",
		Long: `Follows the first packet of a connection through the rules the pod would get, as
the kernel would: "out" is a connection a process in the pod opens (nat, mangle and
raw OUTPUT, then, when it stays in the pod, its way back in through lo), "in" one
arriving at the pod (PREROUTING). It prints every chain entered and rule met, marks
the rule that decided, and ends with one line "verdict: ..." naming the outcome:
redirect :15001 (outbound proxy), redirect :15006 (inbound proxy),
tproxy :15006 mark 1337, redirect :15053 (DNS proxy), accept (left alone) or drop.

Defaults: --uid/--gid 1000 (an app, not the proxy); "out" to loopback, ::6 or one
of the manifest's pod IPs leaves on lo, anything else on eth0; the source is what
the kernel would pick (the manifest's pod IP for other destinations); "in" arrives
on eth0 from 192.0.2.1 or 2001:db8::1. The trace assumes the proxy is listening.

Chains are named as render and nft list ruleset name them (nat-istio-output).`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) != 2 {
				got := "none"
				if len(args) > 0 {
					got = plural(len(args), "argument", "arguments")
				}
				return usageErr("trace needs two arguments, a direction (out or in) and DST_IP:PORT; got %s", got)
			}
			if output != "text" && output != "json" {
				return usageErr("--output %s: want text or json", quote.Value(output))
			}
			in.dir, in.dst = args[0], args[1]
			in.uidSet, in.gidSet = cmd.Flags().Changed("uid"), cmd.Flags().Changed("gid")
			pkt, err := parseTrace(in)
			if err != nil {
				return err
			}
			plan, r, err := sf.planIn(cmd.Flags(), "")
			if err != nil {
				return err
			}
			fillTraceDefaults(&pkt, r.podIPs)
			tr, err := redirect.TracePacket(&plan, pkt)
			if errors.Is(err, redirect.ErrUnknownSource) {
				return usageErr("%v: give the source with --src", err)
			}
			if err != nil {
				return failure(err)
			}
			return writeTrace(cmd, tr, r, output)
		},
	}
	fs := cmd.Flags()
	sf.register(fs, false)
	sf.requireInput(fs)
	fs.StringVar(&in.uid, "uid", defaultTraceID, "out: `UID` of the sending socket")
	fs.StringVar(&in.gid, "gid", defaultTraceID, "out: `GID` of the sending socket")
	fs.StringVar(&in.src, "src", "", "source `IP` address (default: what the kernel would pick, see above)")
	fs.StringVar(&in.iface, "iface", "", "interface `NAME`: for out the output interface, for in the input one (default: see above)")
	fs.StringVar(&in.proto, "proto", "tcp", "connection `PROTOCOL`: tcp or udp")
	outputFlag(cmd, &output, "text", "output `FORMAT`: text or json", "text", "json")
	return cmd
}

func writeTrace(cmd *cobra.Command, tr redirect.Trace, r resolved, output string) error {
	w := cmd.OutOrStdout()
	note := ""
	if tr.Packet.Family() == redirect.FamilyIPv6 && !r.spec.IPv6 {
		note = "the pod's rules do not capture IPv6 (its first address is IPv4 and its sidecar is not dual-stack, or --ipv6 was not given)"
	}
	if output == "json" {
		pkt := tr.Packet
		doc := map[string]any{
			"subject": r.subject,
			"packet": map[string]any{
				"direction": pkt.Dir.String(),
				"proto":     pkt.Proto.String(),
				"src":       addrOrEmpty(pkt.Src),
				"dst":       pkt.Dst.String(),
				"uid":       pkt.UID,
				"gid":       pkt.GID,
				"iface":     pkt.Iface,
			},
			"steps":         traceSteps(tr.Steps),
			"verdict":       tr.Verdict,
			"verdictText":   tr.Verdict.String(),
			"schemaVersion": schemaVersion,
		}
		if pkt.Dir == redirect.DirIn {
			delete(doc["packet"].(map[string]any), "uid")
			delete(doc["packet"].(map[string]any), "gid")
		}
		if note != "" {
			doc["note"] = note
		}
		return writeJSON(w, doc)
	}
	fmt.Fprintf(w, "rules of %s\n", r.subject)
	if note != "" {
		fmt.Fprintf(w, "note: %s\n", note)
	}
	_, err := fmt.Fprint(w, tr.Format())
	return err
}

// stepDoc is one redirect.TraceStep in trace -o json, its chain named as
// in the text (redirect.ChainName).
type stepDoc struct {
	Hook    redirect.Hook      `json:"hook"`
	Table   redirect.TableName `json:"table"`
	Chain   string             `json:"chain"`
	Rule    int                `json:"rule,omitempty"`
	Text    string             `json:"text"`
	Matched bool               `json:"matched,omitempty"`
	Decided bool               `json:"decided,omitempty"`
}

func traceSteps(steps []redirect.TraceStep) []stepDoc {
	out := make([]stepDoc, len(steps))
	for i, s := range steps {
		out[i] = stepDoc{Hook: s.Hook, Table: s.Table, Chain: redirect.ChainName(s.Table, s.Chain), Rule: s.Rule, Text: s.Text, Matched: s.Matched, Decided: s.Decided}
	}
	return out
}

func addrOrEmpty(a netip.Addr) string {
	if !a.IsValid() {
		return ""
	}
	return a.String()
}
