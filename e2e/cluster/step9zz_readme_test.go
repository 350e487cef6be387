package cluster

// TestReadmeInstall runs last, after TestMultiNode, and nothing may run
// after it that starts the harness's image. The image `make push` builds is
// the harness's own (one reproducible build: one config digest, which is
// the image ID), and kubelet 1.35 records each image it pulls with the
// repositories it was pulled for (image_manager/pulled, the
// KubeletEnsureSecretPulledImages feature, on by default). Once the
// registry's pull is recorded, the harness's tag for the same image ID is
// no longer "preloaded", and with pullPolicy Never kubelet refuses it:
// ErrImageNeverPull, while containerd's CRI still lists it (CI met this
// with the test placed before TestNodeStartRace). The test uninstalls
// whatever chart is on the node first and leaves none behind.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftmesh/nftmesh/testkit/imagetest"
	"github.com/nftmesh/nftmesh/testkit/spawn"
)

// The README's marker lines (fixed in issue 30): each is followed by the
// fenced sh block this test runs, with these two placeholders replaced.
const (
	readmeInTreeMarker = "<!-- e2e: TestReadmeInstall runs the next block with registry.example.com/mesh replaced -->"
	readmeOCIMarker    = "<!-- e2e: TestReadmeInstall runs the next block as the OCI chart path -->"
	readmeRegistry     = "registry.example.com/mesh"
	readmeValues       = "your-istio-cni-values.yaml"
)

