package cluster

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/nftmesh/nftmesh/testkit/spawn"
)

// The node's addresses, all inside the holder's network namespace.
const (
	nodeName     = "nftmesh-e2e"
	nodeIP       = "10.240.0.2"
	podCIDR      = "10.244.0.0/24"
	serviceCIDR  = "10.96.0.0/24"
	apiServiceIP = "10.96.0.1"
	apiServer    = "https://127.0.0.1:6443" // as seen inside the node's namespace
	pauseImage   = "localhost/pause:e2e"
	refPluginDir = "/usr/lib/cni" // Debian's containernetworking-plugins
)

// underlaySwitch is the part of the holder's script that makes this node,
// the other nodes' only link (a veth to each, mnode<N>) and so their
// router, forward what passes between two other nodes as a switch would:
// untracked. Tracked, this node's kube-proxy saw one half of a connection
// to another node's NodePort (the client's packets came through here, the
// replies went back between the two nodes over flannel's VXLAN) and
// dropped the rest as conntrack INVALID (its KUBE-FORWARD rule): the
// handshake completed, no data came back ("service is not reachable ...
// on endpoint 10.240.0.3:<nodePort>", the flannel rig's NodePort
// conformance failures, in the noharm run too). Test scaffolding only:
// the holder's namespace is the rig's own.
var underlaySwitch = fmt.Sprintf(`nft -f - <<'EOF'
table ip nftmesh-e2e-underlay {
	chain transit {
		type filter hook prerouting priority raw; policy accept;
		iifname "mnode*" ip daddr %s/24 ip daddr != %s notrack
	}
}
EOF
`, strings.TrimSuffix(nodeIP, ".2")+".0", nodeIP)

// kubeletSysctls are the global kernel sysctls kubelet sets to these values
// when they differ. Inside the holder's mount namespace each is shadowed by a
// file already holding the value, so kubelet reads "already set" and the
// machine's own values stay untouched.
var kubeletSysctls = map[string]string{
	"vm/overcommit_memory":      "1",
	"vm/panic_on_oom":           "0",
	"kernel/panic":              "10",
	"kernel/panic_on_oops":      "1",
	"kernel/keys/root_maxkeys":  "1000000",
	"kernel/keys/root_maxbytes": "25000000",
}

// machineSysctls are the global sysctls a node's components could write:
// kubelet's above and kube-proxy's conntrack ones. The test reads them
// before and after to prove the machine's values were left alone.
var machineSysctls = []string{
	"vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
	"kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes",
	"net/netfilter/nf_conntrack_max", "net/nf_conntrack_max",
	"net/netfilter/nf_conntrack_tcp_timeout_established", "net/netfilter/nf_conntrack_tcp_timeout_close_wait",
}

// binaries are the programs the cluster runs, found before anything starts.
type binaries struct {
	apiserver, controllerManager, scheduler, kubelet, kubeProxy, kubectl string
	helm, etcd, containerd, ctr, nsenter, unshare, ip                    string
}

// findBinaries locates every program; the error lists all that are missing
// and how to get them.
func findBinaries(repo string) (binaries, error) {
	var b binaries
	var missing []string
	kubeDir := os.Getenv("KUBE_BIN_DIR")
	if kubeDir == "" {
		kubeDir = filepath.Join(repo, ".cache")
	}
	kube := func(dst *string, name string) {
		p := filepath.Join(kubeDir, name)
		if st, err := os.Stat(p); err != nil || st.Mode()&0o111 == 0 {
			missing = append(missing, fmt.Sprintf("%s (make kube-binaries builds it into %s)", name, kubeDir))
			return
		}
		*dst = p
	}
	kube(&b.apiserver, "kube-apiserver")
	kube(&b.controllerManager, "kube-controller-manager")
	kube(&b.scheduler, "kube-scheduler")
	kube(&b.kubelet, "kubelet")
	kube(&b.kubeProxy, "kube-proxy")
	kube(&b.kubectl, "kubectl")

	look := func(dst *string, name, hint string) {
		p, err := exec.LookPath(name)
		if err != nil {
			missing = append(missing, fmt.Sprintf("%s (%s)", name, hint))
			return
		}
		*dst = p
	}
	if h := os.Getenv("HELM_BIN"); h != "" {
		if _, err := os.Stat(h); err == nil {
			b.helm = h
		}
	}
	if b.helm == "" {
		look(&b.helm, "helm", "make helm")
	}
	look(&b.etcd, "etcd", "apt-get install etcd-server")
	look(&b.containerd, "containerd", "apt-get install containerd")
	look(&b.ctr, "ctr", "apt-get install containerd")
	var shim, runc string
	look(&shim, "containerd-shim-runc-v2", "apt-get install containerd")
	look(&runc, "runc", "apt-get install runc")
	look(&b.nsenter, "nsenter", "apt-get install util-linux")
	look(&b.unshare, "unshare", "apt-get install util-linux")
	look(&b.ip, "ip", "apt-get install iproute2")
	for _, p := range []string{"bridge", "host-local", "portmap", "loopback"} {
		if _, err := os.Stat(filepath.Join(refPluginDir, p)); err != nil {
			missing = append(missing, fmt.Sprintf("%s/%s (apt-get install containernetworking-plugins)", refPluginDir, p))
		}
	}
	if len(missing) > 0 {
		return b, fmt.Errorf("missing: %s", strings.Join(missing, ", "))
	}
	return b, nil
}

