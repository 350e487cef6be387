package cluster

// flannel as the primary CNI of the multi-node cluster: flannel's own
// daemon (VXLAN backend, kube subnet manager) and its CNI meta plugin,
// built from the Go module proxy by `make flannel`, run as flannel's
// DaemonSet from kube-flannel.yml, in an image built here. Its init
// containers install the plugin and write 10-flannel.conflist on each node,
// as on any flannel cluster; the pods' traffic between nodes crosses
// flannel.1, the VXLAN device flanneld makes.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/yaml"

	"github.com/nftmesh/nftmesh/testkit/imagetest"
)

// The flannel the multi-node cluster runs; e2e/cluster/flannel/build.sh
// (make flannel) builds these versions.
const (
	flannelVersion     = "v0.28.10"
	flannelCNIVersion  = "v0.9.1" // containernetworking/plugins
	flannelImage       = "localhost/flannel:" + flannelVersion + "-e2e"
	flannelNS          = "kube-flannel"
	flannelConflist    = "10-flannel.conflist"
	flannelNetwork     = "10.244.0.0/16"
	flannelSubnetFile  = "/run/flannel/subnet.env"
	flannelVXLANDevice = "flannel.1"
)

// flannelCNIConf is kube-flannel.yml's cni-conf.json but for two keys:
// cniVersion 0.3.1 (the plugin of containernetworking/plugins v0.9.1
// speaks up to 0.4.0; flannel's manifests said 0.3.1 until the plugin
// moved) and the delegate's "ipMasq": false. Without it the bridge
// masquerades every packet leaving the node's subnet (flannel's plugin
// turns the bridge's masquerade on when flanneld's --ip-masq is off, and
// --ip-masq needs iptables in flannel's image), and the server would see
// the node's address instead of the client pod's.
const flannelCNIConf = `{
  "name": "cbr0",
  "cniVersion": "0.3.1",
  "plugins": [
    {
      "type": "flannel",
      "delegate": {
        "hairpinMode": true,
        "isDefaultGateway": true,
        "ipMasq": false
      }
    },
    {
      "type": "portmap",
      "capabilities": {
        "portMappings": true
      }
    }
  ]
}
`

// flannelState is what the cluster needs to run flannel and to give the
// first node its bridge config back.
type flannelState struct {
	mu      sync.Mutex
	on      bool   // the DaemonSet runs, the first node's bridge config is aside
	archive string // the image's docker-archive, for nodes joining later
	aside   string // where the first node's bridge config waits
}

// flannelDir is where `make flannel` puts the binaries.
func flannelDir() string {
	if d := os.Getenv("NFTMESH_FLANNEL_DIR"); d != "" {
		return d
	}
	return filepath.Join(repo, ".cache", "flannel")
}

// buildFlannelImage builds flannel's image from `make flannel`'s binaries,
// laid out as flannel's own image is (/opt/bin/flanneld,
// /opt/bin/install-conf) plus the CNI plugin at /flannel, where
// flannel-cni-plugin's image has it.
func buildFlannelImage(dir string) (string, error) {
	d := flannelDir()
	files := []imagetest.File{
		{Path: "/opt/bin/flanneld", Src: filepath.Join(d, "flanneld-"+flannelVersion)},
		{Path: "/opt/bin/install-conf", Src: filepath.Join(d, "flannel-install-conf-"+flannelVersion)},
		{Path: "/flannel", Src: filepath.Join(d, "flannel-cni-"+flannelCNIVersion)},
	}
	for _, f := range files {
		if _, err := os.Stat(f.Src); err != nil {
			return "", fmt.Errorf("flannel: %w (make flannel builds it)", err)
		}
	}
	out := filepath.Join(dir, "images", "flannel.tar")
	err := imagetest.Write(out, imagetest.Spec{Tag: flannelImage, Files: files, Entrypoint: []string{"/opt/bin/flanneld"}})
	if err != nil {
		return "", fmt.Errorf("building flannel's image: %w", err)
	}
	return out, nil
}

