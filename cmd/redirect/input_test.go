package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nftmesh/nftmesh/nft"
	"github.com/nftmesh/nftmesh/podinfo/meshpod/manifest"
	"github.com/nftmesh/nftmesh/redirect"
)

// meshPodDoc is an injected sidecar pod's manifest (in the mesh).
func meshPodDoc(namespace, name string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %s
  namespace: %s
  annotations:
    sidecar.istio.io/status: '{}'
    traffic.sidecar.istio.io/excludeOutboundIPRanges: 192.0.2.%d/32
spec:
  containers:
  - name: app
  - name: istio-proxy
    args: [proxy, sidecar]
`, name, namespace, len(name))
}

// TestCLIManifestInput: several Pods in one file (documents or a List) are
// an error listing them unless --name picks one; standard input reads like
// a file; a manifest past the cap is refused naming the file and the cap.
func TestCLIManifestInput(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	multi := write("multi.yaml", meshPodDoc("shop", "web-a")+"---\n"+meshPodDoc("shop", "web-bb"))
	list := write("list.yaml", "apiVersion: v1\nkind: List\nitems:\n- "+strings.ReplaceAll(meshPodDoc("shop", "web-a"), "\n", "\n  ")+"\n- "+strings.ReplaceAll(meshPodDoc("bank", "web-bb"), "\n", "\n  "))
	pad := "# " + strings.Repeat("x", 1000) + "\n"
	huge := write("huge.yaml", meshPodDoc("shop", "web-a")+strings.Repeat(pad, manifest.MaxManifestSize/len(pad)+1))

	for _, tc := range []struct {
		name    string
		args    []string
		stdin   string
		code    int
		mention []string
	}{
		{"two documents", []string{"render", "--pod", multi}, "", exitUsage, []string{multi, "2 Pods", `"shop/web-a"`, `"shop/web-bb"`, "choose one with --name"}},
		{"two documents, --name", []string{"render", "--pod", multi, "--name", "web-bb"}, "", exitOK, []string{"192.0.2.6"}},
		{"two documents, --name ns/name", []string{"render", "--pod", multi, "--name", "shop/web-a"}, "", exitOK, []string{"192.0.2.5"}},
		{"two documents, unknown --name", []string{"render", "--pod", multi, "--name", "web-c"}, "", exitUsage, []string{`no Pod or workload named "web-c"`, `"shop/web-a"`}},
		{"a List", []string{"validate", "--pod", list}, "", exitUsage, []string{"2 Pods", `"bank/web-bb"`}},
		{"a List, --name", []string{"validate", "--pod", list, "--name", "bank/web-bb"}, "", exitOK, []string{"pod bank/web-bb"}},
		{"standard input", []string{"render", "--pod", "-"}, meshPodDoc("shop", "web-a"), exitOK, []string{"192.0.2.5"}},
		{"standard input, two documents", []string{"render", "--pod", "-"}, meshPodDoc("shop", "web-a") + "---\n" + meshPodDoc("shop", "web-bb"), exitUsage, []string{"standard input", "2 Pods"}},
		{"standard input past the cap", []string{"render", "--pod", "-"}, meshPodDoc("shop", "web-a") + strings.Repeat(pad, manifest.MaxManifestSize/len(pad)+1), exitUsage, []string{"standard input", "4 MiB cap"}},
		{"file past the cap", []string{"render", "--pod", huge}, "", exitUsage, []string{huge, "4 MiB cap"}},
		{"--name without --pod", []string{"render", "--name", "web-a"}, "", exitUsage, []string{"--name", "--pod"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stdin = strings.NewReader(tc.stdin)
			defer func() { stdin = os.Stdin }()
			code, out, errOut := runCLI(t, tc.args...)
			if code != tc.code {
				t.Fatalf("exit %d, want %d (stderr %q)", code, tc.code, errOut)
			}
			text := errOut
			if code == exitOK {
				text = out
			}
			for _, m := range tc.mention {
				if !strings.Contains(text, m) {
					t.Errorf("output %.400q does not mention %q", text, m)
				}
			}
		})
	}
}

// TestCLIPodDevZero: a device that never ends is refused at the cap, fast,
// instead of being read into memory until the machine runs out.
func TestCLIPodDevZero(t *testing.T) {
	start := time.Now()
	code, _, errOut := runCLI(t, "render", "--pod", "/dev/zero")
	if code != exitUsage || !strings.Contains(errOut, "/dev/zero") || !strings.Contains(errOut, "4 MiB cap") {
		t.Errorf("exit %d: %s", code, errOut)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("took %v", took)
	}
}

// TestCLIApplyNeedsInput: apply without --pod or --annotation installs
// nothing and says what to give; --defaults installs Istio's default
// capture, read back from the kernel.
func TestCLIApplyNeedsInput(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		mention []string
	}{
		{[]string{"apply", "--netns", "/proc/self/ns/net"}, []string{"--pod", "--annotation", "--defaults"}},
		{[]string{"apply", "--netns", "/proc/self/ns/net", "--defaults", "-a", redirect.AnnotationIncludeInboundPorts + "=80"}, []string{"--defaults cannot be combined"}},
		{[]string{"apply", "--netns", "/proc/self/ns/net", "--defaults", "--pod", "x.yaml"}, []string{"--defaults cannot be combined"}},
	} {
		code, out, errOut := runCLI(t, tc.args...)
		if code != exitUsage || out != "" {
			t.Errorf("%v: exit %d, want %d (stderr %q)", tc.args, code, exitUsage, errOut)
		}
		for _, m := range tc.mention {
			if !strings.Contains(errOut, m) {
				t.Errorf("%v: stderr %q does not mention %s", tc.args, errOut, m)
			}
		}
	}

	if os.Geteuid() != 0 {
		t.Skip("the kernel half needs root: creates a network namespace")
	}
	name := fmt.Sprintf("rdef-%d", time.Now().UnixNano()%1e9)
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	ns := "/run/netns/" + name
	ctx := context.Background()

	if code, _, errOut := runCLI(t, "apply", "--netns", ns, "--backend", "nftables"); code != exitUsage {
		t.Fatalf("apply without input: exit %d (%s)", code, errOut)
	}
	live, err := nft.New().List(ctx, ns)
	if err != nil {
		t.Fatal(err)
	}
	if !live.Empty() {
		t.Fatalf("apply without input left rules:\n%s", strings.Join(redirect.Describe(live), "\n"))
	}

	if code, _, errOut := runCLI(t, "apply", "--netns", ns, "--backend", "nftables", "--defaults"); code != exitOK {
		t.Fatalf("apply --defaults: exit %d (%s)", code, errOut)
	}
	want, err := redirect.Build(redirect.DefaultSpec())
	if err != nil {
		t.Fatal(err)
	}
	if err := nft.New().Check(ctx, ns, want); err != nil {
		t.Fatalf("apply --defaults did not install the default capture: %v", err)
	}
}

// TestCLIWorkloadInput: --pod (-f) reads what users have: istioctl
// kube-inject output (documents: a ServiceAccount, a Service, the injected
// Deployment), a CronJob's template, and a file of several workloads
// refused naming each unless --name picks one, by NAME or KIND/NAME.
// Before, each was "no Pod in the manifest".
func TestCLIWorkloadInput(t *testing.T) {
	injected := filepath.Join("..", "..", "testdata", "istio", "injected")
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	product, err := os.ReadFile(filepath.Join(injected, "productpage.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	reviews, err := os.ReadFile(filepath.Join(injected, "reviews.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	both := write("bookinfo.yaml", string(product)+"\n---\n"+string(reviews))
	cron := write("cron.yaml", `apiVersion: batch/v1
kind: CronJob
metadata: {name: nightly, namespace: shop}
spec:
  schedule: "0 3 * * *"
  jobTemplate:
    spec:
      template:
        metadata:
          annotations:
            sidecar.istio.io/status: '{}'
            traffic.sidecar.istio.io/excludeOutboundIPRanges: 198.51.100.0/24
        spec:
          containers:
          - name: istio-proxy
            args: [proxy, sidecar]
`)
	noTemplate := write("bare.yaml", "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: bare}\nspec: {replicas: 1}\n")
	for _, tc := range []struct {
		name    string
		args    []string
		code    int
		mention []string
	}{
		{"kube-inject output", []string{"validate", "-f", filepath.Join(injected, "exclude-cidrs.yaml")}, exitOK, []string{"ok: Deployment ", "203.0.113.0/24"}},
		{"kube-inject output, rules", []string{"render", "-f", filepath.Join(injected, "productpage.yaml")}, exitOK, []string{"15001"}},
		{"kube-inject output left alone", []string{"render", "-f", filepath.Join(injected, "no-inject.yaml")}, exitNotInMesh, []string{"not in the mesh"}},
		{"CronJob", []string{"validate", "-f", cron}, exitOK, []string{"ok: CronJob shop/nightly", "198.51.100.0/24"}},
		{"two workloads", []string{"render", "-f", both}, exitUsage, []string{both, `Deployment "productpage-v1"`, `Deployment "reviews-v1"`, "choose one with --name"}},
		{"two workloads, --name", []string{"validate", "-f", both, "--name", "reviews-v1"}, exitOK, []string{"ok: Deployment reviews-v1\n"}},
		{"two workloads, --name KIND/NAME", []string{"validate", "-f", both, "--name", "deployment/productpage-v1"}, exitOK, []string{"ok: Deployment productpage-v1\n"}},
		{"a workload without a template", []string{"render", "-f", noTemplate}, exitUsage, []string{noTemplate, `Deployment "bare"`, "spec.template"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := runCLI(t, tc.args...)
			if code != tc.code {
				t.Fatalf("exit %d, want %d (stderr %q)", code, tc.code, errOut)
			}
			text := out + errOut
			for _, m := range tc.mention {
				if !strings.Contains(text, m) {
					t.Errorf("output %.600q does not mention %q", text, m)
				}
			}
		})
	}
}

// TestCLIVersionCommand: `redirect version` prints what --version prints.
func TestCLIVersionCommand(t *testing.T) {
	code, out, errOut := runCLI(t, "version")
	_, want, _ := runCLI(t, "--version")
	if code != exitOK || out != want || errOut != "" {
		t.Errorf("version: exit %d, stdout %q, stderr %q; want %q", code, out, errOut, want)
	}
	if code, _, errOut := runCLI(t, "version", "extra"); code != exitUsage || !strings.Contains(errOut, "extra") {
		t.Errorf("version extra: exit %d, stderr %q", code, errOut)
	}
}
