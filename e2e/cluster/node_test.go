package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// workerNode is a node that joins the running cluster after Start: its own
// holder (network and mount namespace, private /run and /var), containerd,
// kubelet and kube-proxy, its own cgroup root, pod CIDR and CNI
// directories. The first node's namespace is its router: a veth pair
// links the two, the first node routes the worker's address over it, and
// the worker's default route points back, so every node reaches every
// other node and the apiserver without NAT. The pods' network is flannel's
// (flannel_test.go): its DaemonSet writes each node's CNI config and
// carries the pods' traffic between nodes over VXLAN; no route to a pod
// CIDR is made by hand.
//
// The chart's DaemonSet gives every node the same hostPath CNI
// directories; inside the worker's mount namespace the worker's own
// directories are bound over the first node's paths, so the agent on each
// node installs into its node's directories only.
type workerNode struct {
	c          *Cluster
	index      int    // 1, 2, …: 10.240.0.<2+index>, 10.244.<index>.0/24
	Name       string // nftmesh-e2e-<index+1>
	IP         string
	PodCIDR    string
	Dir        string // under the cluster's Dir
	CNIBinDir  string // the real directories, bound over the cluster's paths
	CNIConfDir string
	Conflist   string // the primary CNI's config: flannel's, once its DaemonSet wrote it
	cgroupName string
	link       string // the first node's end of the veth to this one

	mu        sync.Mutex
	holderPID int
	nsIDs     [2]string
	comps     []*component
	stopOnce  sync.Once
	stopErr   error
}

// workerClusterCIDR covers every node's pod CIDR, for the workers'
// kube-proxy.
const workerClusterCIDR = "10.244.0.0/16"

func newWorker(c *Cluster, index int) *workerNode {
	dir := c.path("nodes", fmt.Sprintf("n%d", index))
	return &workerNode{
		c:          c,
		index:      index,
		Name:       fmt.Sprintf("%s-%d", nodeName, index+1),
		IP:         fmt.Sprintf("10.240.0.%d", 2+index),
		PodCIDR:    fmt.Sprintf("10.244.%d.0/24", index),
		Dir:        dir,
		CNIBinDir:  filepath.Join(dir, "cni", "bin"),
		CNIConfDir: filepath.Join(dir, "cni", "net.d"),
		Conflist:   filepath.Join(dir, "cni", "net.d", flannelConflist),
		cgroupName: fmt.Sprintf("%s-n%d", c.cgroupName, index),
		link:       fmt.Sprintf("mnode%d", index),
	}
}

// AddNodes starts n more nodes at once, joined to the cluster's control
// plane, with the images Start imported and extraImages, and returns once
// each is Ready. The first call makes flannel the cluster's primary CNI
// (startFlannel): a node is Ready once flannel's pod on it wrote its CNI
// config. Whatever it started, RemoveNode or the cluster's Stop stops;
// stopFlannel gives the first node its bridge config back.
func (c *Cluster) AddNodes(ctx context.Context, n int, extraImages ...string) ([]*workerNode, error) {
	if err := c.startFlannel(ctx); err != nil {
		return nil, fmt.Errorf("flannel: %w", err)
	}
	extraImages = append(c.flannelImages(), extraImages...)
	c.mu.Lock()
	if c.stopped {
		c.mu.Unlock()
		return nil, errors.New("adding nodes: the cluster is being stopped")
	}
	var ws []*workerNode
	for i := 0; i < n; i++ {
		w := newWorker(c, len(c.workers)+1)
		c.workers = append(c.workers, w)
		ws = append(ws, w)
	}
	tars := append(append([]string(nil), c.imageTars...), extraImages...)
	c.mu.Unlock()
	errs := make(chan error, len(ws))
	for _, w := range ws {
		go func() { errs <- w.start(ctx, tars) }()
	}
	var all []error
	for range ws {
		if err := <-errs; err != nil {
			all = append(all, err)
		}
	}
	return ws, errors.Join(all...)
}