// flannelManifest is kube-flannel.yml of flannel v0.28.10 with the image
// built here, the node's CNI directories as its hostPaths, the node's
// interface named, and no iptables: --ip-masq off (flannel's default) and
// --iptables-forward-rules=false (the nodes' FORWARD chains accept), so its
// image needs no iptables binary. Its probes come sooner.
func (c *Cluster) flannelManifest() string {
	indent := func(s string) string {
		return "    " + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n    ")
	}
	r := strings.NewReplacer("@IMAGE@", flannelImage, "@BIN@", c.CNIBinDir, "@CONF@", c.CNIConfDir,
		"@CNICONF@", indent(flannelCNIConf), "@NETWORK@", flannelNetwork, "@NS@", flannelNS)
	return r.Replace(flannelManifestTemplate)
}

const flannelManifestTemplate = `apiVersion: v1
kind: Namespace
metadata:
  name: @NS@
  labels:
    k8s-app: flannel
    pod-security.kubernetes.io/enforce: privileged
---
kind: ClusterRole
apiVersion: rbac.authorization.k8s.io/v1
metadata:
  labels:
    k8s-app: flannel
  name: flannel
rules:
- apiGroups: [""]
  resources: [pods]
  verbs: [get]
- apiGroups: [""]
  resources: [nodes]
  verbs: [get, list, watch]
- apiGroups: [""]
  resources: [nodes/status]
  verbs: [patch]
---
kind: ClusterRoleBinding
apiVersion: rbac.authorization.k8s.io/v1
metadata:
  labels:
    k8s-app: flannel
  name: flannel
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: flannel
subjects:
- kind: ServiceAccount
  name: flannel
  namespace: @NS@
---
apiVersion: v1
kind: ServiceAccount
metadata:
  labels:
    k8s-app: flannel
  name: flannel
  namespace: @NS@
---
kind: ConfigMap
apiVersion: v1
metadata:
  name: kube-flannel-cfg
  namespace: @NS@
  labels:
    tier: node
    k8s-app: flannel
    app: flannel
data:
  cni-conf.json: |
@CNICONF@
  net-conf.json: |
    {
      "Network": "@NETWORK@",
      "EnableNFTables": false,
      "Backend": {
        "Type": "vxlan"
      }
    }
---
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: kube-flannel-ds
  namespace: @NS@
  labels:
    tier: node
    app: flannel
    k8s-app: flannel
spec:
  selector:
    matchLabels:
      app: flannel
  template:
    metadata:
      labels:
        tier: node
        app: flannel
    spec:
      hostNetwork: true
      priorityClassName: system-node-critical
      tolerations:
      - operator: Exists
        effect: NoSchedule
      serviceAccountName: flannel
      initContainers:
      - name: install-cni-plugin
        image: @IMAGE@
        imagePullPolicy: Never
        command: [/opt/bin/install-conf]
        args: [/flannel, /opt/cni/bin/flannel]
        volumeMounts:
        - name: cni-plugin
          mountPath: /opt/cni/bin
      - name: install-cni
        image: @IMAGE@
        imagePullPolicy: Never
        command: [/opt/bin/install-conf]
        args: [/etc/kube-flannel/cni-conf.json, /etc/cni/net.d/10-flannel.conflist]
        volumeMounts:
        - name: cni
          mountPath: /etc/cni/net.d
        - name: flannel-cfg
          mountPath: /etc/kube-flannel/
      containers:
      - name: kube-flannel
        image: @IMAGE@
        imagePullPolicy: Never
        command: [/opt/bin/flanneld]
        args:
        - --kube-subnet-mgr
        - --iface=nodeeth0
        - --iptables-forward-rules=false
        - --healthz-port=8081
        ports:
        - name: healthz
          containerPort: 8081
          protocol: TCP
        readinessProbe:
          httpGet:
            path: /readyz
            port: healthz
          periodSeconds: 1
        securityContext:
          privileged: false
          capabilities:
            add: ["NET_ADMIN", "NET_RAW"]
        env:
        - name: POD_NAME
          valueFrom:
            fieldRef:
              fieldPath: metadata.name
        - name: POD_NAMESPACE
          valueFrom:
            fieldRef:
              fieldPath: metadata.namespace
        - name: EVENT_QUEUE_DEPTH
          value: "5000"
        - name: CONT_WHEN_CACHE_NOT_READY
          value: "false"
        volumeMounts:
        - name: run
          mountPath: /run/flannel
        - name: flannel-cfg
          mountPath: /etc/kube-flannel/
      volumes:
      - name: run
        hostPath:
          path: /run/flannel
      - name: cni-plugin
        hostPath:
          path: @BIN@
      - name: cni
        hostPath:
          path: @CONF@
      - name: flannel-cfg
        configMap:
          name: kube-flannel-cfg
`