// TestReadmeInstall is the README's build-your-own install, run as
// written: a registry of the test's own on loopback (the same address for
// `make push` and for the node's containerd, which pulls from it over plain
// HTTP), then the in-tree chart's block (`make push`, `helm install
// charts/nftmesh` with only the image repository set), then the OCI chart's
// (`helm install oci://…`), the chart uninstalled and the pulled image
// removed from containerd between them. Each must give a Ready agent on an
// image containerd pulled from the registry (the tag resolved there, the
// pod's image ID the registry's digest, the plugin binary on the node the
// registry image's) and an injected pod Running and captured.
func TestReadmeInstall(t *testing.T) {
	c := need(t)
	readme, err := os.ReadFile(filepath.Join(repo, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	var blocks [2]string
	for i, marker := range []string{readmeInTreeMarker, readmeOCIMarker} {
		if blocks[i], err = readmeBlock(string(readme), marker); err != nil {
			t.Fatal(err)
		}
	}
	template := c.meshPodsReady(t)
	t.Cleanup(func() { c.deleteMesh(t) })
	dir := c.path("readme")
	reg, err := c.startRegistry(filepath.Join(dir, "registry"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(reg.Close)
	if err := c.writeRegistryHosts(reg.Addr); err != nil {
		t.Fatal(err)
	}
	sh, err := c.newReadmeShell(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sh.fwd.Close)
	t0 := time.Now()
	for i, p := range []string{"in-tree", "oci"} {
		t.Run(p, func(t *testing.T) { c.readmePath(t, reg, sh, p, blocks[i], template) })
	}
	record("readme: both install paths, registry %s: %.2fs", reg.Addr, time.Since(t0).Seconds())
}

// readmePath runs one README block on a node without the chart and
// checks the agent and a mesh pod.
func (c *Cluster) readmePath(t *testing.T, reg *loopRegistry, sh *readmeShell, path, block string, template corev1.PodTemplateSpec) {
	ctx := context.Background()
	if err := c.uninstallAnyRelease(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.uninstallAnyRelease(context.Background()); err != nil {
			t.Error(err)
		}
	})
	// The previous path's pull goes: this one must pull again.
	if err := c.removeImages(ctx, reg.Addr+"/"); err != nil {
		t.Fatal(err)
	}
	script, err := readmeScript(block, reg.Addr+"/mesh", sh.values)
	if err != nil {
		t.Fatal(err)
	}
	mark := reg.Mark()
	t0 := time.Now()
	out, err := sh.run(ctx, filepath.Join(sh.dir, path+".sh"), script)
	ran := time.Since(t0)
	// helm's install notes are long and always the same: cut.
	shown, _, cut := strings.Cut(out, "NOTES:\n")
	if cut {
		shown += "NOTES: (cut)\n"
	}
	t.Logf("the README's block as run (bash -e, in %s):\n%s--- its output:\n%s", repo, script, shown)
	if err != nil {
		t.Fatal(err)
	}
	ds, err := c.Client.AppsV1().DaemonSets(agentNS).Get(ctx, agentDaemonSet, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if image := ds.Spec.Template.Spec.Containers[0].Image; !strings.HasPrefix(image, reg.Addr+"/") {
		t.Fatalf("the chart rendered the agent's image %s, not one in the registry the block pushed to (%s)", image, reg.Addr)
	}
	agent, err := c.waitAgentPulled(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ready := time.Since(t0)
	c.checkPulled(ctx, t, reg, mark, agent)

	pod := "readme-" + path
	t1 := time.Now()
	c.createMeshPod(t, template, pod)
	restarts, err := c.waitCaptured(ctx, pod)
	if err != nil {
		t.Fatalf("%v\n%s", err, c.describePod(ctx, meshNS, pod))
	}
	if restarts != 0 {
		t.Errorf("%s: istio-validation ran %d times", pod, restarts+1)
	}
	if line := c.agentLogLine(ctx, t, meshNS, pod, "ADD"); line["decision"] != "capture" {
		t.Errorf("%s: decision %v, want capture: %v", pod, line["decision"], line)
	}
	captured := time.Since(t1)
	if err := c.deletePodAndWait(ctx, pod); err != nil {
		t.Error(err)
	}
	record("readme %s: the README's block %.2fs; → agent Ready on the pulled image %.2fs; a mesh pod Running and captured %.2fs",
		path, ran.Seconds(), ready.Seconds(), captured.Seconds())
}

// readmeBlock returns the fenced sh block right after the line marker, its
// indentation (a list item's) taken off.
func readmeBlock(readme, marker string) (string, error) {
	switch n := strings.Count(readme, marker); {
	case n == 0:
		return "", fmt.Errorf("README.md has no line %q", marker)
	case n > 1:
		return "", fmt.Errorf("README.md has the line %q %d times, want once", marker, n)
	}
	_, after, _ := strings.Cut(readme, marker)
	lines := strings.Split(after, "\n")
	if strings.TrimSpace(lines[0]) != "" {
		return "", fmt.Errorf("README.md: text after %q on its line: %q", marker, lines[0])
	}
	i := 1
	for i < len(lines) && strings.TrimSpace(lines[i]) == "" {
		i++
	}
	if i == len(lines) || strings.TrimSpace(lines[i]) != "```sh" {
		next := ""
		if i < len(lines) {
			next = lines[i]
		}
		return "", fmt.Errorf("README.md: the line after %q is %q, want the opening of a fenced sh block (```sh)", marker, next)
	}
	indent := lines[i][:len(lines[i])-len(strings.TrimLeft(lines[i], " \t"))]
	var body []string
	for _, l := range lines[i+1:] {
		if strings.TrimSpace(l) == "```" {
			if len(body) == 0 {
				return "", fmt.Errorf("README.md: the sh block after %q is empty", marker)
			}
			return strings.Join(body, "\n") + "\n", nil
		}
		body = append(body, strings.TrimPrefix(l, indent))
	}
	return "", fmt.Errorf("README.md: the sh block after %q is not closed", marker)
}

// readmeScript is block with the README's placeholders replaced; a block
// without them would not run against the test's registry.
func readmeScript(block, registry, values string) (string, error) {
	for _, p := range []string{readmeRegistry, readmeValues} {
		if !strings.Contains(block, p) {
			return "", fmt.Errorf("the README's block does not name %s:\n%s", p, block)
		}
	}
	return strings.NewReplacer(readmeRegistry, registry, readmeValues, values).Replace(block), nil
}

// readmeShell is where the README's blocks run: the repository root in
// the machine's network namespace (where a user's shell is: `make push`
// may need the module proxy), the harness's helm first in PATH, a
// kubeconfig reaching the node's apiserver, no make variables of the make
// that started the test.
type readmeShell struct {
	dir    string
	values string // the istio-cni values file the blocks name
	env    []string
	fwd    *apiForwarder
}

func (c *Cluster) newReadmeShell(dir string) (*readmeShell, error) {
	sh := &readmeShell{dir: dir, values: filepath.Join(dir, "istio-cni-values.yaml")}
	// The harness's own install settings (the node's CNI directories); the
	// README's block sets the image.
	if err := writeFile(sh.values, fmt.Sprintf("cniBinDir: %s\ncniConfDir: %s\n", c.CNIBinDir, c.CNIConfDir), 0o644); err != nil {
		return nil, err
	}
	bin := filepath.Join(dir, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		return nil, fmt.Errorf("creating %s: %w", bin, err)
	}
	if err := os.Symlink(c.bin.helm, filepath.Join(bin, "helm")); err != nil {
		return nil, fmt.Errorf("linking helm: %w", err)
	}
	kubeconfig := filepath.Join(dir, "kubeconfig")
	fwd, err := c.forwardAPIServer(kubeconfig)
	if err != nil {
		return nil, err
	}
	sh.fwd = fwd
	for _, e := range os.Environ() {
		switch k, _, _ := strings.Cut(e, "="); k {
		case "MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "KUBECONFIG", "PATH":
		default:
			sh.env = append(sh.env, e)
		}
	}
	sh.env = append(sh.env, "PATH="+bin+":"+os.Getenv("PATH"), "KUBECONFIG="+kubeconfig,
		"KUBECACHEDIR="+c.path("kubecache"),
		"HELM_CACHE_HOME="+c.path("helm", "cache"),
		"HELM_CONFIG_HOME="+c.path("helm", "config"),
		"HELM_DATA_HOME="+c.path("helm", "data"))
	return sh, nil
}

// run writes script to file and runs it with `bash -e` from the
// repository root, and returns its output (also in file.log).
func (sh *readmeShell) run(ctx context.Context, file, script string) (string, error) {
	if err := writeFile(file, script, 0o644); err != nil {
		return "", err
	}
	var out bytes.Buffer
	cmd := exec.Command("bash", "-e", file)
	cmd.Dir, cmd.Env = repo, sh.env
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := spawn.Start(cmd); err != nil {
		return "", fmt.Errorf("starting bash: %w", err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	var err error
	select {
	case err = <-done:
	case <-ctx.Done():
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // make, go, helm: the whole group
		<-done
		err = ctx.Err()
	}
	_ = os.WriteFile(file+".log", out.Bytes(), 0o644)
	if err != nil {
		return out.String(), fmt.Errorf("bash -e %s (its output is above): %w", file, err)
	}
	return out.String(), nil
}

// uninstallAnyRelease removes release nftmesh whoever installed it and
// waits for the agent's pods to be gone.
func (c *Cluster) uninstallAnyRelease(ctx context.Context) error {
	chartMu.Lock()
	defer chartMu.Unlock()
	if _, err := c.Helm(ctx, "uninstall", "nftmesh", "-n", agentNS, "--ignore-not-found", "--wait", "--timeout", "2m"); err != nil {
		return err
	}
	chartInstalled = false
	return c.poll(ctx, 60*time.Second, "agent pods gone", func() (bool, error) {
		l, err := c.Client.CoreV1().Pods(agentNS).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=nftmesh-agent"})
		return err == nil && len(l.Items) == 0, nil
	})
}

// removeImages removes the node's images whose names start with prefix
// and checks that none is left.
func (c *Cluster) removeImages(ctx context.Context, prefix string) error {
	names, err := c.imageNames(ctx, prefix)
	if err != nil || len(names) == 0 {
		return err
	}
	if _, err := c.Ctr(ctx, append([]string{"images", "rm"}, names...)...); err != nil {
		return err
	}
	if names, err = c.imageNames(ctx, prefix); err == nil && len(names) > 0 {
		err = fmt.Errorf("images still in the node's containerd after ctr images rm: %v", names)
	}
	return err
}

// imageNames lists the node's image names that start with prefix.
func (c *Cluster) imageNames(ctx context.Context, prefix string) ([]string, error) {
	out, err := c.Ctr(ctx, "images", "ls", "-q")
	if err != nil {
		return nil, err
	}
	var names []string
	for _, n := range strings.Fields(out) {
		if strings.HasPrefix(n, prefix) {
			names = append(names, n)
		}
	}
	return names, nil
}

// waitAgentPulled waits until the one agent pod is Ready and returns it;
// an image pull that failed ends the wait at once with kubelet's reason.
func (c *Cluster) waitAgentPulled(ctx context.Context) (*corev1.Pod, error) {
	var agent *corev1.Pod
	var pullErr error
	err := c.poll(ctx, 120*time.Second, "the agent Ready", func() (bool, error) {
		l, err := c.Client.CoreV1().Pods(agentNS).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=nftmesh-agent"})
		if err != nil || len(l.Items) != 1 {
			return false, nil
		}
		agent = &l.Items[0]
		for _, s := range append(agent.Status.InitContainerStatuses, agent.Status.ContainerStatuses...) {
			if w := s.State.Waiting; w != nil && (w.Reason == "ImagePullBackOff" || w.Reason == "ErrImageNeverPull" || w.Reason == "InvalidImageName") {
				pullErr = fmt.Errorf("agent pod %s, container %s, image %s: %s: %s", agent.Name, s.Name, s.Image, w.Reason, w.Message)
				return false, pullErr
			}
		}
		for _, cond := range agent.Status.Conditions {
			if cond.Type == corev1.PodReady {
				return cond.Status == corev1.ConditionTrue, nil
			}
		}
		return false, nil
	})
	if err != nil && !errors.Is(err, pullErr) {
		err = fmt.Errorf("%w (%s)", err, podState(agent))
	}
	return agent, err
}

// checkPulled checks that the agent runs an image containerd pulled from
// the registry: the node's containerd resolved its tag there (its requests
// came in on the node's loopback), containerd's image of that name and the
// pod's image ID are the registry's digest, kubelet reports a pull, and the
// plugin binary the agent installed is the registry image's.
func (c *Cluster) checkPulled(ctx context.Context, t *testing.T, reg *loopRegistry, mark int, agent *corev1.Pod) {
	t.Helper()
	image := agent.Spec.Containers[0].Image
	repoName, tag, ok := strings.Cut(strings.TrimPrefix(image, reg.Addr+"/"), ":")
	if !strings.HasPrefix(image, reg.Addr+"/") || !ok {
		t.Fatalf("the agent runs %s, not an image of the registry %s", image, reg.Addr)
	}
	digest, err := imagetest.RemoteDigest(image)
	if err != nil {
		t.Fatalf("the registry does not hold %s: %v", image, err)
	}
	manifests, blobs, fetched := reg.containerdPulls(mark, repoName, tag)
	if manifests == 0 {
		t.Errorf("the node's containerd never resolved %s at the registry (its requests on the node's loopback: %v)", image, reg.Requests(mark))
	}
	t.Logf("the node's containerd at the registry: %d manifest requests for tag %s, %d blobs (%d bytes) fetched; %s is %s",
		manifests, tag, blobs, fetched, image, digest)

	status := agent.Status.ContainerStatuses
	if want := reg.Addr + "/" + repoName + "@" + digest; len(status) == 0 || status[0].ImageID != want {
		t.Errorf("the agent's image ID is %v, want the registry's digest %s", status, want)
	}
	out, err := c.Ctr(ctx, "images", "ls")
	if err != nil {
		t.Fatal(err)
	}
	if !imageListed(out, image, digest) {
		t.Errorf("containerd's images hold no %s at digest %s:\n%s", image, digest, out)
	}
	// containerd labels what it fetched with where it came from, the
	// registry's host without its port (an import sets no such label).
	host, _, _ := strings.Cut(reg.Addr, ":")
	source := "containerd.io/distribution.source." + host + "=" + repoName
	if out, err := c.Ctr(ctx, "content", "ls"); err != nil {
		t.Error(err)
	} else if !contentLabelled(out, digest, source) {
		t.Errorf("containerd's content %s has no label %s:\n%s", digest, source, out)
	}
	if err := c.waitPulledEvent(ctx, agent); err != nil {
		t.Error(err)
	}

	want, err := imagetest.ReadRemoteFile(image, "linux/"+runtime.GOARCH, "/opt/cni/bin/nftmesh-cni")
	if err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(c.CNIBinDir, "nftmesh-cni")); err != nil || !bytes.Equal(got, want) {
		t.Errorf("the node's nftmesh-cni (%d bytes, %v) is not the registry image's (%d bytes)", len(got), err, len(want))
	}
}

// waitPulledEvent waits for kubelet's Pulled event of pod's image and
// fails unless it says the image was pulled (not "already present").
func (c *Cluster) waitPulledEvent(ctx context.Context, pod *corev1.Pod) error {
	return c.poll(ctx, 20*time.Second, "kubelet's Pulled event for "+pod.Name, func() (bool, error) {
		ev, err := c.Client.CoreV1().Events(pod.Namespace).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + pod.Name + ",reason=Pulled"})
		if err != nil || len(ev.Items) == 0 {
			return false, nil
		}
		if msg := ev.Items[0].Message; !strings.HasPrefix(msg, "Successfully pulled image") {
			return false, fmt.Errorf("kubelet did not pull the image of %s: %s", pod.Name, msg)
		}
		return true, nil
	})
}

// imageListed reports whether `ctr images ls` output has a line for image
// at digest.
func imageListed(ls, image, digest string) bool {
	for _, l := range strings.Split(ls, "\n") {
		f := strings.Fields(l)
		if len(f) >= 3 && f[0] == image && f[2] == digest {
			return true
		}
	}
	return false
}

// TestReadmeBlock: the README's blocks are found where the markers put
// them, and a README that moved them away fails with what is wrong.
func TestReadmeBlock(t *testing.T) {
	const m = "<!-- e2e: run -->"
	for _, tc := range []struct {
		name, readme, want, err string
	}{
		{"top level", "x\n" + m + "\n```sh\nmake push\nhelm install a \\\n  b\n```\ny\n", "make push\nhelm install a \\\n  b\n", ""},
		{"in a list item", "1. x\n\n   " + m + "\n\n   ```sh\n   make push\n     --x\n   ```\n", "make push\n  --x\n", ""},
		{"no marker", "```sh\nmake push\n```\n", "", "has no line"},
		{"marker twice", m + "\n```sh\na\n```\n" + m + "\n```sh\nb\n```\n", "", "2 times"},
		{"text after the marker", m + " see below\n```sh\na\n```\n", "", "text after"},
		{"prose before the block", m + "\nrun this:\n```sh\na\n```\n", "", `is "run this:"`},
		{"another language", m + "\n```console\n$ a\n```\n", "", "want the opening"},
		{"end of file", "x\n" + m + "\n", "", `is ""`},
		{"empty block", m + "\n```sh\n```\n", "", "is empty"},
		{"not closed", m + "\n```sh\na\n", "", "not closed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := readmeBlock(tc.readme, m)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("readmeBlock: %q, %v; want an error with %q", got, err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("readmeBlock: %q, %v; want %q", got, err, tc.want)
			}
		})
	}
	if _, err := readmeScript("helm install x\n", "127.0.0.1:5000/mesh", "/v.yaml"); err == nil || !strings.Contains(err.Error(), readmeRegistry) {
		t.Errorf("readmeScript of a block without the placeholder registry: %v", err)
	}
	got, err := readmeScript("make push REGISTRY="+readmeRegistry+"\nhelm -f "+readmeValues+" --set r="+readmeRegistry+"/nftmesh\n", "127.0.0.1:5000/mesh", "/v.yaml")
	if want := "make push REGISTRY=127.0.0.1:5000/mesh\nhelm -f /v.yaml --set r=127.0.0.1:5000/mesh/nftmesh\n"; err != nil || got != want {
		t.Errorf("readmeScript: %q, %v; want %q", got, err, want)
	}
}

// contentLabelled reports whether `ctr content ls` output lists digest
// with label (one of its comma-separated labels).
func contentLabelled(ls, digest, label string) bool {
	for _, l := range strings.Split(ls, "\n") {
		f := strings.Fields(l)
		if len(f) >= 2 && f[0] == digest && slices.Contains(strings.Split(f[len(f)-1], ","), label) {
			return true
		}
	}
	return false
}