func (w *workerNode) start(ctx context.Context, images []string) error {
	for _, s := range []struct {
		name string
		f    func() error
	}{
		{"files and certificates", w.writeFiles},
		{"cgroups", func() error { return makeCgroupRoot(w.cgroupName) }},
		{"holder namespaces", w.startHolder},
		{"veth to the first node", w.connect},
		{"containerd", func() error {
			return w.spawn("containerd", w.c.bin.containerd, "--config", w.c.path("containerd.toml"))
		}},
		{"images imported", func() error { return w.importImages(ctx, images) }},
		{"kubelet, kube-proxy", w.startKubelet},
		{"pod CIDR, flannel, Ready", func() error { return w.waitReady(ctx) }},
	} {
		t0 := time.Now()
		if err := s.f(); err != nil {
			return fmt.Errorf("node %s: %s: %w", w.Name, s.name, err)
		}
		w.c.logf("node %s: %-28s %6.2fs", w.Name, s.name, time.Since(t0).Seconds())
	}
	return nil
}

// writeFiles lays out the node like the first one: its /var, CNI
// directories (without a config: flannel writes it), the kubelet's
// configuration, a client certificate for system:node:<name> (the Node
// authorizer's identity; the apiserver's token file cannot grow while it
// runs) and kubeconfigs pointing at the first node's address.
func (w *workerNode) writeFiles() error {
	c := w.c
	for _, d := range []string{"var/lib", "var/log", "var/tmp", "kubelet"} {
		if err := os.MkdirAll(filepath.Join(w.Dir, d), 0o755); err != nil {
			return fmt.Errorf("creating %s: %w", d, err)
		}
	}
	if err := os.Symlink("/run", filepath.Join(w.Dir, "var", "run")); err != nil {
		return fmt.Errorf("linking the node's /var/run: %w", err)
	}
	if err := os.MkdirAll(w.CNIBinDir, 0o755); err != nil {
		return fmt.Errorf("creating CNI bin dir: %w", err)
	}
	if err := linkRefPlugins(w.CNIBinDir); err != nil {
		return err
	}
	if err := os.MkdirAll(w.CNIConfDir, 0o755); err != nil {
		return fmt.Errorf("creating CNI conf dir: %w", err)
	}
	if err := writeFile(filepath.Join(w.Dir, "kubelet.yaml"), c.kubeletConfigIn(w.cgroupName), 0o644); err != nil {
		return err
	}
	cert, key, err := c.pki.issue("kubelet-"+w.Name, "system:node:"+w.Name, []string{"system:nodes"}, nil)
	if err != nil {
		return err
	}
	if err := w.writeKubeconfig("kubelet", &clientcmdapi.AuthInfo{ClientCertificate: cert, ClientKey: key}); err != nil {
		return err
	}
	return w.writeKubeconfig("kube-proxy", &clientcmdapi.AuthInfo{Token: c.tokens["kube-proxy"]})
}

func (w *workerNode) writeKubeconfig(name string, auth *clientcmdapi.AuthInfo) error {
	return writeKubeconfigFile(filepath.Join(w.Dir, "kubeconfig", name),
		&clientcmdapi.Cluster{Server: "https://" + nodeIP + ":6443", CertificateAuthority: w.c.pki.CA}, auth)
}

