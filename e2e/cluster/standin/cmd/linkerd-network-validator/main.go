// Command linkerd-network-validator stands in for Linkerd's init container
// of the same name (its Rust source cannot be built here) in tests: it
// takes the flags Linkerd's injector writes (--connect-addr, --listen-addr,
// --timeout, --log-level, --log-format), serves a random token on the
// listen address (the proxy's outbound port), connects to the connect
// address and exits 0 only when that connection reads the token back,
// which only the pod's capture redirecting it can make happen; it exits 95
// otherwise (timeout and SIGTERM included), as Linkerd's does. Bad flags
// exit 2. Events go to stdout as package standin writes them.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"time"

	"github.com/nftmesh/nftmesh/e2e/cluster/standin"
	"github.com/nftmesh/nftmesh/redirect/quote"
)

const prog = "linkerd-network-validator"

func main() {
	v, err := parseFlags(os.Args[1:])
	if err != nil {
		standin.Fatal(prog, err)
	}
	log := standin.NewLog(os.Stdout, "validator", standin.PodName())
	ctx, stop := standin.SignalContext()
	defer stop()
	if err := v.Run(ctx, log); err != nil {
		if errors.Is(err, context.Canceled) {
			err = errors.New("stopped by a signal before validating")
		}
		fmt.Fprintf(os.Stderr, "%s: %v\n", prog, err)
		os.Exit(standin.ValidatorFailed)
	}
	fmt.Fprintf(os.Stderr, "%s: validated: a connection to %s reached %s\n", prog, v.Connect, v.Listen)
}

// parseFlags reads Linkerd's flags, with its defaults.
func parseFlags(args []string) (standin.Validator, error) {
	fs := flag.NewFlagSet(prog, flag.ContinueOnError)
	connect := fs.String("connect-addr", "192.0.2.2:1404", "address to connect to; only a redirect to --listen-addr answers there")
	listen := fs.String("listen-addr", "0.0.0.0:4140", "address to serve the token on (the proxy's outbound port)")
	timeout := fs.String("timeout", "10s", "give up after this long (ms, s, m, h, d)")
	_ = fs.String("log-level", "info", "accepted for Linkerd's injector; events are always written")
	format := fs.String("log-format", "plain", "plain or json; accepted for Linkerd's injector")
	if err := fs.Parse(args); err != nil {
		return standin.Validator{}, err
	}
	var v standin.Validator
	var err error
	if v.Connect, err = netip.ParseAddrPort(*connect); err != nil {
		return v, fmt.Errorf("--connect-addr %s is not an address:port", quote.ValueN(*connect, 60))
	}
	if v.Listen, err = netip.ParseAddrPort(*listen); err != nil {
		return v, fmt.Errorf("--listen-addr %s is not an address:port", quote.ValueN(*listen, 60))
	}
	if v.Timeout, err = standin.ParseValidatorTimeout(*timeout); err != nil {
		return v, err
	}
	if v.Timeout <= 0 {
		v.Timeout = time.Nanosecond // Linkerd's times out at once
	}
	if *format != "plain" && *format != "json" {
		return v, fmt.Errorf("--log-format %s is not plain or json", quote.ValueN(*format, 20))
	}
	return v, nil
}
