// Package linkerdtest runs Linkerd's own CNI plugin (linkerd-cni, with the
// proxy-init code it calls) as an oracle for nftmesh's Linkerd capture: it
// finds the reference source (shared/oracles/linkerd, or
// NFTMESH_LINKERD_ORACLE), builds it once into .cache, and loads the pods
// Linkerd's injector wrote, in their CNI-mode form.
package linkerdtest

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"

	"github.com/nftmesh/nftmesh/testkit/kubetest"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// OracleEnv names the directory holding the Linkerd reference (its README,
// linkerd2-proxy-init/ and pods/).
const OracleEnv = "NFTMESH_LINKERD_ORACLE"

// ErrNoOracle: the reference is not there; tests skip with its message.
var ErrNoOracle = errors.New("linkerd reference absent")

// OracleDir is $NFTMESH_LINKERD_ORACLE, else ../shared/oracles/linkerd
// beside the repository; ErrNoOracle when it holds no linkerd-cni source.
func OracleDir() (string, error) {
	dir := os.Getenv(OracleEnv)
	if dir == "" {
		root, err := kubetest.RepoRoot()
		if err != nil {
			return "", err
		}
		dir = filepath.Join(filepath.Dir(root), "shared", "oracles", "linkerd")
	}
	if _, err := os.Stat(filepath.Join(dir, "linkerd2-proxy-init", "cni-plugin", "main.go")); err != nil {
		return "", fmt.Errorf("%w: no linkerd2-proxy-init/cni-plugin in %s (set %s to the directory of shared/oracles/linkerd)", ErrNoOracle, dir, OracleEnv)
	}
	return dir, nil
}

// Build builds linkerd-cni (cni-plugin) and proxy-init from the reference
// source into .cache/linkerd-oracle/<digest of the source>/ once, and
// returns the linkerd-cni binary's path.
func Build(oracle string) (string, error) {
	src := filepath.Join(oracle, "linkerd2-proxy-init")
	sum, err := digest(src)
	if err != nil {
		return "", err
	}
	root, err := kubetest.RepoRoot()
	if err != nil {
		return "", err
	}
	out := filepath.Join(root, ".cache", "linkerd-oracle", sum)
	bin := filepath.Join(out, "cni-plugin")
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	tmp := out + ".tmp"
	_ = os.RemoveAll(tmp)
	cmd := exec.Command("go", "build", "-o", tmp+"/", "./cni-plugin", "./proxy-init")
	cmd.Dir = src
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building linkerd-cni in %s: %v\n%s", src, err, b)
	}
	if err := os.Rename(tmp, out); err != nil {
		return "", err
	}
	return bin, nil
}

// digest hashes every file of the reference module, so a changed source
// gets a new build.
func digest(dir string) (string, error) {
	h := sha256.New()
	var files []string
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			files = append(files, p)
		}
		return err
	})
	if err != nil {
		return "", err
	}
	sort.Strings(files)
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "%s %d\n", strings.TrimPrefix(f, dir), len(b))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

// Pod is one injected pod of the reference, in its CNI-mode form.
type Pod struct {
	File string
	Pod  *corev1.Pod
}

// Pods loads every pod of oracle/pods (a Deployment gives its template),
// without the linkerd-init init container: `linkerd inject` leaves it out
// when the CNI plugin is on, adding linkerd-network-validator instead.
func Pods(oracle string) ([]Pod, error) {
	files, err := filepath.Glob(filepath.Join(oracle, "pods", "*.yaml"))
	if err != nil || len(files) == 0 {
		return nil, fmt.Errorf("no pods in %s/pods: %v", oracle, err)
	}
	var out []Pod
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		pod, err := decode(b)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		var inits []corev1.Container
		for _, c := range pod.Spec.InitContainers {
			if c.Name != "linkerd-init" {
				inits = append(inits, c)
			}
		}
		pod.Spec.InitContainers = inits
		out = append(out, Pod{File: strings.TrimSuffix(filepath.Base(f), ".yaml"), Pod: pod})
	}
	return out, nil
}

func decode(b []byte) (*corev1.Pod, error) {
	var meta struct {
		Kind string `json:"kind"`
	}
	if err := yaml.Unmarshal(b, &meta); err != nil {
		return nil, err
	}
	switch meta.Kind {
	case "Pod":
		var p corev1.Pod
		return &p, yaml.Unmarshal(b, &p)
	case "Deployment":
		var d appsv1.Deployment
		if err := yaml.Unmarshal(b, &d); err != nil {
			return nil, err
		}
		p := &corev1.Pod{ObjectMeta: d.Spec.Template.ObjectMeta, Spec: d.Spec.Template.Spec}
		p.Namespace, p.Name = d.Namespace, d.Name
		return p, nil
	}
	return nil, fmt.Errorf("kind %q is neither Pod nor Deployment", meta.Kind)
}
