package main

import (
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/nftmesh/nftmesh/capture"
	"github.com/nftmesh/nftmesh/redirect"
)

// registerCompletions gives every command's --backend, --annotation and
// --netns shell completion (redirect completion bash|zsh|fish|powershell).
func registerCompletions(root *cobra.Command) {
	for _, c := range root.Commands() {
		if c.Flags().Lookup("backend") != nil {
			_ = c.RegisterFlagCompletionFunc("backend", cobra.FixedCompletions(capture.BackendNames, cobra.ShellCompDirectiveNoFileComp))
		}
		if c.Flags().Lookup("annotation") != nil {
			_ = c.RegisterFlagCompletionFunc("annotation", completeAnnotation)
		}
		if c.Flags().Lookup("netns") != nil {
			_ = c.RegisterFlagCompletionFunc("netns", completeNetns)
		}
	}
}

// annotationValues are the values worth offering after KEY=: the closed
// sets only (ports and ranges are the user's own).
var annotationValues = map[string][]string{
	redirect.AnnotationInterceptionMode: {string(redirect.ModeRedirect), string(redirect.ModeTProxy), "NONE"},
}

// completeAnnotation completes -a: the capture annotation keys with their
// "=" (no space after, the value follows), then a key's known values.
func completeAnnotation(_ *cobra.Command, _ []string, toComplete string) ([]string, cobra.ShellCompDirective) {
	if key, _, ok := strings.Cut(toComplete, "="); ok {
		var out []string
		for _, v := range annotationValues[key] {
			if strings.HasPrefix(key+"="+v, toComplete) {
				out = append(out, key+"="+v)
			}
		}
		return out, cobra.ShellCompDirectiveNoFileComp
	}
	var out []string
	for _, k := range redirect.CaptureAnnotations {
		if strings.HasPrefix(k, toComplete) {
			out = append(out, k+"=")
		}
	}
	return out, cobra.ShellCompDirectiveNoSpace | cobra.ShellCompDirectiveNoFileComp
}

// completeNetns offers the `ip netns` names (os.ReadDir sorts them); a value
// with a "/" is a path, left to the shell's file completion.
func completeNetns(_ *cobra.Command, _ []string, toComplete string) ([]string, cobra.ShellCompDirective) {
	if strings.Contains(toComplete, "/") {
		return nil, cobra.ShellCompDirectiveDefault
	}
	entries, err := os.ReadDir(netnsDir)
	if err != nil {
		return nil, cobra.ShellCompDirectiveDefault
	}
	var out []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), toComplete) {
			out = append(out, e.Name())
		}
	}
	return out, cobra.ShellCompDirectiveDefault
}