// startHolder starts the node's holder: private /run, the node's /var, the
// first node's shadowed sysctls, the node's CNI directories over the
// cluster's CNI paths, loopback up and forwarding on.
func (w *workerNode) startHolder() error {
	c := w.c
	ready := filepath.Join(w.Dir, "holder.ready")
	var sb strings.Builder
	sb.WriteString("set -eu\n")
	sb.WriteString("mount -n -t tmpfs -o mode=755 nftmesh-e2e-run /run\n")
	fmt.Fprintf(&sb, "mount -n --bind %s /var\n", filepath.Join(w.Dir, "var"))
	names := make([]string, 0, len(kubeletSysctls))
	for name := range kubeletSysctls {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		fmt.Fprintf(&sb, "mount -n --bind %s /proc/sys/%s\n", c.path("sysctl", strings.ReplaceAll(name, "/", ".")), name)
	}
	fmt.Fprintf(&sb, "mount -n --bind %s %s\n", w.CNIBinDir, c.CNIBinDir)
	fmt.Fprintf(&sb, "mount -n --bind %s %s\n", w.CNIConfDir, c.CNIConfDir)
	sb.WriteString("ip link set lo up\n")
	sb.WriteString("echo 1 > /proc/sys/net/ipv4/ip_forward\n")
	fmt.Fprintf(&sb, "touch %s\n", ready)
	sb.WriteString("exec sleep infinity\n")

	cmd := exec.Command(c.bin.unshare, "--mount", "--net", "--propagation", "slave", "--", "/bin/sh", "-c", sb.String())
	comp, err := c.spawn("holder-"+w.Name, cmd)
	if err != nil {
		return err
	}
	w.mu.Lock()
	w.comps = append(w.comps, comp)
	w.holderPID = cmd.Process.Pid
	w.mu.Unlock()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(ready); err == nil {
			break
		}
		select {
		case <-comp.done:
			return fmt.Errorf("holder exited: %v\n%s", comp.err, tail(comp.log, 20))
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("holder not ready after 10s\n%s", tail(comp.log, 20))
		}
	}
	var ids [2]string
	for i, ns := range []string{"mnt", "net"} {
		id, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/%s", cmd.Process.Pid, ns))
		if err != nil {
			return fmt.Errorf("reading holder's %s namespace: %w", ns, err)
		}
		ids[i] = id
	}
	if ids[0] == selfNS("mnt") || ids[1] == selfNS("net") || ids[0] == c.nsIDs[0] || ids[1] == c.nsIDs[1] {
		return errors.New("holder shares the test's or the first node's namespaces")
	}
	w.mu.Lock()
	w.nsIDs = ids
	w.mu.Unlock()
	return nil
}

// connect links the node to the first node's namespace: a veth pair
// (nodeeth0 in the node), the node's address as a /32, the first node as
// its default gateway, and in the first node a route to the node's
// address (the pod CIDRs are flannel's to route). Nothing is added to the
// machine's namespace.
func (w *workerNode) connect() error {
	first, self := w.c.holderPID, w.pid()
	for _, step := range []struct {
		pid  int
		args string
	}{
		{first, fmt.Sprintf("link add %s type veth peer name nodeeth0 netns %d", w.link, self)},
		{first, fmt.Sprintf("link set %s up", w.link)},
		{self, fmt.Sprintf("addr add %s/32 dev nodeeth0", w.IP)},
		{self, "link set nodeeth0 up"},
		{self, fmt.Sprintf("route add %s/32 dev nodeeth0", nodeIP)},
		{self, fmt.Sprintf("route add default via %s dev nodeeth0", nodeIP)},
		{first, fmt.Sprintf("route add %s/32 dev %s", w.IP, w.link)},
	} {
		if out, err := w.ipIn(step.pid, strings.Fields(step.args)...); err != nil {
			return fmt.Errorf("ip %s: %w\n%s", step.args, err, out)
		}
	}
	return nil
}

// ipIn runs ip in the network namespace of process pid.
func (w *workerNode) ipIn(pid int, args ...string) (string, error) {
	out, err := exec.Command(w.c.bin.nsenter, append([]string{fmt.Sprintf("--net=/proc/%d/ns/net", pid), "--", w.c.bin.ip}, args...)...).CombinedOutput()
	return string(out), err
}

func (w *workerNode) pid() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.holderPID
}

// in is a command run inside the node's mount and network namespaces.
func (w *workerNode) in(name string, args ...string) *exec.Cmd {
	pid := w.pid()
	return exec.Command(w.c.bin.nsenter, append([]string{
		fmt.Sprintf("--mount=/proc/%d/ns/mnt", pid),
		fmt.Sprintf("--net=/proc/%d/ns/net", pid),
		"--", name}, args...)...)
}