// component is one process started into the holder's namespaces.
type component struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{} // closed when the process has exited
	err  error         // its exit status, valid after done
}

// Cluster is a running single-node cluster.
type Cluster struct {
	Dir    string // state, configs and logs; bind-mounted parts live under var/
	Client *kubernetes.Clientset
	Rest   *rest.Config

	bin        binaries
	pki        *pki
	holder     *component
	holderPID  int
	netNS      *os.File
	nsIDs      [2]string // "mnt:[…]", "net:[…]" of the holder
	cgroupName string
	dialer     *netnsDialer
	tokens     map[string]string
	logf       func(string, ...any)

	mu         sync.Mutex
	components []*component
	workers    []*workerNode // nodes joined after Start (AddNodes), stopped first
	imageTars  []string      // the archives Start imported, for nodes joining later
	stopped    bool
	stopOnce   sync.Once
	stopErr    error

	standinMu       sync.Mutex
	standinImported bool // the stand-in image is in containerd

	flannel flannelState // the multi-node cluster's primary CNI (flannel_test.go)

	// Node-side directories, same path in both mount namespaces.
	CNIBinDir, CNIConfDir string
	AdminKubeconfig       string
	PrimaryConflist       string // the primary CNI's config, as written at start
}

// New prepares a cluster with its state in dir; nothing runs yet. logf
// gets the timing of each step of Start and Stop.
func New(bin binaries, dir string, logf func(string, ...any)) *Cluster {
	return &Cluster{
		Dir:        dir,
		bin:        bin,
		cgroupName: "nftmesh-e2e-" + randomHex(4),
		tokens:     map[string]string{},
		logf:       logf,
		CNIBinDir:  filepath.Join(dir, "cni", "bin"),
		CNIConfDir: filepath.Join(dir, "cni", "net.d"),
	}
}

// Start brings the node up step by step and returns once the node is Ready
// and ServiceAccount default/default exists. Whatever it started, Stop
// stops, also when Start failed or is still running.
func (c *Cluster) Start(ctx context.Context, images []string) error {
	c.mu.Lock()
	c.imageTars = append([]string(nil), images...)
	c.mu.Unlock()
	step := func(name string, f func() error) error {
		t0 := time.Now()
		if err := f(); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		c.logf("cluster: %-28s %6.2fs", name, time.Since(t0).Seconds())
		return nil
	}
	for _, s := range []struct {
		name string
		f    func() error
	}{
		{"files and certificates", c.writeFiles},
		{"cgroups", c.makeCgroups},
		{"holder namespaces", c.startHolder},
		{"decoy namespace", c.startDecoy},
		{"etcd, apiserver, containerd", c.startControlPlane},
		{"apiserver ready", func() error { return c.waitAPIServer(ctx) }},
		{"images imported", func() error { return c.importImages(ctx, images) }},
		{"kubelet, kube-proxy, controllers", c.startNode},
		{"node Ready", func() error { return c.waitNodeReady(ctx) }},
		{"ServiceAccount default", func() error { return c.waitDefaultSA(ctx) }},
	} {
		if err := step(s.name, s.f); err != nil {
			return err
		}
	}
	return nil
}

func (c *Cluster) path(parts ...string) string {
	return filepath.Join(append([]string{c.Dir}, parts...)...)
}

func writeFile(file, content string, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		return fmt.Errorf("creating directory for %s: %w", file, err)
	}
	if err := os.WriteFile(file, []byte(content), mode); err != nil {
		return fmt.Errorf("writing %s: %w", file, err)
	}
	return nil
}