// startFlannel makes flannel the primary CNI of the cluster, once: the
// image imported, the chart uninstalled if it is in (its entry is in the
// bridge config that goes aside), the first node's pod CIDR set (the kube
// subnet manager leases it), the DaemonSet applied, and once flannel on the
// first node is ready and has written its config, the harness's bridge
// config moved out of the conf dir so that the runtime and nftmesh's agent
// take flannel's. The first node keeps its subnet and its cni0 bridge
// (flannel's delegate is a bridge named cni0 with the same gateway), so
// no pod of the pod network may be on it meanwhile: host-local's store
// changes with the network's name.
func (c *Cluster) startFlannel(ctx context.Context) error {
	c.flannel.mu.Lock()
	defer c.flannel.mu.Unlock()
	if c.flannel.on {
		return nil
	}
	t0 := time.Now()
	archive, err := buildFlannelImage(c.Dir)
	if err != nil {
		return err
	}
	if _, err := c.Ctr(ctx, "images", "import", archive); err != nil {
		return err
	}
	c.flannel.archive = archive
	c.logf("cluster: flannel's image built and imported %6.2fs", time.Since(t0).Seconds())
	if _, err := c.Client.AppsV1().DaemonSets(agentNS).Get(ctx, agentDaemonSet, metav1.GetOptions{}); err == nil {
		if err := uninstallChart(ctx, c); err != nil {
			return fmt.Errorf("uninstalling the chart before flannel: %w", err)
		}
	}
	if err := c.waitNoPodNetworkPods(ctx, nodeName); err != nil {
		return err
	}
	if err := c.setPodCIDR(ctx, nodeName, podCIDR); err != nil {
		return err
	}
	// A stopFlannel before (another test's) leaves the namespace to end
	// on its own; nothing can be created in it meanwhile.
	if err := c.poll(ctx, 60*time.Second, "namespace "+flannelNS+" not terminating", func() (bool, error) {
		ns, err := c.Client.CoreV1().Namespaces().Get(ctx, flannelNS, metav1.GetOptions{})
		return apierrors.IsNotFound(err) || (err == nil && ns.DeletionTimestamp == nil), nil
	}); err != nil {
		return err
	}
	manifest := c.path("kube-flannel.yml")
	if err := writeFile(manifest, c.flannelManifest(), 0o644); err != nil {
		return err
	}
	if _, err := c.Kubectl(ctx, "apply", "-f", manifest); err != nil {
		return err
	}
	c.flannel.on = true // from here stopFlannel has something to undo
	if err := c.waitFlannel(ctx, nodeName, "", filepath.Join(c.CNIConfDir, flannelConflist)); err != nil {
		return err
	}
	c.flannel.aside = c.path("cni", filepath.Base(c.PrimaryConflist)+".before-flannel")
	if err := os.Rename(c.PrimaryConflist, c.flannel.aside); err != nil {
		return fmt.Errorf("moving the bridge config aside: %w", err)
	}
	c.logf("cluster: flannel on %s, the bridge config aside %6.2fs", nodeName, time.Since(t0).Seconds())
	return nil
}

