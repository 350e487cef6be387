// Package cniplugin is nftmesh's chained CNI plugin. After a primary plugin
// in a conflist, on ADD it looks the pod up (the node agent's cache, else
// the Kubernetes API), decides with podinfo whether the pod has an injected
// Istio sidecar, and if so installs the capture rules inside the pod's
// network namespace in one atomic batch. It prints the primary plugin's
// result unchanged.
//
// It fails closed: when the pod cannot be looked up within api_timeout, an
// annotation is invalid or the rules cannot be programmed, ADD returns a
// CNI error and leaves no rules behind, so a mesh pod never starts without
// its capture. Namespaces in exclude_namespaces and the agent's own pods
// are let through before any Kubernetes client exists.
//
// DEL removes our rules from every backend that holds them, and succeeds
// when the netns, the pod or the API is gone. CHECK compares the live rules
// with the pod's plan. STATUS reports the plugin unavailable until the
// agent has written the kubeconfig. GC has nothing to collect.
//
// Logs are JSON (zerolog) on stderr and, for a process of its own, in a
// size-capped file in agent_run_dir (inside the agent, in the agent's log),
// never on stdout, which carries the CNI result.
//
// The same code runs as a process of its own (nftmesh-cni-standalone,
// through Main) and inside the node agent, which runs a call the
// nftmesh-cni front handed it (through Run).
package cniplugin

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/debug"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	cniversion "github.com/containernetworking/cni/pkg/version"
	"github.com/rs/zerolog"

	"github.com/nftmesh/nftmesh/capture"
	"github.com/nftmesh/nftmesh/internal/phase"
	"github.com/nftmesh/nftmesh/internal/version"
	"github.com/nftmesh/nftmesh/podinfo/agentsock"
)

// supportedVersions are the CNI spec versions a conflist may use. A chained
// plugin needs prevResult, which exists from 0.3.x.
var supportedVersions = cniversion.PluginSupports("0.3.1", "0.4.0", "1.0.0", "1.1.0")

// Env is one CNI call as the plugin receives it: the runtime's CNI_*
// variables, the config on stdin, and where the result and logs go.
type Env struct {
	Getenv         func(string) string
	Stdin          io.Reader
	Stdout, Stderr io.Writer
	// Pipeline does the kernel work; nil is the running kernel's.
	Pipeline *capture.Pipeline
	// Ask, when set, answers the pod lookups the plugin would send to the
	// node agent's socket: the agent runs the call itself. A pod it does
	// not find declines the call (ErrDeclined).
	Ask func(agentsock.Request) (agentsock.Answer, error)
	// RunDir, when set, is the agent_run_dir the call must name; a config
	// that names another is declined.
	RunDir string
	// Phases writes where the process's time went into the decision line
	// at log level debug: only a process of its own has such marks.
	Phases bool
	// Context, when set, bounds the call: the agent cancels it when the
	// front hangs up.
	Context context.Context
	// Log and Decided are set for a call the agent runs (with Ask): its log
	// lines go to Log, the agent's own log, instead of the log file, and
	// its decision to Decided, the agent's counters and Events.
	Log     zerolog.LevelWriter
	Decided func(agentsock.Decision)
}

// ErrDeclined is Run's answer when the call must run elsewhere (the
// plugin's own process): the namespace is as the call found it, and what
// Run wrote to Stdout and Stderr is to be dropped. Run's error wraps it
// and, when an error made the call go elsewhere, that error too.
var ErrDeclined = errors.New("the call is not for this runner")

// Run runs one CNI call and returns its exit status: 0, or 1 with the CNI
// error printed on Stdout.
func Run(e Env) (int, error) {
	r := &run{env: e}
	err := dispatch(cniEnv{getenv: e.Getenv, stdin: e.Stdin, stdout: e.Stdout, stderr: e.Stderr}, r.funcs(), supportedVersions, about())
	if r.declined {
		if r.declinedFor != nil {
			return 1, fmt.Errorf("%w: %w", ErrDeclined, r.declinedFor)
		}
		return 1, ErrDeclined
	}
	if err != nil {
		// The CNI protocol: the error as JSON on stdout, exit status 1.
		if perr := printError(e.Stdout, err); perr != nil {
			fmt.Fprintln(e.Stderr, "nftmesh-cni: writing the error to stdout:", perr)
		}
		return 1, nil
	}
	return 0, nil
}

// printError writes err as the CNI library's Error.Print does.
func printError(w io.Writer, err *types.Error) error {
	data, merr := json.MarshalIndent(err, "", "    ")
	if merr != nil {
		return merr
	}
	_, werr := w.Write(data)
	return werr
}

// Main is the plugin as a process of its own: the call from the process's
// environment and stdio, then exit.
func Main() {
	phase.Mark("main")
	// A run lives for milliseconds and allocates a few MB: collecting
	// garbage only costs latency. The memory limit still bounds the heap.
	debug.SetGCPercent(-1)
	debug.SetMemoryLimit(128 << 20)
	// A runtime never passes arguments and always sets CNI_COMMAND, so
	// --version cannot be mistaken for a CNI call.
	if len(os.Args) == 2 && os.Args[1] == "--version" && os.Getenv("CNI_COMMAND") == "" {
		fmt.Println(version.Line("nftmesh-cni"))
		return
	}
	if err := skelMain(); err != nil {
		if perr := err.Print(); perr != nil {
			fmt.Fprintln(os.Stderr, "nftmesh-cni: writing the error to stdout:", perr)
		}
		os.Exit(1)
	}
}

// skelMain runs the process's own call through the CNI library's skel.
func skelMain() *types.Error {
	return skel.PluginMainFuncsWithError((&run{env: osEnv()}).funcs(), supportedVersions, about())
}

// about is what the plugin prints on stderr when run without CNI_COMMAND.
func about() string {
	return "nftmesh-cni " + version.Get() + ": chained CNI plugin installing Istio sidecar capture rules"
}

// run is one call's environment, shared by its verb.
type run struct {
	env         Env
	declined    bool  // set by decline
	declinedFor error // the error that made the call go elsewhere, if any
}

// errDeclined ends a verb that must run elsewhere; Run reports ErrDeclined.
var errDeclined = types.NewError(types.ErrTryAgainLater, "nftmesh-cni: declined", "")

// decline marks the call as one to run elsewhere and returns the error that
// ends its verb. Only a verb that leaves the namespace as it found it may.
func (r *run) decline() error {
	r.declined = true
	return errDeclined
}

// declineFor is decline because of err.
func (r *run) declineFor(err error) error {
	r.declinedFor = err
	return r.decline()
}

func (r *run) funcs() skel.CNIFuncs {
	return skel.CNIFuncs{
		Add:    r.guard("ADD", r.cmdAdd),
		Del:    r.guard("DEL", r.cmdDel),
		Check:  r.guard("CHECK", r.cmdCheck),
		Status: r.guard("STATUS", r.cmdStatus),
		GC:     r.guard("GC", r.cmdGC),
	}
}

// osEnv is the process's own call.
func osEnv() Env {
	return Env{Getenv: os.Getenv, Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr, Phases: true}
}

func (r *run) ctx() context.Context { return cmp.Or(r.env.Context, context.Background()) }

func (r *run) pipeline() *capture.Pipeline { return cmp.Or(r.env.Pipeline, pipeline) }