// writeFiles lays out the node: certificates, tokens, kubeconfigs, the
// primary CNI config, component configs, and the directory that becomes
// the node's /var.
func (c *Cluster) writeFiles() error {
	var err error
	if c.pki, err = newPKI(c.path("pki")); err != nil {
		return err
	}
	if _, _, err = c.pki.issue("apiserver", "kube-apiserver", nil, []string{
		"127.0.0.1", nodeIP, apiServiceIP, "localhost", "kubernetes", "kubernetes.default",
		"kubernetes.default.svc", "kubernetes.default.svc.cluster.local"}); err != nil {
		return err
	}
	if _, _, err = c.pki.issue("apiserver-kubelet-client", "kube-apiserver-kubelet-client", []string{"system:masters"}, nil); err != nil {
		return err
	}
	if _, err = c.pki.serviceAccountKey(); err != nil {
		return err
	}

	// Identities: kubelet and kube-proxy as the users the Node authorizer and
	// the bootstrap RBAC policy know; admin and the controllers as masters.
	users := []struct{ name, user, groups string }{
		{"admin", "admin", "system:masters"},
		{"kubelet", "system:node:" + nodeName, "system:nodes"},
		{"kube-proxy", "system:kube-proxy", ""},
		{"controller-manager", "system:kube-controller-manager", "system:masters"},
		{"scheduler", "system:kube-scheduler", "system:masters"},
	}
	var tokens strings.Builder
	for _, u := range users {
		tok := randomHex(16)
		c.tokens[u.name] = tok
		fmt.Fprintf(&tokens, "%s,%s,%s", tok, u.user, u.name)
		if u.groups != "" {
			fmt.Fprintf(&tokens, ",%q", u.groups)
		}
		tokens.WriteString("\n")
		if err := c.writeKubeconfig(c.path("kubeconfig", u.name), tok); err != nil {
			return err
		}
	}
	c.AdminKubeconfig = c.path("kubeconfig", "admin")
	if err := writeFile(c.path("pki", "tokens.csv"), tokens.String(), 0o600); err != nil {
		return err
	}

	// The node's /var (bound over /var in the holder): libcni, kubelet's pod
	// logs and containerd's root keep their default paths there. /var/run
	// must still lead to the private /run.
	for _, d := range []string{"var/lib", "var/log", "var/tmp", "kubelet", "etcd", "logs", "sysctl", "helm", "kubecache", "registry-hosts"} {
		if err := os.MkdirAll(c.path(d), 0o755); err != nil {
			return fmt.Errorf("creating %s: %w", d, err)
		}
	}
	if err := os.Symlink("/run", c.path("var", "run")); err != nil {
		return fmt.Errorf("linking the node's /var/run: %w", err)
	}
	for name, value := range kubeletSysctls {
		if err := writeFile(c.path("sysctl", strings.ReplaceAll(name, "/", ".")), value+"\n", 0o644); err != nil {
			return err
		}
	}

	// containerd 1.6 takes one CNI bin dir: links to Debian's plugins, and
	// the agent adds its real file beside them.
	if err := os.MkdirAll(c.CNIBinDir, 0o755); err != nil {
		return fmt.Errorf("creating CNI bin dir: %w", err)
	}
	if err := os.MkdirAll(c.CNIConfDir, 0o755); err != nil {
		return fmt.Errorf("creating CNI conf dir: %w", err)
	}
	if err := linkRefPlugins(c.CNIBinDir); err != nil {
		return err
	}
	c.PrimaryConflist = filepath.Join(c.CNIConfDir, "10-bridge.conflist")
	if err := writeFile(c.PrimaryConflist, primaryConflist, 0o644); err != nil {
		return err
	}

	if err := writeFile(c.path("resolv.conf"), "options ndots:1\n", 0o644); err != nil {
		return err
	}
	if err := writeFile(c.path("containerd.toml"), c.containerdConfig(), 0o644); err != nil {
		return err
	}
	return writeFile(c.path("kubelet.yaml"), c.kubeletConfig(), 0o644)
}

// primaryConflist is the node's primary CNI: a bridge with host-local
// addresses and portmap, as many clusters without a network add-on run.
const primaryConflist = `{
  "cniVersion": "1.0.0",
  "name": "e2e-bridge",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "` + podCIDR + `"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
`

// linkRefPlugins links each of Debian's reference CNI plugins into dir,
// a node's CNI bin dir.
func linkRefPlugins(dir string) error {
	plugins, err := os.ReadDir(refPluginDir)
	if err != nil {
		return fmt.Errorf("listing %s: %w", refPluginDir, err)
	}
	for _, p := range plugins {
		if err := os.Symlink(filepath.Join(refPluginDir, p.Name()), filepath.Join(dir, p.Name())); err != nil {
			return fmt.Errorf("linking CNI plugin %s: %w", p.Name(), err)
		}
	}
	return nil
}

func (c *Cluster) writeKubeconfig(file, token string) error {
	ca, err := os.ReadFile(c.pki.CA)
	if err != nil {
		return fmt.Errorf("reading CA: %w", err)
	}
	return writeKubeconfigFile(file, &clientcmdapi.Cluster{Server: apiServer, CertificateAuthorityData: ca}, &clientcmdapi.AuthInfo{Token: token})
}

// writeKubeconfigFile writes a kubeconfig of one cluster and one user,
// the current context, to file.
func writeKubeconfigFile(file string, cluster *clientcmdapi.Cluster, auth *clientcmdapi.AuthInfo) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["e2e"] = cluster
	cfg.AuthInfos["e2e"] = auth
	cfg.Contexts["e2e"] = &clientcmdapi.Context{Cluster: "e2e", AuthInfo: "e2e"}
	cfg.CurrentContext = "e2e"
	if err := os.MkdirAll(filepath.Dir(file), 0o700); err != nil {
		return fmt.Errorf("creating kubeconfig directory: %w", err)
	}
	if err := clientcmd.WriteToFile(*cfg, file); err != nil {
		return fmt.Errorf("writing kubeconfig %s: %w", file, err)
	}
	return nil
}

