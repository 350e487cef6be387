package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nftmesh/nftmesh/redirect"
)

// complete runs cobra's hidden __complete command as the shell scripts do
// and returns the candidates and the directive line.
func complete(t *testing.T, args ...string) ([]string, string) {
	t.Helper()
	code, out, errOut := runCLI(t, append([]string{"__complete"}, args...)...)
	if code != exitOK {
		t.Fatalf("__complete %v: exit %d: %s", args, code, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	return lines[:len(lines)-1], lines[len(lines)-1]
}

// TestCLICompletion: --backend, -a (keys with "=", then the closed values),
// -o per command and --netns (ip netns names) complete.
func TestCLICompletion(t *testing.T) {
	for _, verb := range []string{"apply", "inspect", "clean"} {
		if got, dir := complete(t, verb, "--backend", ""); !slices.Equal(got, []string{"auto", "nftables", "iptables-legacy"}) || dir != ":4" {
			t.Errorf("%s --backend: %q %s", verb, got, dir)
		}
	}
	got, dir := complete(t, "render", "-a", "traffic.sidecar.istio.io/excludeO")
	if !slices.Equal(got, []string{redirect.AnnotationExcludeOutboundIPRanges + "=", redirect.AnnotationExcludeOutboundPorts + "="}) || dir != ":6" {
		t.Errorf("-a traffic.sidecar.istio.io/excludeO: %q %s (want the keys with =, no space after: :6)", got, dir)
	}
	got, _ = complete(t, "apply", "--annotation", "")
	if len(got) != len(redirect.CaptureAnnotations) {
		t.Errorf("--annotation '': %d candidates, want %d", len(got), len(redirect.CaptureAnnotations))
	}
	got, _ = complete(t, "validate", "-a", redirect.AnnotationInterceptionMode+"=T")
	if !slices.Equal(got, []string{redirect.AnnotationInterceptionMode + "=TPROXY"}) {
		t.Errorf("interceptionMode=T: %q", got)
	}
	if got, _ := complete(t, "validate", "-o", ""); !slices.Equal(got, []string{"text", "json"}) {
		t.Errorf("validate -o: %q", got)
	}
	if got, _ := complete(t, "render", "-o", ""); !slices.Equal(got, []string{"nft", "iptables", "json", "plan"}) {
		t.Errorf("render -o: %q", got)
	}

	dir2 := t.TempDir()
	for _, n := range []string{"pod-b", "pod-a", "other"} {
		if err := os.WriteFile(filepath.Join(dir2, n), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	old := netnsDir
	netnsDir = dir2
	defer func() { netnsDir = old }()
	if got, _ := complete(t, "clean", "--netns", "pod"); !slices.Equal(got, []string{"pod-a", "pod-b"}) {
		t.Errorf("--netns pod: %q", got)
	}
	if got, dir := complete(t, "clean", "--netns", "/proc/"); len(got) != 0 || dir != ":0" {
		t.Errorf("--netns /proc/: %q %s (want the shell's file completion)", got, dir)
	}
}