// spawn starts a component of the node, logged as <name>-<node>.
func (w *workerNode) spawn(name, bin string, args ...string) error {
	comp, err := w.c.spawn(name+"-"+w.Name, w.in(bin, args...))
	if err != nil {
		return err
	}
	w.mu.Lock()
	w.comps = append(w.comps, comp)
	w.mu.Unlock()
	return nil
}

// NodePath is a path inside the node's mount namespace, as the test
// process reaches it.
func (w *workerNode) NodePath(p string) string {
	return fmt.Sprintf("/proc/%d/root%s", w.pid(), p)
}

func (w *workerNode) importImages(ctx context.Context, tars []string) error {
	sock := w.NodePath("/run/containerd/containerd.sock")
	if err := w.c.poll(ctx, 30*time.Second, "containerd socket of "+w.Name, func() (bool, error) {
		_, err := os.Stat(sock)
		return err == nil, nil
	}); err != nil {
		return err
	}
	for _, tar := range tars {
		args := []string{"--address", "/run/containerd/containerd.sock", "-n", "k8s.io", "images", "import", "--all-platforms", tar}
		if out, err := w.in(w.c.bin.ctr, args...).CombinedOutput(); err != nil {
			return fmt.Errorf("ctr images import %s: %w\n%s", tar, err, out)
		}
	}
	return nil
}

func (w *workerNode) startKubelet() error {
	c := w.c
	args := []string{"--config", filepath.Join(w.Dir, "kubelet.yaml"),
		"--kubeconfig", filepath.Join(w.Dir, "kubeconfig", "kubelet"),
		"--root-dir", filepath.Join(w.Dir, "kubelet"),
		"--hostname-override", w.Name,
		"--node-ip", w.IP}
	if v := os.Getenv("NFTMESH_E2E_KUBELET_V"); v != "" {
		args = append(args, "--v="+v)
	}
	if err := w.spawn("kubelet", c.bin.kubelet, args...); err != nil {
		return err
	}
	return w.spawn("kube-proxy", c.bin.kubeProxy,
		"--kubeconfig", filepath.Join(w.Dir, "kubeconfig", "kube-proxy"),
		"--hostname-override", w.Name,
		"--proxy-mode", "iptables",
		"--cluster-cidr", workerClusterCIDR,
		"--conntrack-max-per-core=0",
		"--conntrack-tcp-timeout-established=0",
		"--conntrack-tcp-timeout-close-wait=0",
		"--oom-score-adj=0",
		"--metrics-bind-address", "127.0.0.1:10249",
		"--healthz-bind-address", "127.0.0.1:10256")
}

