// Command redirect shows, applies, inspects and removes the sidecar capture
// rules nftmesh gives a pod, without Kubernetes: the spec comes from a Pod
// manifest (--pod) or from annotations on the command line (--annotation).
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/nftmesh/nftmesh/capture"
	// GOMAXPROCS 1 from before os's init: a verb runs for milliseconds, one
	// goroutine at a time (nft.Backend.Prepare too), and a second P only
	// wakes idle threads (internal/oneproc has the figures).
	_ "github.com/nftmesh/nftmesh/internal/oneproc"
	"github.com/nftmesh/nftmesh/internal/phase"
	"github.com/nftmesh/nftmesh/internal/version"
	"github.com/nftmesh/nftmesh/redirect/quote"
)

// Exit codes, documented in the root command's --help.
const (
	exitOK        = 0
	exitFailure   = 1 // the kernel or the system refused (apply, read back, remove)
	exitUsage     = 2 // bad flags or bad input (annotations, manifest, a backend the netns cannot take)
	exitDrift     = 3 // inspect --pod: live rules differ from what the pod should have
	exitNotInMesh = 4 // the pod is not in the mesh: nothing rendered or applied
)

const exitCodesHelp = `Exit codes:
  0  success
  1  failure in the kernel or system (apply, read back, remove)
  2  bad usage or bad input (flags, annotations, manifest; --backend
     iptables-legacy for a user-namespaced netns, hostUsers: false)
  3  inspect: the live rules differ from the pod's plan, or another installer's
     capture is there too
  4  the pod is not in the mesh (skipped as Istio's CNI would): nothing done`

// exitError carries an exit code through cobra.
type exitError struct {
	code int
	err  error
}

// Error is the message, or the code for an exit code alone (inspect's drift,
// whose report is already printed).
func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit code %d", e.code)
	}
	return e.err.Error()
}
func (e *exitError) Unwrap() error { return e.err }

func usageErr(format string, args ...any) error {
	return &exitError{exitUsage, fmt.Errorf(format, args...)}
}

// failure is exit 1, except for a backend the namespace cannot take
// (iptables-legacy in a user-namespaced netns): a wrong flag, exit 2.
func failure(err error) error {
	if errors.Is(err, capture.ErrUserNamespaced) {
		return &exitError{exitUsage, err}
	}
	return &exitError{exitFailure, err}
}

func main() {
	phase.Mark("main")
	code := run(os.Args[1:], os.Stdout, os.Stderr)
	if os.Getenv(phasesEnv) != "" {
		phase.Mark("exit")
		fmt.Fprintf(os.Stderr, "redirect: phases_us: %s\n", phase.String())
	}
	os.Exit(code)
}

// phasesEnv, when set, makes redirect print on stderr, last, when it reached
// each step of its run (internal/phase marks), for the benchmarks. Not a
// flag, so that the command line, its help and completions stay as they are.
const phasesEnv = "REDIRECT_PHASES"

func run(args []string, stdout, stderr io.Writer) int {
	root := newRoot()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	cmd, err := root.ExecuteC()
	return exitCode(cmd, err, stderr)
}

// exitCode prints err (with a hint for a non-root user's permission error)
// unless it is an exit code alone, and returns the exit code for it.
func exitCode(cmd *cobra.Command, err error, stderr io.Writer) int {
	if err == nil {
		return exitOK
	}
	if hint := rootHint(err, os.Geteuid()); hint != "" {
		err = fmt.Errorf("%s %s: %w", cmd.Name(), hint, err)
	}
	var ee *exitError
	code := exitUsage // cobra's own errors are flag/usage errors
	if errors.As(err, &ee) {
		code = ee.code
	}
	if ee == nil || ee.err != nil {
		fmt.Fprintf(stderr, "redirect: %v\n", err)
	}
	return code
}