func (c *Cluster) containerdConfig() string {
	// Paths under /run and /var are the holder's private ones. The opt
	// plugin is disabled: it would create /opt/containerd on the machine.
	return `version = 2
root = "/var/lib/containerd"
state = "/run/containerd"
oom_score = 0
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs", "io.containerd.tracing.processor.v1.otlp"]

[grpc]
  address = "/run/containerd/containerd.sock"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "` + pauseImage + `"
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  # Per-registry hosts.toml files (TestReadmeInstall's loopback registry,
  # plain HTTP), read at each pull.
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "` + c.path("registry-hosts") + `"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "` + c.CNIBinDir + `"
    conf_dir = "` + c.CNIConfDir + `"
    max_conf_num = 1
`
}

func (c *Cluster) kubeletConfig() string { return c.kubeletConfigIn(c.cgroupName) }

// kubeletConfigIn is the kubelet's configuration with its pods' cgroups
// under cgroupRoot (each node of the cluster has its own).
func (c *Cluster) kubeletConfigIn(cgroupRoot string) string {
	return `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /` + cgroupRoot + `
oomScoreAdj: 0
failSwapOn: false
protectKernelDefaults: false
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
podLogsDir: /var/log/pods
resolvConf: ` + c.path("resolv.conf") + `
healthzBindAddress: 127.0.0.1
readOnlyPort: 0
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: false
  x509:
    clientCAFile: ` + c.pki.CA + `
authorization:
  mode: AlwaysAllow
evictionHard:
  memory.available: 1Mi
  nodefs.available: 1%
  nodefs.inodesFree: 1%
  imagefs.available: 1%
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
` + conformanceKubeletConfig()
}

// cgroupHierarchies lists the machine's cgroup mounts (v1 controllers,
// name=systemd, and the v2 unified one).
func cgroupHierarchies() ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("reading mountinfo: %w", err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		for i, fld := range fields {
			if fld == "-" && i+1 < len(fields) && (fields[i+1] == "cgroup" || fields[i+1] == "cgroup2") {
				out = append(out, fields[4])
			}
		}
	}
	return out, sc.Err()
}

// makeCgroups creates kubelet's cgroupRoot in every hierarchy; kubelet
// refuses a root missing from any. cpuset needs cpus and mems set before
// anything can join a child.
func (c *Cluster) makeCgroups() error { return makeCgroupRoot(c.cgroupName) }

// makeCgroupRoot creates the cgroup name in every hierarchy.
func makeCgroupRoot(name string) error {
	hs, err := cgroupHierarchies()
	if err != nil {
		return err
	}
	for _, h := range hs {
		d := filepath.Join(h, name)
		if err := os.Mkdir(d, 0o755); err != nil {
			return fmt.Errorf("creating cgroup %s: %w", d, err)
		}
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			v, err := os.ReadFile(filepath.Join(h, f))
			if err != nil {
				continue // not the cpuset hierarchy
			}
			if err := os.WriteFile(filepath.Join(d, f), v, 0o644); err != nil {
				return fmt.Errorf("setting %s of cgroup %s: %w", f, d, err)
			}
		}
	}
	return nil
}