// waitReady sets the node's pod CIDR as soon as it registered, as the node
// IPAM controller (off in this cluster) would (flannel's kube subnet
// manager leases it), and waits for it to be Ready: the runtime's network
// is ready once flannel's pod on the node wrote its CNI config.
func (w *workerNode) waitReady(ctx context.Context) error {
	c := w.c
	if err := c.poll(ctx, 60*time.Second, w.Name+" registered", func() (bool, error) {
		_, err := c.Client.CoreV1().Nodes().Get(ctx, w.Name, metav1.GetOptions{})
		return err == nil, nil
	}); err != nil {
		return err
	}
	if err := c.setPodCIDR(ctx, w.Name, w.PodCIDR); err != nil {
		return err
	}
	return c.poll(ctx, 120*time.Second, w.Name+" Ready", func() (bool, error) {
		n, err := c.Client.CoreV1().Nodes().Get(ctx, w.Name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, cond := range n.Status.Conditions {
			if cond.Type == corev1.NodeReady {
				return cond.Status == corev1.ConditionTrue, nil
			}
		}
		return false, nil
	})
}

// RemoveNode takes the node out of the cluster as an operator would: its
// pods deleted but those of DaemonSets (kubectl drain
// --ignore-daemonsets; the DaemonSet controller would start them again),
// their CNI DEL run while the node still runs, its processes stopped,
// nothing of it left on the machine, its Node object deleted, and then
// the DaemonSets' pods bound to it deleted as the pod garbage collector
// would (no kubelet is left to confirm their end).
func (c *Cluster) RemoveNode(ctx context.Context, w *workerNode) error {
	var errs []error
	pods := func(daemons bool) []corev1.Pod {
		l, err := c.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("spec.nodeName", w.Name).String()})
		if err != nil {
			return nil
		}
		var out []corev1.Pod
		for _, p := range l.Items {
			if daemons || !daemonSetPod(&p) {
				out = append(out, p)
			}
		}
		return out
	}
	del := func(p corev1.Pod, grace int64) {
		if err := c.Client.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &grace}); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, err)
		}
	}
	for _, p := range pods(false) {
		del(p, 1)
	}
	if err := c.poll(ctx, 60*time.Second, "pods on "+w.Name+" gone", func() (bool, error) { return len(pods(false)) == 0, nil }); err != nil {
		errs = append(errs, err)
	}
	if err := w.stop(); err != nil {
		errs = append(errs, err)
	}
	if err := c.Client.CoreV1().Nodes().Delete(ctx, w.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		errs = append(errs, fmt.Errorf("deleting node %s: %w", w.Name, err))
	}
	for _, p := range pods(true) {
		del(p, 0)
	}
	return errors.Join(errs...)
}

// removeNodes takes the nodes out of the cluster side by side
// (RemoveNode each), failing t for each that did not go cleanly.
func (c *Cluster) removeNodes(t *testing.T, workers []*workerNode) {
	var wg sync.WaitGroup
	for _, w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := c.RemoveNode(context.Background(), w); err != nil {
				t.Errorf("removing node %s: %v", w.Name, err)
			}
		}()
	}
	wg.Wait()
}

// daemonSetPod says whether a DaemonSet controls p.
func daemonSetPod(p *corev1.Pod) bool {
	ref := metav1.GetControllerOf(p)
	return ref != nil && ref.Kind == "DaemonSet"
}

// stop stops the node like the cluster's Stop stops the first one and
// checks that nothing of it is left. Safe to call more than once.
func (w *workerNode) stop() error {
	w.stopOnce.Do(func() { w.stopErr = w.doStop() })
	return w.stopErr
}

