// Command multusshim is the cluster e2e's stand-in for Multus's thin
// plugin, which the Go module proxy does not serve: the runtime's config
// names it, and for each call it runs the cluster network (the node's
// primary conflist) on the pod's eth0, then, for a pod whose
// k8s.v1.cni.cncf.io/networks annotation names NetworkAttachmentDefinitions,
// reads each from the API server and runs its network on net1, net2, ...:
// the definition's spec.config, or when it has none the file in confDir
// whose "name" is the definition's name (what nftmesh's agent writes in
// standalone mode, as Istio's does). A delegate's failure fails the call,
// as in Multus. DEL runs the delegates it ran on ADD (kept in cacheDir), then
// the cluster network. It is a test tool: no CHECK, no network-status
// annotation, no default-network override.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// networksAnnotation is the pod annotation Multus reads.
const networksAnnotation = "k8s.v1.cni.cncf.io/networks"

type conf struct {
	types.PluginConf
	Kubeconfig     string `json:"kubeconfig"`
	ClusterNetwork string `json:"clusterNetwork"` // the primary conflist's path
	ConfDir        string `json:"confDir"`        // where configs of definitions without spec.config are
	BinDir         string `json:"binDir"`
	CacheDir       string `json:"cacheDir"`
}

// delegate is one attachment ADD ran, kept for DEL.
type delegate struct {
	IfName string          `json:"ifName"`
	Conf   json.RawMessage `json:"conf"`
}

func main() {
	skel.PluginMainFuncs(skel.CNIFuncs{Add: add, Del: del, Check: func(*skel.CmdArgs) error { return nil }},
		version.All, "nftmesh e2e Multus stand-in")
}

func load(args *skel.CmdArgs) (*conf, *libcni.CNIConfig, error) {
	var c conf
	if err := json.Unmarshal(args.StdinData, &c); err != nil {
		return nil, nil, fmt.Errorf("parsing the config: %w", err)
	}
	if c.ClusterNetwork == "" || c.BinDir == "" || c.CacheDir == "" || c.Kubeconfig == "" || c.ConfDir == "" {
		return nil, nil, errors.New("the config needs clusterNetwork, binDir, cacheDir, kubeconfig and confDir")
	}
	return &c, libcni.NewCNIConfig([]string{c.BinDir}, nil), nil
}

func runtimeConf(args *skel.CmdArgs, ifName string) *libcni.RuntimeConf {
	rt := &libcni.RuntimeConf{ContainerID: args.ContainerID, NetNS: args.Netns, IfName: ifName}
	for _, kv := range strings.Split(args.Args, ";") {
		if k, v, ok := strings.Cut(kv, "="); ok {
			rt.Args = append(rt.Args, [2]string{k, v})
		}
	}
	return rt
}

func arg(rt *libcni.RuntimeConf, name string) string {
	for _, kv := range rt.Args {
		if kv[0] == name {
			return kv[1]
		}
	}
	return ""
}

// netList parses a config or a conflist.
func netList(b []byte) (*libcni.NetworkConfigList, error) {
	var probe struct {
		Plugins json.RawMessage `json:"plugins"`
	}
	if err := json.Unmarshal(b, &probe); err != nil {
		return nil, err
	}
	if probe.Plugins != nil {
		return libcni.NetworkConfFromBytes(b)
	}
	pc, err := libcni.NetworkPluginConfFromBytes(b)
	if err != nil {
		return nil, err
	}
	return &libcni.NetworkConfigList{Name: pc.Network.Name, CNIVersion: pc.Network.CNIVersion,
		Plugins: []*libcni.PluginConfig{pc}, Bytes: b}, nil
}

func add(args *skel.CmdArgs) error {
	c, cni, err := load(args)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	primary, err := libcni.NetworkConfFromFile(c.ClusterNetwork)
	if err != nil {
		return fmt.Errorf("loading the cluster network %s: %w", c.ClusterNetwork, err)
	}
	rt := runtimeConf(args, args.IfName)
	res, err := cni.AddNetworkList(ctx, primary, rt)
	if err != nil {
		return fmt.Errorf("cluster network %s: %w", primary.Name, err)
	}
	delegates, err := attachments(ctx, c, rt)
	if err != nil {
		return err
	}
	var ran []delegate
	for i, b := range delegates {
		l, err := netList(b)
		if err != nil {
			return fmt.Errorf("attachment %d: %w", i+1, err)
		}
		d := delegate{IfName: fmt.Sprintf("net%d", i+1), Conf: b}
		ran = append(ran, d)
		if err := saveDelegates(c, args.ContainerID, ran); err != nil {
			return err
		}
		if _, err := cni.AddNetworkList(ctx, l, runtimeConf(args, d.IfName)); err != nil {
			return fmt.Errorf("attachment %s on %s: %w", l.Name, d.IfName, err)
		}
	}
	return types.PrintResult(res, c.CNIVersion)
}