// stopFlannel undoes startFlannel on the first node (the other nodes go
// with RemoveNode): flannel's objects deleted and its pods gone, its
// config, plugin and VXLAN device removed, the bridge config back.
func (c *Cluster) stopFlannel(ctx context.Context) error {
	c.flannel.mu.Lock()
	defer c.flannel.mu.Unlock()
	if !c.flannel.on {
		return nil
	}
	t0 := time.Now()
	var errs []error
	// The namespace's own deletion goes on meanwhile; the first node's
	// flannel must be gone before its files are.
	if _, err := c.Kubectl(ctx, "delete", "--wait=false", "--ignore-not-found", "-f", c.path("kube-flannel.yml")); err != nil {
		errs = append(errs, err)
	}
	if err := c.poll(ctx, 60*time.Second, "flannel's pod on "+nodeName+" gone", func() (bool, error) {
		l, err := c.Client.CoreV1().Pods(flannelNS).List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("spec.nodeName", nodeName).String()})
		return err == nil && len(l.Items) == 0, nil
	}); err != nil {
		errs = append(errs, err)
	}
	for _, f := range []string{filepath.Join(c.CNIConfDir, flannelConflist), filepath.Join(c.CNIBinDir, "flannel")} {
		if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if c.flannel.aside != "" {
		if err := putBack(c.flannel.aside, c.PrimaryConflist); err != nil {
			errs = append(errs, fmt.Errorf("putting the bridge config back: %w", err))
		}
	}
	if out, err := c.inNodeNet(c.bin.ip, "link", "del", flannelVXLANDevice).CombinedOutput(); err != nil && !strings.Contains(string(out), "Cannot find device") {
		errs = append(errs, fmt.Errorf("ip link del %s: %w: %s", flannelVXLANDevice, err, out))
	}
	c.flannel.on = false
	if err := c.waitNodeReady(ctx); err != nil {
		errs = append(errs, err)
	}
	c.logf("cluster: flannel gone from %s, the bridge config back %6.2fs", nodeName, time.Since(t0).Seconds())
	return errors.Join(errs...)
}

// putBack writes the config at aside to path and removes aside. Not a
// rename: containerd 1.6 reloads its CNI config on a Write or Remove event
// in the conf dir but ignores a Create (it waits for the Write after it),
// and a file renamed in makes only a Create, so the node's pods would find
// "cni plugin not initialized" (as the README test, run after this one,
// did).
func putBack(aside, path string) error {
	b, err := os.ReadFile(aside)
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return err
	}
	return os.Remove(aside)
}

// flannelImages is flannel's image archive when flannel runs, for a node
// that joins.
func (c *Cluster) flannelImages() []string {
	c.flannel.mu.Lock()
	defer c.flannel.mu.Unlock()
	if c.flannel.archive == "" {
		return nil
	}
	return []string{c.flannel.archive}
}

// waitNoPodNetworkPods waits until node runs no pod on the pod network.
func (c *Cluster) waitNoPodNetworkPods(ctx context.Context, node string) error {
	var left []string
	err := c.poll(ctx, 90*time.Second, "no pod-network pods on "+node, func() (bool, error) {
		l, err := c.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("spec.nodeName", node).String()})
		if err != nil {
			return false, nil
		}
		left = left[:0]
		for _, p := range l.Items {
			if !p.Spec.HostNetwork && p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
				left = append(left, p.Namespace+"/"+p.Name)
			}
		}
		return len(left) == 0, nil
	})
	if err != nil {
		return fmt.Errorf("%w: %s", err, strings.Join(left, ", "))
	}
	return nil
}