func (w *workerNode) doStop() error {
	t0 := time.Now()
	w.mu.Lock()
	comps := append([]*component(nil), w.comps...)
	holderPID, nsIDs := w.holderPID, w.nsIDs
	w.mu.Unlock()
	// Out of the cluster's list before any of them is stopped: a wait
	// elsewhere (another node's RemoveNode, run beside this one) checks
	// the list for components that died, and found this node's kubelet
	// stopped here ("waiting for pods on nftmesh-e2e-2 gone:
	// kubelet-nftmesh-e2e-3 exited", a cold CI run's conformance cleanup).
	w.c.forget(comps)
	byRole := map[string]*component{}
	for _, comp := range comps {
		byRole[strings.TrimSuffix(comp.name, "-"+w.Name)] = comp
	}
	stop := func(roles ...string) {
		var wg sync.WaitGroup
		for _, r := range roles {
			if comp := byRole[r]; comp != nil {
				wg.Add(1)
				go func() { defer wg.Done(); terminate(comp, 10*time.Second) }()
			}
		}
		wg.Wait()
	}
	stop("kubelet", "kube-proxy")
	killCgroupProcs(w.cgroupName)
	stop("containerd")
	// The shims and anything they left, then the holder.
	if holderPID > 0 {
		for i := 0; i < 50; i++ {
			pids := nsProcs(holderPID, nsIDs)
			if len(pids) == 0 {
				break
			}
			for _, pid := range pids {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	// Pin the node's namespaces across the holder's exit: an ID names a
	// namespace only while it lives, and the kernel gives a freed one's inode
	// number to the next namespace anyone creates (another test's netns, an
	// `nsenter … nft` in it), which the process check below would then
	// report as the node's. Released before the wait for the veth, which
	// needs the namespace gone.
	pins := pinNamespaces(holderPID)
	stop("holder")
	var errs []error
	if err := removeCgroups(w.cgroupName); err != nil {
		errs = append(errs, err)
	}
	if err := w.leftovers(holderPID, nsIDs, pins); err != nil {
		errs = append(errs, err)
	}
	w.c.logf("node %s: stopped %6.2fs", w.Name, time.Since(t0).Seconds())
	return errors.Join(errs...)
}

// pinNamespaces opens the holder's mount and network namespaces, which
// keeps them (and so their IDs) alive until the files are closed.
func pinNamespaces(holderPID int) []*os.File {
	var pins []*os.File
	if holderPID <= 0 {
		return nil
	}
	for _, ns := range []string{"mnt", "net"} {
		if f, err := os.Open(fmt.Sprintf("/proc/%d/ns/%s", holderPID, ns)); err == nil {
			pins = append(pins, f)
		}
	}
	return pins
}

// leftovers reports anything of the node still on the machine: processes
// in its namespaces, its cgroups, mounts naming its directories or its
// network namespace, and its veth end in the first node's namespace (which
// goes with the node's namespace). pins hold the namespaces so that their
// IDs stay theirs while processes and mounts are matched; they are closed
// before the veth check.
func (w *workerNode) leftovers(holderPID int, nsIDs [2]string, pins []*os.File) error {
	var found []string
	if holderPID > 0 {
		for _, pid := range nsProcs(holderPID, nsIDs) {
			cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
			found = append(found, fmt.Sprintf("process %d (%s)", pid, strings.ReplaceAll(string(cmdline), "\x00", " ")))
		}
	}
	for _, d := range cgroupDirs(w.cgroupName) {
		found = append(found, "cgroup "+d)
	}
	if mi, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
		netInode := strings.TrimSuffix(strings.TrimPrefix(nsIDs[1], "net:["), "]")
		for _, line := range strings.Split(string(mi), "\n") {
			if strings.Contains(line, w.Dir) || strings.Contains(line, w.cgroupName) ||
				(netInode != "" && strings.Contains(line, "net:["+netInode+"]")) {
				found = append(found, "mount "+line)
			}
		}
	}
	for _, f := range pins {
		f.Close()
	}
	// The kernel frees a network namespace (and its veth pair) a little
	// after its last process exits.
	if first := w.c.holderPID; first > 0 && w.c.holder != nil {
		var out string
		gone := false
		for i := 0; i < 50 && !gone; i++ {
			var err error
			out, err = w.ipIn(first, "-o", "link", "show", "dev", w.link)
			gone = err != nil && strings.Contains(out, "does not exist")
			if !gone {
				time.Sleep(100 * time.Millisecond)
			}
		}
		if !gone && !holderDone(w.c.holder) {
			found = append(found, "link in the first node: "+strings.TrimSpace(out))
		}
	}
	if len(found) > 0 {
		return fmt.Errorf("node %s left on the machine: %s", w.Name, strings.Join(found, "; "))
	}
	return nil
}

func holderDone(comp *component) bool {
	select {
	case <-comp.done:
		return true
	default:
		return false
	}
}

// forget drops components from the cluster's list, so a node
// taken out is not reported as a component that died.
func (c *Cluster) forget(comps []*component) {
	c.mu.Lock()
	defer c.mu.Unlock()
	drop := map[*component]bool{}
	for _, comp := range comps {
		drop[comp] = true
	}
	kept := c.components[:0]
	for _, comp := range c.components {
		if !drop[comp] {
			kept = append(kept, comp)
		}
	}
	c.components = kept
}