// attachments returns the configs of the networks the pod's annotation
// names, in order.
func attachments(ctx context.Context, c *conf, rt *libcni.RuntimeConf) ([][]byte, error) {
	ns, name := arg(rt, "K8S_POD_NAMESPACE"), arg(rt, "K8S_POD_NAME")
	if ns == "" || name == "" {
		return nil, nil
	}
	rc, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		return nil, err
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	pod, err := cs.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("getting pod %s/%s: %w", ns, name, err)
	}
	refs, err := parseNetworks(pod.Annotations[networksAnnotation], ns)
	if err != nil {
		return nil, fmt.Errorf("pod %s/%s: %s: %w", ns, name, networksAnnotation, err)
	}
	var out [][]byte
	for _, r := range refs {
		raw, err := cs.Discovery().RESTClient().Get().
			AbsPath("/apis/k8s.cni.cncf.io/v1/namespaces", r[0], "network-attachment-definitions", r[1]).DoRaw(ctx)
		if err != nil {
			return nil, fmt.Errorf("getting network-attachment-definition %s/%s: %w", r[0], r[1], err)
		}
		var nad struct {
			Spec struct {
				Config string `json:"config"`
			} `json:"spec"`
		}
		if err := json.Unmarshal(raw, &nad); err != nil {
			return nil, err
		}
		if nad.Spec.Config != "" {
			out = append(out, []byte(nad.Spec.Config))
			continue
		}
		b, err := confByName(c.ConfDir, r[1])
		if err != nil {
			return nil, fmt.Errorf("network-attachment-definition %s/%s: %w", r[0], r[1], err)
		}
		out = append(out, b)
	}
	return out, nil
}

// parseNetworks reads the annotation's comma-separated [namespace/]name
// list or its JSON form; a name without a namespace is in the pod's.
func parseNetworks(v, podNS string) ([][2]string, error) {
	v = strings.TrimSpace(v)
	if v == "" {
		return nil, nil
	}
	var out [][2]string
	if strings.HasPrefix(v, "[") {
		var sel []struct{ Name, Namespace string }
		if err := json.Unmarshal([]byte(v), &sel); err != nil {
			return nil, err
		}
		for _, s := range sel {
			if s.Namespace == "" {
				s.Namespace = podNS
			}
			out = append(out, [2]string{s.Namespace, s.Name})
		}
		return out, nil
	}
	for _, e := range strings.Split(v, ",") {
		e, _, _ = strings.Cut(strings.TrimSpace(e), "@")
		ns, name, ok := strings.Cut(e, "/")
		if !ok {
			ns, name = podNS, e
		}
		if ns == "" || name == "" {
			return nil, fmt.Errorf("bad entry %q", e)
		}
		out = append(out, [2]string{ns, name})
	}
	return out, nil
}

// confByName finds the config in dir whose network name is name.
func confByName(dir, name string) ([]byte, error) {
	files, err := libcni.ConfFiles(dir, []string{".conf", ".conflist", ".json"})
	if err != nil {
		return nil, err
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		var n struct {
			Name string `json:"name"`
		}
		if json.Unmarshal(b, &n) == nil && n.Name == name {
			return b, nil
		}
	}
	return nil, fmt.Errorf("no config named %q in %s", name, dir)
}

func cachePath(c *conf, id string) string { return filepath.Join(c.CacheDir, id+".json") }

func saveDelegates(c *conf, id string, ds []delegate) error {
	b, err := json.Marshal(ds)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(c.CacheDir, 0o700); err != nil {
		return err
	}
	return os.WriteFile(cachePath(c, id), b, 0o600)
}

func del(args *skel.CmdArgs) error {
	c, cni, err := load(args)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var errs []error
	b, err := os.ReadFile(cachePath(c, args.ContainerID))
	switch {
	case err == nil:
		var ds []delegate
		if err := json.Unmarshal(b, &ds); err != nil {
			errs = append(errs, err)
		}
		for i := len(ds) - 1; i >= 0; i-- {
			l, err := netList(ds[i].Conf)
			if err == nil {
				err = cni.DelNetworkList(ctx, l, runtimeConf(args, ds[i].IfName))
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("attachment on %s: %w", ds[i].IfName, err))
			}
		}
	case !errors.Is(err, fs.ErrNotExist):
		errs = append(errs, err)
	}
	primary, err := libcni.NetworkConfFromFile(c.ClusterNetwork)
	if err == nil {
		err = cni.DelNetworkList(ctx, primary, runtimeConf(args, args.IfName))
	}
	if err != nil {
		errs = append(errs, fmt.Errorf("cluster network: %w", err))
	}
	if len(errs) == 0 {
		_ = os.Remove(cachePath(c, args.ContainerID))
	}
	return errors.Join(errs...)
}