// rootHint says what a permission error of a non-root user means, or "" (for
// root the cause is elsewhere: a user namespace, seccomp, an LSM). The errno
// is also looked for in the text: some netlink libraries format it with %v.
func rootHint(err error, euid int) string {
	if euid == 0 || err == nil {
		return ""
	}
	msg := err.Error()
	if errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.EACCES) ||
		strings.Contains(msg, syscall.EPERM.Error()) || strings.Contains(msg, syscall.EACCES.Error()) {
		return "needs root (CAP_SYS_ADMIN to enter the network namespace, CAP_NET_ADMIN for its rules; try sudo)"
	}
	return ""
}

// noArgs refuses arguments (cobra.NoArgs calls one an "unknown command").
func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usageErr("%s takes no arguments, got %s (see %s --help)", cmd.Name(), quote.Value(strings.Join(args, " ")), cmd.CommandPath())
	}
	return nil
}

// podRefArg is inspect's one optional argument, NAMESPACE/NAME.
func podRefArg(cmd *cobra.Command, args []string) error {
	if len(args) > 1 {
		return usageErr("%s takes one pod, NAMESPACE/NAME, got %s", cmd.Name(), quote.Value(strings.Join(args, " ")))
	}
	return nil
}

// flagError says what is wrong with a flag in this CLI's words: pflag's
// name a Go function ("strconv.ParseBool: parsing ...") or a lone letter.
func flagError(cmd *cobra.Command, err error) error {
	var invalid *pflag.InvalidValueError
	var missing *pflag.ValueRequiredError
	var unknown *pflag.NotExistError
	switch {
	case errors.As(err, &invalid) && invalid.GetFlag().Value.Type() == "bool":
		return usageErr("--%s %s: want true or false", invalid.GetFlag().Name, quote.Value(invalid.GetValue()))
	case errors.As(err, &missing):
		f := missing.GetFlag()
		value, _ := pflag.UnquoteUsage(f)
		return usageErr("--%s needs a value (%s)", f.Name, value)
	case errors.As(err, &unknown):
		return usageErr("%v (see %s --help)", err, cmd.CommandPath())
	}
	return usageErr("%w", err)
}

// newVersionCmd prints what --version prints (see newRoot).
func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print redirect's version, Go toolchain and platform",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprintf(cmd.OutOrStdout(), "%s version %s\n", cmd.Root().Name(), cmd.Root().Version)
			return err
		},
	}
}

// newRoot is the whole command tree.
func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:   "redirect",
		Short: "Render, apply, inspect and remove nftmesh sidecar capture rules",
		Long: `redirect turns a pod's Istio sidecar capture settings (its annotations and its
istio-proxy container) into nftables rules inside a network namespace, exactly as
the nftmesh CNI plugin does, without Kubernetes and without any iptables or nft binary.

` + exitCodesHelp,
		// "redirect version v0.2.0 (go1.26.1 linux/amd64)", without a
		// version template: cobra renders one with text/template, whose
		// calls of methods by name keep every exported method in the
		// binary (8.3 instead of 6.0 MB, ~4 ms more CPU per apply).
		// TestBinaryPrunesMethods.
		Version:          version.Build(),
		SilenceUsage:     true,
		SilenceErrors:    true,
		PersistentPreRun: warnDeprecated,
	}
	root.SetFlagErrorFunc(flagError)
	root.AddCommand(newRenderCmd(), newValidateCmd(), newTraceCmd(), newApplyCmd(),
		newInspectCmd(), newCleanCmd(), newDemoCmd(), newVersionCmd())
	registerCompletions(root)
	for _, c := range root.Commands() {
		// The root's help holds the one table of exit codes.
		long := c.Short + "."
		if c.Long != "" {
			long += "\n\n" + c.Long
		}
		c.Long = long + "\n\nExit codes: see redirect --help."
	}
	// cobra's own --version and --help say "version for redirect".
	root.Flags().BoolP("version", "v", false, "print redirect's version, Go toolchain and platform (as redirect version)")
	return root
}