// startHolder starts the process whose namespaces are the node: private
// /run, the node's /var, shadowed sysctls, loopback and a veth pair with the
// node address, forwarding on (all inside its own namespaces).
func (c *Cluster) startHolder() error {
	var sb strings.Builder
	sb.WriteString("set -eu\n")
	sb.WriteString("mount -n -t tmpfs -o mode=755 nftmesh-e2e-run /run\n")
	fmt.Fprintf(&sb, "mount -n --bind %s /var\n", c.path("var"))
	names := make([]string, 0, len(kubeletSysctls))
	for name := range kubeletSysctls {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		fmt.Fprintf(&sb, "mount -n --bind %s /proc/sys/%s\n", c.path("sysctl", strings.ReplaceAll(name, "/", ".")), name)
	}
	sb.WriteString("ip link set lo up\n")
	sb.WriteString("ip link add nodeeth0 type veth peer name nodeeth1\n")
	fmt.Fprintf(&sb, "ip addr add %s/24 dev nodeeth0\n", nodeIP)
	sb.WriteString("ip link set nodeeth0 up\nip link set nodeeth1 up\n")
	sb.WriteString("ip route add default dev nodeeth0\n")
	sb.WriteString("echo 1 > /proc/sys/net/ipv4/ip_forward\n")
	sb.WriteString(underlaySwitch)
	fmt.Fprintf(&sb, "touch %s\n", c.path("holder.ready"))
	sb.WriteString("exec sleep infinity\n")

	cmd := exec.Command(c.bin.unshare, "--mount", "--net", "--propagation", "slave", "--", "/bin/sh", "-c", sb.String())
	comp, err := c.spawn("holder", cmd)
	if err != nil {
		return err
	}
	c.holder = comp
	c.holderPID = cmd.Process.Pid
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(c.path("holder.ready")); err == nil {
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
	for i, ns := range []string{"mnt", "net"} {
		id, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/%s", c.holderPID, ns))
		if err != nil {
			return fmt.Errorf("reading holder's %s namespace: %w", ns, err)
		}
		c.nsIDs[i] = id
	}
	if c.nsIDs[0] == selfNS("mnt") || c.nsIDs[1] == selfNS("net") {
		return errors.New("holder shares the test's namespaces")
	}
	c.netNS, err = os.Open(fmt.Sprintf("/proc/%d/ns/net", c.holderPID))
	if err != nil {
		return fmt.Errorf("opening holder's network namespace: %w", err)
	}
	c.dialer = &netnsDialer{ns: c.netNS}
	return nil
}

func selfNS(kind string) string {
	id, _ := os.Readlink("/proc/self/ns/" + kind)
	return id
}

// spawn starts cmd in its own process group (a Ctrl-C on the terminal
// reaches only the test, which then tears down in order) with its output in
// logs/<name>.log. Pdeathsig is a last resort if the test process is killed
// outright.
func (c *Cluster) spawn(name string, cmd *exec.Cmd) (*component, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return nil, errors.New("cluster is being stopped")
	}
	logFile := c.path("logs", name+".log")
	f, err := os.OpenFile(logFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("opening log of %s: %w", name, err)
	}
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	// spawn: Pdeathsig follows the forking thread, which a test's netns
	// helpers may end.
	if err := spawn.Start(cmd); err != nil {
		f.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	comp := &component{name: name, cmd: cmd, log: logFile, done: make(chan struct{})}
	go func() {
		comp.err = cmd.Wait()
		f.Close()
		close(comp.done)
	}()
	c.components = append(c.components, comp)
	return comp, nil
}

// inNode is a command run inside the holder's mount and network namespaces.
func (c *Cluster) inNode(name string, args ...string) *exec.Cmd {
	return exec.Command(c.bin.nsenter, append([]string{
		fmt.Sprintf("--mount=/proc/%d/ns/mnt", c.holderPID),
		fmt.Sprintf("--net=/proc/%d/ns/net", c.holderPID),
		"--", name}, args...)...)
}

// inNodeNet is a command run inside the node's network namespace only (it
// sees the machine's files: helm's and kubectl's state in the test dir).
func (c *Cluster) inNodeNet(name string, args ...string) *exec.Cmd {
	return exec.Command(c.bin.nsenter, append([]string{
		fmt.Sprintf("--net=/proc/%d/ns/net", c.holderPID), "--", name}, args...)...)
}

func (c *Cluster) startControlPlane() error {
	if _, err := c.spawn("etcd", c.inNode(c.bin.etcd,
		"--name", "default", "--data-dir", c.path("etcd"),
		"--listen-client-urls", "http://127.0.0.1:2379", "--advertise-client-urls", "http://127.0.0.1:2379",
		"--listen-peer-urls", "http://127.0.0.1:2380", "--initial-advertise-peer-urls", "http://127.0.0.1:2380",
		"--initial-cluster", "default=http://127.0.0.1:2380")); err != nil {
		return err
	}
	if _, err := c.spawn("kube-apiserver", c.inNode(c.bin.apiserver,
		"--etcd-servers", "http://127.0.0.1:2379",
		"--bind-address", "0.0.0.0", "--secure-port", "6443", "--advertise-address", nodeIP,
		"--tls-cert-file", c.path("pki", "apiserver.crt"), "--tls-private-key-file", c.path("pki", "apiserver.key"),
		"--client-ca-file", c.pki.CA,
		"--token-auth-file", c.path("pki", "tokens.csv"),
		"--authorization-mode", "Node,RBAC",
		"--enable-admission-plugins", "NodeRestriction",
		"--allow-privileged=true",
		"--service-cluster-ip-range", serviceCIDR,
		"--service-account-issuer", "https://kubernetes.default.svc",
		"--service-account-key-file", c.path("pki", "sa.key"),
		"--service-account-signing-key-file", c.path("pki", "sa.key"),
		"--kubelet-client-certificate", c.path("pki", "apiserver-kubelet-client.crt"),
		"--kubelet-client-key", c.path("pki", "apiserver-kubelet-client.key"),
		// Else logs and exec resolve the node name through the machine's DNS.
		"--kubelet-preferred-address-types", "InternalIP,Hostname",
		"--profiling=false")); err != nil {
		return err
	}
	if _, err := c.spawn("containerd", c.inNode(c.bin.containerd, "--config", c.path("containerd.toml"))); err != nil {
		return err
	}
	return nil
}

// restConfig talks to the apiserver from the test process, through the
// node's network namespace.
func (c *Cluster) restConfig(token string) (*rest.Config, error) {
	ca, err := os.ReadFile(c.pki.CA)
	if err != nil {
		return nil, fmt.Errorf("reading CA: %w", err)
	}
	return &rest.Config{
		Host:            apiServer,
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{CAData: ca},
		Dial:            c.dialer.DialContext,
		QPS:             50,
		Burst:           100,
	}, nil
}

func (c *Cluster) waitAPIServer(ctx context.Context) error {
	cfg, err := c.restConfig(c.tokens["admin"])
	if err != nil {
		return err
	}
	c.Rest = cfg
	if c.Client, err = kubernetes.NewForConfig(cfg); err != nil {
		return fmt.Errorf("creating client: %w", err)
	}
	return c.poll(ctx, 60*time.Second, "kube-apiserver", func() (bool, error) {
		body, err := c.Client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		return err == nil && string(body) == "ok", nil
	})
}

// poll calls f until it reports done, the timeout passes, or a component
// dies (its log tail is in the error).
func (c *Cluster) poll(ctx context.Context, timeout time.Duration, what string, f func() (bool, error)) error {
	deadline := time.Now().Add(timeout)
	for {
		ok, err := f()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		if dead := c.deadComponent(); dead != nil {
			return fmt.Errorf("waiting for %s: %s exited: %v\n%s", what, dead.name, dead.err, tail(dead.log, 30))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("waiting for %s: not ready after %v", what, timeout)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (c *Cluster) deadComponent() *component {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, comp := range c.components {
		select {
		case <-comp.done:
			return comp
		default:
		}
	}
	return nil
}

// Ctr runs ctr against the node's containerd, in its namespaces.
func (c *Cluster) Ctr(ctx context.Context, args ...string) (string, error) {
	cmd := c.inNode(c.bin.ctr, append([]string{"--address", "/run/containerd/containerd.sock", "-n", "k8s.io"}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("ctr %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// importImages loads docker-archive tarballs (absolute paths) into the
// node's containerd, where kubelet finds them with pullPolicy Never.
func (c *Cluster) importImages(ctx context.Context, tars []string) error {
	sock := fmt.Sprintf("/proc/%d/root/run/containerd/containerd.sock", c.holderPID)
	if err := c.poll(ctx, 30*time.Second, "containerd socket", func() (bool, error) {
		_, err := os.Stat(sock)
		return err == nil, nil
	}); err != nil {
		return err
	}
	for _, tar := range tars {
		if _, err := c.Ctr(ctx, "images", "import", "--all-platforms", tar); err != nil {
			return err
		}
	}
	return nil
}

func (c *Cluster) startNode() error {
	if _, err := c.spawn("kube-controller-manager", c.inNode(c.bin.controllerManager,
		"--kubeconfig", c.path("kubeconfig", "controller-manager"),
		"--service-account-private-key-file", c.path("pki", "sa.key"),
		"--root-ca-file", c.pki.CA,
		"--authentication-kubeconfig", c.path("kubeconfig", "controller-manager"),
		"--authorization-kubeconfig", c.path("kubeconfig", "controller-manager"),
		"--cert-dir", c.path("controller-manager"),
		"--leader-elect=false", "--bind-address", "127.0.0.1",
		"--controllers", "*,-csrsigning,-nodeipam")); err != nil {
		return err
	}
	if _, err := c.spawn("kube-scheduler", c.inNode(c.bin.scheduler,
		"--kubeconfig", c.path("kubeconfig", "scheduler"),
		"--authentication-kubeconfig", c.path("kubeconfig", "scheduler"),
		"--authorization-kubeconfig", c.path("kubeconfig", "scheduler"),
		"--cert-dir", c.path("scheduler"),
		"--leader-elect=false", "--bind-address", "127.0.0.1")); err != nil {
		return err
	}
	kubeletArgs := []string{"--config", c.path("kubelet.yaml"),
		"--kubeconfig", c.path("kubeconfig", "kubelet"),
		"--root-dir", c.path("kubelet"),
		"--hostname-override", nodeName,
		"--node-ip", nodeIP}
	// NFTMESH_E2E_KUBELET_V=4 logs the kubelet's pod worker and back-off
	// decisions, what explains a pod that starts late.
	if v := os.Getenv("NFTMESH_E2E_KUBELET_V"); v != "" {
		kubeletArgs = append(kubeletArgs, "--v="+v)
	}
	if _, err := c.spawn("kubelet", c.inNode(c.bin.kubelet, kubeletArgs...)); err != nil {
		return err
	}
	// The conntrack flags keep kube-proxy away from the global conntrack
	// sysctls; everything else it writes is per network namespace.
	_, err := c.spawn("kube-proxy", c.inNode(c.bin.kubeProxy,
		"--kubeconfig", c.path("kubeconfig", "kube-proxy"),
		"--hostname-override", nodeName,
		"--proxy-mode", "iptables",
		"--cluster-cidr", podCIDR,
		"--conntrack-max-per-core=0",
		"--conntrack-tcp-timeout-established=0",
		"--conntrack-tcp-timeout-close-wait=0",
		"--oom-score-adj=0",
		"--metrics-bind-address", "127.0.0.1:10249",
		"--healthz-bind-address", "127.0.0.1:10256"))
	return err
}

func (c *Cluster) waitNodeReady(ctx context.Context) error {
	return c.poll(ctx, 120*time.Second, "node Ready", func() (bool, error) {
		n, err := c.Client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
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

// waitDefaultSA waits for the controller-manager to create the default
// ServiceAccount: pods in a namespace are refused until it exists.
func (c *Cluster) waitDefaultSA(ctx context.Context) error {
	return c.poll(ctx, 60*time.Second, "ServiceAccount default/default", func() (bool, error) {
		_, err := c.Client.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return err == nil, nil
	})
}

// HTTPClient reaches pods and node ports from the test process.
func (c *Cluster) HTTPClient() *http.Client {
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DialContext: c.dialer.DialContext}}
}

// Kubectl runs kubectl with the admin kubeconfig in the node's network
// namespace; its cache stays in the test dir.
func (c *Cluster) Kubectl(ctx context.Context, args ...string) (string, error) {
	return c.run(ctx, c.bin.kubectl, args...)
}

// Helm runs helm like Kubectl, with its cache, config and data in the test
// dir.
func (c *Cluster) Helm(ctx context.Context, args ...string) (string, error) {
	return c.run(ctx, c.bin.helm, args...)
}

func (c *Cluster) run(ctx context.Context, bin string, args ...string) (string, error) {
	cmd := c.inNodeNet(bin, args...)
	cmd.Env = append(os.Environ(),
		"KUBECONFIG="+c.AdminKubeconfig,
		"KUBECACHEDIR="+c.path("kubecache"),
		"HELM_CACHE_HOME="+c.path("helm", "cache"),
		"HELM_CONFIG_HOME="+c.path("helm", "config"),
		"HELM_DATA_HOME="+c.path("helm", "data"),
		"HOME="+c.path("helm"))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return "", fmt.Errorf("starting %s: %w", filepath.Base(bin), err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			return out.String(), fmt.Errorf("%s %s: %w\n%s", filepath.Base(bin), strings.Join(args, " "), err, out.String())
		}
		return out.String(), nil
	case <-ctx.Done():
		_ = cmd.Process.Kill()
		<-done
		return out.String(), fmt.Errorf("%s %s: %w\n%s", filepath.Base(bin), strings.Join(args, " "), ctx.Err(), out.String())
	}
}

// NodePath is a path inside the node's mount namespace, as the test
// process reaches it (through the holder's root).
func (c *Cluster) NodePath(p string) string {
	return fmt.Sprintf("/proc/%d/root%s", c.holderPID, p)
}

// Stop tears the node down: kubelet and kube-proxy first, then every
// container (by cgroup), containerd and what is left in the node's
// namespaces (shims), the control plane, the holder. It then removes the
// cgroups and checks that nothing is left. Safe to call more than once and
// from a signal handler while Start runs.
func (c *Cluster) Stop() error {
	c.stopOnce.Do(func() { c.stopErr = c.stop() })
	return c.stopErr
}

func (c *Cluster) stop() error {
	c.mu.Lock()
	c.stopped = true
	workers := append([]*workerNode(nil), c.workers...)
	c.mu.Unlock()
	var errs []error
	// Nodes that joined later go first: their kubelets talk to this
	// node's apiserver, their network hangs off this node's namespace.
	for _, w := range workers {
		if err := w.stop(); err != nil {
			errs = append(errs, err)
		}
	}
	c.mu.Lock()
	comps := append([]*component(nil), c.components...)
	c.mu.Unlock()
	byName := map[string]*component{}
	for _, comp := range comps {
		byName[comp.name] = comp
	}
	stop := func(names ...string) {
		t0 := time.Now()
		defer func() { c.logf("cluster: stopped %-40s %6.2fs", strings.Join(names, ", "), time.Since(t0).Seconds()) }()
		var wg sync.WaitGroup
		for _, n := range names {
			if comp := byName[n]; comp != nil {
				wg.Add(1)
				go func() { defer wg.Done(); terminate(comp, 10*time.Second) }()
			}
		}
		wg.Wait()
	}
	stop("kubelet", "kube-proxy", "kube-scheduler", "kube-controller-manager")
	t0 := time.Now()
	c.killCgroupProcs()
	c.logf("cluster: killed the pods' processes %6.2fs", time.Since(t0).Seconds())
	stop("containerd")
	if c.holderPID > 0 {
		c.killNamespaceProcs()
	}
	stop("kube-apiserver")
	stop("etcd")
	stop("holder", "decoy")
	if c.netNS != nil {
		c.netNS.Close()
	}
	if err := c.removeCgroups(); err != nil {
		errs = append(errs, err)
	}
	if err := c.leftovers(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// terminate sends SIGTERM, then SIGKILL after grace, and waits for exit.
func terminate(comp *component, grace time.Duration) {
	select {
	case <-comp.done:
		return
	default:
	}
	_ = comp.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-comp.done:
	case <-time.After(grace):
		_ = comp.cmd.Process.Kill()
		<-comp.done
	}
}

// cgroupDirs lists the cgroup directories under the node's cgroupRoot, the
// deepest first.
func (c *Cluster) cgroupDirs() []string { return cgroupDirs(c.cgroupName) }

// cgroupDirs lists the cgroup directories under name in every hierarchy,
// the deepest first.
func cgroupDirs(name string) []string {
	hs, _ := cgroupHierarchies()
	var dirs []string
	for _, h := range hs {
		root := filepath.Join(h, name)
		_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
	}
	sort.Slice(dirs, func(i, j int) bool { return strings.Count(dirs[i], "/") > strings.Count(dirs[j], "/") })
	return dirs
}

// killCgroupProcs kills every process in the node's cgroups (the pods'
// containers), repeating until none is left.
func (c *Cluster) killCgroupProcs() { killCgroupProcs(c.cgroupName) }

// killCgroupProcs kills every process in the cgroups under name, repeating
// until none is left.
func killCgroupProcs(name string) {
	for i := 0; i < 50; i++ {
		n := 0
		for _, d := range cgroupDirs(name) {
			data, err := os.ReadFile(filepath.Join(d, "cgroup.procs"))
			if err != nil {
				continue
			}
			for _, f := range strings.Fields(string(data)) {
				if pid, err := strconv.Atoi(f); err == nil && pid > 1 {
					_ = syscall.Kill(pid, syscall.SIGKILL)
					n++
				}
			}
		}
		if n == 0 {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// nsProcs lists processes other than the holder in the holder's mount or
// network namespace.
func (c *Cluster) nsProcs() []int { return nsProcs(c.holderPID, c.nsIDs) }

// nsProcs lists processes other than holder in the mount or network
// namespace of nsIDs ("mnt:[…]", "net:[…]").
func nsProcs(holder int, nsIDs [2]string) []int {
	var pids []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == holder {
			continue
		}
		mnt, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid))
		netns, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", pid))
		if (mnt != "" && mnt == nsIDs[0]) || (netns != "" && netns == nsIDs[1]) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// killNamespaceProcs kills what is still in the node's namespaces after
// containerd stopped: its shims (not its children) and anything they left.
func (c *Cluster) killNamespaceProcs() {
	for i := 0; i < 50; i++ {
		pids := c.nsProcs()
		if len(pids) == 0 {
			return
		}
		c.mu.Lock()
		ours := map[int]bool{}
		for _, comp := range c.components {
			select {
			case <-comp.done:
			default:
				ours[comp.cmd.Process.Pid] = true
			}
		}
		c.mu.Unlock()
		left := 0
		for _, pid := range pids {
			if ours[pid] {
				continue // a component still to be stopped in order
			}
			_ = syscall.Kill(pid, syscall.SIGKILL)
			left++
		}
		if left == 0 {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (c *Cluster) removeCgroups() error { return removeCgroups(c.cgroupName) }

// removeCgroups removes the cgroups under name, the deepest first, killing
// what is still in them.
func removeCgroups(name string) error {
	var last error
	for i := 0; i < 50; i++ {
		last = nil
		for _, d := range cgroupDirs(name) {
			if err := os.Remove(d); err != nil && !os.IsNotExist(err) {
				last = fmt.Errorf("removing cgroup %s: %w", d, err)
			}
		}
		if last == nil {
			return nil
		}
		killCgroupProcs(name)
		time.Sleep(100 * time.Millisecond)
	}
	return last
}

// leftovers reports anything of the node still on the machine: processes in
// its namespaces, cgroup directories, mounts naming its directories, and its
// network namespace pinned anywhere.
func (c *Cluster) leftovers() error {
	var found []string
	if c.holderPID > 0 {
		for _, pid := range c.nsProcs() {
			cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
			found = append(found, fmt.Sprintf("process %d (%s)", pid, strings.ReplaceAll(string(cmdline), "\x00", " ")))
		}
		// An exited holder leaves no /proc entry; its namespaces are gone
		// unless something else pins them (a process, checked above, or a
		// bind mount, checked below).
		if _, err := os.Stat(fmt.Sprintf("/proc/%d/ns", c.holderPID)); err == nil {
			if id, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", c.holderPID)); id == c.nsIDs[1] {
				found = append(found, fmt.Sprintf("holder %d still running", c.holderPID))
			}
		}
	}
	for _, d := range c.cgroupDirs() {
		found = append(found, "cgroup "+d)
	}
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err == nil {
		netInode := strings.TrimSuffix(strings.TrimPrefix(c.nsIDs[1], "net:["), "]")
		for _, line := range strings.Split(string(mi), "\n") {
			if strings.Contains(line, c.Dir) || strings.Contains(line, c.cgroupName) ||
				(netInode != "" && strings.Contains(line, "net:["+netInode+"]")) {
				found = append(found, "mount "+line)
			}
		}
	}
	if len(found) > 0 {
		return fmt.Errorf("left on the machine: %s", strings.Join(found, "; "))
	}
	return nil
}

// tail returns the last n lines of a log file.
func tail(file string, n int) string {
	data, err := os.ReadFile(file)
	if err != nil {
		return ""
	}
	return lastLines(string(data), n)
}

// lastLines returns the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Logs returns the tails of every component's log, for a failure report.
func (c *Cluster) Logs(n int) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var sb strings.Builder
	for _, comp := range c.components {
		fmt.Fprintf(&sb, "==== %s (%s) ====\n%s\n", comp.name, comp.log, tail(comp.log, n))
	}
	return sb.String()
}