// setPodCIDR gives node its pod CIDR, as the node IPAM controller (off in
// this cluster) would; it cannot change once set.
func (c *Cluster) setPodCIDR(ctx context.Context, node, cidr string) error {
	n, err := c.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return err
	}
	if n.Spec.PodCIDR == cidr {
		return nil
	}
	patch := fmt.Sprintf(`{"spec":{"podCIDR":%q,"podCIDRs":[%q]}}`, cidr, cidr)
	if _, err := c.Client.CoreV1().Nodes().Patch(ctx, node, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("setting the pod CIDR of %s: %w", node, err)
	}
	return nil
}

// flannelPodOn returns flannel's pod on node that is not being deleted.
func (c *Cluster) flannelPodOn(ctx context.Context, node string) (*corev1.Pod, error) {
	return c.livePodOn(ctx, flannelNS, "app=flannel", node, "flannel")
}

// waitFlannel waits until flannel's pod on node, other than the one named
// old, is Ready and conflist (the node's 10-flannel.conflist as the test
// reaches it) exists.
func (c *Cluster) waitFlannel(ctx context.Context, node, old, conflist string) error {
	why := ""
	err := c.poll(ctx, 90*time.Second, "flannel ready on "+node, func() (bool, error) {
		p, err := c.flannelPodOn(ctx, node)
		switch {
		case err != nil:
			why = err.Error()
			return false, nil
		case p.Name == old:
			why = "the old pod " + old + " is still there"
			return false, nil
		case !podReady(p):
			why = fmt.Sprintf("%s not ready: %s", p.Name, podState(p))
			return false, nil
		}
		if _, err := os.Stat(conflist); err != nil {
			why = err.Error()
			return false, nil
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("%w: %s", err, why)
	}
	return nil
}

// ipJSON runs `ip -j args...` in the network namespace of process pid and
// decodes its output into out.
func (c *Cluster) ipJSON(pid int, out any, args ...string) error {
	cmd := exec.Command(c.bin.nsenter, append([]string{fmt.Sprintf("--net=/proc/%d/ns/net", pid), "--", c.bin.ip, "-j"}, args...)...)
	b, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("ip -j %s in the namespace of %d: %w", strings.Join(args, " "), pid, err)
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("ip -j %s: %w: %.200s", strings.Join(args, " "), err, b)
	}
	return nil
}

// checkFlannelNode says what is wrong with flannel on node n of nodes:
// its subnet file must hold the node's pod CIDR (the kube subnet manager's
// lease), flannel.1 must be a VXLAN device, and the kernel must route
// every other node's pods through it (flannel's routes, none by hand).
func (c *Cluster) checkFlannelNode(n meshNode, nodes []meshNode) error {
	env, err := os.ReadFile(filepath.Join(n.root, flannelSubnetFile))
	if err != nil {
		return err
	}
	gw := n.cidr.Addr().Next()
	if want := fmt.Sprintf("FLANNEL_SUBNET=%s/%d\n", gw, n.cidr.Bits()); !strings.Contains(string(env), want) {
		return fmt.Errorf("%s has no %q:\n%s", flannelSubnetFile, strings.TrimSpace(want), env)
	}
	var links []struct {
		LinkInfo struct {
			Kind string `json:"info_kind"`
		} `json:"linkinfo"`
	}
	if err := c.ipJSON(n.pid, &links, "-d", "link", "show", "dev", flannelVXLANDevice); err != nil {
		return err
	}
	if len(links) != 1 || links[0].LinkInfo.Kind != "vxlan" {
		return fmt.Errorf("%s is not a VXLAN device: %+v", flannelVXLANDevice, links)
	}
	for _, m := range nodes {
		if m.name == n.name {
			continue
		}
		// An address of m's pod CIDR, not one of its pods: the route, not
		// a neighbour entry, is what is looked up.
		dst := m.cidr.Addr().Next().Next().Next().String()
		var routes []struct {
			Dev     string `json:"dev"`
			Gateway string `json:"gateway"`
		}
		if err := c.ipJSON(n.pid, &routes, "route", "get", dst); err != nil {
			return err
		}
		if len(routes) != 1 || routes[0].Dev != flannelVXLANDevice || routes[0].Gateway != m.cidr.Addr().String() {
			return fmt.Errorf("the route to %s's pods (%s) is %+v, want via %s dev %s", m.name, dst, routes, m.cidr.Addr(), flannelVXLANDevice)
		}
	}
	return nil
}

// insertedLines counts the agent's "inserted nftmesh-cni" lines in its log
// on node.
func (c *Cluster) insertedLines(ctx context.Context, node string) (int, error) {
	p, err := c.agentOn(ctx, node)
	if err != nil {
		return 0, err
	}
	raw, err := c.Client.CoreV1().Pods(agentNS).GetLogs(p.Name, &corev1.PodLogOptions{Container: "agent"}).DoRaw(ctx)
	if err != nil {
		return 0, err
	}
	return strings.Count(string(raw), "inserted nftmesh-cni into the CNI config"), nil
}

// restartFlannel deletes flannel's pod on n and waits for its replacement:
// its init container writes flannel's config again (without our entry, a
// new file renamed over the old), and nftmesh's agent must put its entry
// back, last, logging a new insert.
func (c *Cluster) restartFlannel(ctx context.Context, n meshNode) error {
	old, err := c.flannelPodOn(ctx, n.name)
	if err != nil {
		return err
	}
	if _, err := os.Stat(n.conflist); err != nil {
		return err
	}
	inserts, err := c.insertedLines(ctx, n.name)
	if err != nil {
		return err
	}
	t0 := time.Now()
	if err := c.Client.CoreV1().Pods(flannelNS).Delete(ctx, old.Name, metav1.DeleteOptions{}); err != nil {
		return err
	}
	if err := c.waitFlannel(ctx, n.name, old.Name, n.conflist); err != nil {
		return err
	}
	p, err := c.flannelPodOn(ctx, n.name)
	if err != nil {
		return err
	}
	for _, s := range p.Status.InitContainerStatuses {
		if s.State.Terminated == nil || s.State.Terminated.ExitCode != 0 {
			return fmt.Errorf("flannel's new pod %s: init container %s did not run to success: %+v", p.Name, s.Name, s.State)
		}
	}
	flannelReady := time.Since(t0)
	why := ""
	err = c.poll(ctx, 60*time.Second, "nftmesh-cni back in "+n.conflist, func() (bool, error) {
		st, err := os.Stat(n.conflist)
		if err != nil {
			why = err.Error()
			return false, nil
		}
		// Written since the delete (flannel's install-conf copies by
		// temp file and rename): not an inode check, since a freed inode
		// number comes back for the agent's own rewrite (CI met it).
		if !st.ModTime().After(t0) {
			why = "the config was not rewritten"
			return false, nil
		}
		if err := nftmeshLast(n.conflist); err != nil {
			why = err.Error()
			return false, nil
		}
		k, err := c.insertedLines(ctx, n.name)
		if err != nil || k <= inserts {
			why = fmt.Sprintf("the agent logged %d inserts, %d before the restart (%v)", k, inserts, err)
			return false, nil
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("%w: %s", err, why)
	}
	record("multinode: flannel's pod on %s deleted → replacement Ready (its config rewritten) %.2fs, nftmesh-cni re-inserted %.2fs", n.name, flannelReady.Seconds(), time.Since(t0).Seconds())
	return nil
}

// uninstallToFlannel deletes the mesh pods, uninstalls the chart and
// checks that every node has flannel's config back (flannelFileBack).
func (c *Cluster) uninstallToFlannel(ctx context.Context, t *testing.T, nodes []meshNode) {
	t.Helper()
	t0 := time.Now()
	c.deleteMesh(t)
	if err := uninstallChart(ctx, c); err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if err := flannelFileBack(n); err != nil {
			t.Errorf("node %s: %v", n.name, err)
		}
	}
	record("multinode: mesh pods deleted, helm uninstall, flannel's config back on %d nodes %.2fs", len(nodes), time.Since(t0).Seconds())
}

// flannelFileBack checks, after the chart's uninstall, that n's config is
// flannel's file byte for byte (what install-conf copied from the
// ConfigMap) and that nftmesh's binaries are gone while flannel's stays.
func flannelFileBack(n meshNode) error {
	got, err := os.ReadFile(n.conflist)
	if err != nil {
		return err
	}
	if !bytes.Equal(got, []byte(flannelCNIConf)) {
		return fmt.Errorf("%s after the uninstall is not flannel's file:\n%s\nwant:\n%s", n.conflist, got, flannelCNIConf)
	}
	for _, b := range []string{"nftmesh-cni", "nftmesh-cni-standalone"} {
		if _, err := os.Lstat(filepath.Join(n.binDir, b)); !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("%s still in %s after the uninstall (%v)", b, n.binDir, err)
		}
	}
	if _, err := os.Stat(filepath.Join(n.binDir, "flannel")); err != nil {
		return fmt.Errorf("flannel's plugin: %w", err)
	}
	return nil
}

// TestFlannelManifest checks, without a cluster, what the multi-node test
// relies on in flannelManifest: the ConfigMap's cni-conf.json is
// flannelCNIConf byte for byte (install-conf copies it, and the uninstall
// check compares each node's file with it) and valid JSON naming the
// flannel plugin, and the DaemonSet mounts the node's CNI directories.
func TestFlannelManifest(t *testing.T) {
	c := &Cluster{CNIBinDir: "/e2e/cni/bin", CNIConfDir: "/e2e/cni/net.d"}
	var cm *corev1.ConfigMap
	var ds *appsv1.DaemonSet
	for _, doc := range strings.Split(c.flannelManifest(), "\n---\n") {
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			t.Fatalf("%v:\n%s", err, doc)
		}
		switch meta.Kind {
		case "ConfigMap":
			cm = &corev1.ConfigMap{}
			if err := yaml.UnmarshalStrict([]byte(doc), cm); err != nil {
				t.Fatal(err)
			}
		case "DaemonSet":
			ds = &appsv1.DaemonSet{}
			if err := yaml.UnmarshalStrict([]byte(doc), ds); err != nil {
				t.Fatal(err)
			}
		}
	}
	if cm == nil || ds == nil {
		t.Fatalf("the manifest lacks its ConfigMap or DaemonSet")
	}
	if got := cm.Data["cni-conf.json"]; got != flannelCNIConf {
		t.Errorf("cni-conf.json is not flannelCNIConf byte for byte:\n%q\nwant:\n%q", got, flannelCNIConf)
	}
	var conf struct {
		CNIVersion string           `json:"cniVersion"`
		Plugins    []map[string]any `json:"plugins"`
	}
	if err := json.Unmarshal([]byte(flannelCNIConf), &conf); err != nil {
		t.Fatal(err)
	}
	if len(conf.Plugins) != 2 || conf.Plugins[0]["type"] != "flannel" || conf.CNIVersion != "0.3.1" {
		t.Errorf("flannelCNIConf: %+v", conf)
	}
	if !json.Valid([]byte(cm.Data["net-conf.json"])) || !strings.Contains(cm.Data["net-conf.json"], `"Network": "`+flannelNetwork+`"`) {
		t.Errorf("net-conf.json: %s", cm.Data["net-conf.json"])
	}
	paths := map[string]string{}
	for _, v := range ds.Spec.Template.Spec.Volumes {
		if v.HostPath != nil {
			paths[v.Name] = v.HostPath.Path
		}
	}
	want := map[string]string{"run": "/run/flannel", "cni-plugin": c.CNIBinDir, "cni": c.CNIConfDir}
	if fmt.Sprint(paths) != fmt.Sprint(want) {
		t.Errorf("hostPaths %v, want %v", paths, want)
	}
}
