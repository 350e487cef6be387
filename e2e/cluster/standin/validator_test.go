package standin

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nftmesh/nftmesh/capture"
	"github.com/nftmesh/nftmesh/netlab"
	"github.com/nftmesh/nftmesh/podinfo"
	"github.com/nftmesh/nftmesh/podinfo/meshpod"
	"github.com/nftmesh/nftmesh/redirect"
	"github.com/nftmesh/nftmesh/testkit/kubetest"
)

func TestParseValidatorTimeout(t *testing.T) {
	good := map[string]time.Duration{
		"10s": 10 * time.Second, "0": 0, "0ms": 0, "0s": 0, "120000ms": 2 * time.Minute, "2m": 2 * time.Minute,
		"2h": 2 * time.Hour, "2d": 48 * time.Hour, " 5s ": 5 * time.Second,
	}
	for in, want := range good {
		if got, err := ParseValidatorTimeout(in); err != nil || got != want {
			t.Errorf("ParseValidatorTimeout(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	bad := map[string]string{
		"120":                   "unit",
		"s":                     "has no number",
		"foobars":               "has no number",
		"10x":                   `unit "x"`,
		"1.5s":                  "not a whole number",
		"-1s":                   "not a whole number",
		"18446744073709551615s": "too long",
		"99999999999999999999s": "not a whole number",
		"":                      "has no number",
	}
	for in, want := range bad {
		_, err := ParseValidatorTimeout(in)
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "--timeout") {
			t.Errorf("ParseValidatorTimeout(%q) = %v, want an error naming --timeout and %q", in, err, want)
		}
	}
}

func FuzzParseValidatorTimeout(f *testing.F) {
	for _, s := range []string{"10s", "0", "2d", "120", "1.5s", "9223372036854775807ms", "x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := ParseValidatorTimeout(s)
		if err != nil {
			if len(err.Error()) > 200 {
				t.Errorf("error of %d bytes", len(err.Error()))
			}
			return
		}
		if d < 0 {
			t.Errorf("ParseValidatorTimeout(%q) = %v, negative", s, d)
		}
	})
}

// buildValidator builds the stand-in's binary once per test.
func buildValidator(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	// UID 65534 runs it: open the test's 0700 directories to it.
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	bin := filepath.Join(dir, "linkerd-network-validator")
	out, err := exec.Command("go", "build", "-o", bin, "./cmd/linkerd-network-validator").CombinedOutput()
	if err != nil {
		t.Fatalf("building the validator: %v\n%s", err, out)
	}
	return bin
}

// runValidator runs the binary in the pod namespace as the validator's
// user (65534, which no capture lets out) with the flags Linkerd's
// injector writes, and returns its exit code and output.
func runValidator(t *testing.T, topo *netlab.Topology, bin string, timeout string) (int, string) {
	t.Helper()
	var out []byte
	var runErr error
	err := topo.DoAs(65534, 65534, func() error {
		cmd := exec.Command(bin, "--log-format", "plain", "--log-level", "debug", "--connect-addr", "1.1.1.1:20001",
			"--listen-addr", "0.0.0.0:4140", "--timeout", timeout)
		out, runErr = cmd.CombinedOutput()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var exit *exec.ExitError
	switch {
	case runErr == nil:
		return 0, string(out)
	case errors.As(runErr, &exit):
		return exit.ExitCode(), string(out)
	}
	t.Fatalf("running the validator: %v\n%s", runErr, out)
	return -1, ""
}

// TestValidatorFirstRunAfterAdd: the validator stand-in, run in a Linkerd
// pod's network namespace as Linkerd's injector runs it, fails with
// Linkerd's exit code 95 while the pod has no capture, and passes on its
// first run once nftmesh's ADD (the pipeline the plugin runs: the pod's
// Linkerd decision, then one apply) has captured the pod, on both
// backends.
func TestValidatorFirstRunAfterAdd(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces, applies capture rules, runs as UID 65534")
	}
	bin := buildValidator(t)
	pod, err := kubetest.ReadPodFile(filepath.Join("..", "..", "..", "testdata", "pods", "linkerd.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, backend := range []string{redirect.BackendNFTables, redirect.BackendLegacy} {
		t.Run(backend, func(t *testing.T) {
			topo, err := netlab.NewTopology(netlab.TopologyOptions{Prefix: "lval-"})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				if err := topo.Close(); err != nil {
					t.Error(err)
				}
			})
			code, out := runValidator(t, topo, bin, "2s")
			if code != ValidatorFailed || !strings.Contains(out, "1.1.1.1:20001") {
				t.Fatalf("without capture the validator exited %d, want %d:\n%s", code, ValidatorFailed, out)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			added, err := capture.Linux().Add(ctx, topo.PodNetnsPath(), func() (*meshpod.Pod, error) { return podinfo.Mesh(pod), nil },
				capture.Options{Backend: backend, RunDir: t.TempDir()})
			if err != nil || !added.InMesh || added.Reason != meshpod.ReasonLinkerdInMesh {
				t.Fatalf("ADD of the Linkerd pod: %+v, %v", added.Decision, err)
			}
			code, out = runValidator(t, topo, bin, "10s")
			if code != 0 || !strings.Contains(out, "validated") {
				t.Fatalf("after nftmesh's ADD the validator's first run exited %d, want 0:\n%s", code, out)
			}
		})
	}
}
