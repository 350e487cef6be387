package cluster

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
)

// The one cluster all tests share, and why there is none.
var (
	cl         *Cluster
	setupErr   error  // the cluster did not come up
	skipReason string // not root, -short, or binaries missing outside CI
	failReason string // binaries missing under CI=true
	repo       string
	// imageArchive is the nftmesh image's docker-archive the node imported.
	imageArchive string

	timingsMu sync.Mutex
	timings   []string // "cluster up", "teardown", ... for the report
)

func record(format string, args ...any) {
	line := fmt.Sprintf(format, args...)
	timingsMu.Lock()
	timings = append(timings, line)
	timingsMu.Unlock()
	fmt.Fprintln(os.Stderr, line)
}

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(run(m))
}

func run(m *testing.M) int {
	var err error
	if repo, err = filepath.Abs(filepath.Join("..", "..")); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	switch {
	case testing.Short():
		skipReason = "-short: starts a whole Kubernetes node"
	case os.Geteuid() != 0:
		skipReason = "needs root: namespaces, mounts, cgroups, containerd"
	}
	if skipReason != "" {
		return m.Run()
	}
	bin, err := findBinaries(repo)
	if err != nil {
		if os.Getenv("CI") == "true" {
			failReason = err.Error()
		} else {
			skipReason = err.Error() + " (make e2e-cluster builds and runs everything)"
		}
		return m.Run()
	}

	dir, err := os.MkdirTemp("", "nftmesh-cluster-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	before := machineState()
	cl = New(bin, dir, record)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	var downOnce sync.Once
	down := func() int {
		code := 0
		downOnce.Do(func() {
			cancel()
			t0 := time.Now()
			err := cl.Stop()
			record("cluster: teardown %.2fs", time.Since(t0).Seconds())
			if err != nil {
				fmt.Fprintf(os.Stderr, "FAIL: tearing down the cluster: %v\n", err)
				code = 1
			}
			if after := machineState(); after != before {
				fmt.Fprintf(os.Stderr, "FAIL: the machine changed:\nbefore: %s\nafter:  %s\n", before, after)
				code = 1
			}
			if code == 0 && os.Getenv("NFTMESH_E2E_KEEP") == "" {
				if err := os.RemoveAll(dir); err != nil {
					fmt.Fprintf(os.Stderr, "FAIL: removing %s: %v\n", dir, err)
					code = 1
				}
			} else {
				fmt.Fprintf(os.Stderr, "cluster: state and logs kept in %s\n", dir)
			}
		})
		return code
	}

	// Ctrl-C, SIGTERM and the test timeout all end in a teardown: the
	// testing package's own timeout would exit without one.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	go func() {
		s := <-sigs
		fmt.Fprintf(os.Stderr, "cluster: %v: tearing down\n", s)
		down()
		os.Exit(2)
	}()
	if f := flag.Lookup("test.timeout"); f != nil {
		if d, err := time.ParseDuration(f.Value.String()); err == nil && d > 0 {
			margin := min(d/10, time.Minute)
			time.AfterFunc(d-margin, func() {
				fmt.Fprintf(os.Stderr, "cluster: test timeout %v is %v away: tearing down\n%s", d, margin, cl.Logs(20))
				down()
				os.Exit(2)
			})
		}
	}

	t0 := time.Now()
	images, err := buildImages(repo, dir)
	if err == nil {
		imageArchive = images[len(images)-1]
		record("cluster: images built %.2fs", time.Since(t0).Seconds())
		t0 = time.Now()
		err = cl.Start(ctx, images)
	}
	if err != nil {
		setupErr = err
		fmt.Fprintf(os.Stderr, "cluster: start failed: %v\n%s", err, cl.Logs(40))
	} else {
		record("cluster: up (node Ready, ServiceAccount present) %.2fs", time.Since(t0).Seconds())
	}

	code := m.Run()
	if code != 0 {
		fmt.Fprintf(os.Stderr, "component logs (tails):\n%s", cl.Logs(40))
	}
	if c := down(); c != 0 {
		code = c
	}
	return code
}

// need returns the shared cluster or ends the test saying why there is none.
func need(t *testing.T) *Cluster {
	t.Helper()
	if failReason != "" {
		t.Fatalf("CI=true and %s", failReason)
	}
	if skipReason != "" {
		t.Skipf("skipping: %s", skipReason)
	}
	if setupErr != nil {
		t.Fatalf("the cluster did not come up: %v", setupErr)
	}
	return cl
}

// machineState is what the cluster must not change on the machine: the
// global sysctls a node's components write, and the links of the test's own
// network namespace.
func machineState() string {
	var sb strings.Builder
	for _, name := range machineSysctls {
		v, err := os.ReadFile("/proc/sys/" + name)
		if err != nil {
			continue
		}
		fmt.Fprintf(&sb, "%s=%s ", name, bytes.TrimSpace(v))
	}
	links, err := netlink.LinkList()
	if err == nil {
		for _, l := range links {
			fmt.Fprintf(&sb, "link:%s ", l.Attrs().Name)
		}
	}
	return sb.String()
}

// TestClusterUp checks the node the other tests build on and prints the
// start-up timings.
func TestClusterUp(t *testing.T) {
	c := need(t)
	timingsMu.Lock()
	for _, l := range timings {
		t.Log(l)
	}
	timingsMu.Unlock()
	ctx := context.Background()
	out, err := c.Kubectl(ctx, "get", "nodes", "-o", "wide")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("kubectl get nodes:\n%s", out)
	if !strings.Contains(out, nodeName) || !strings.Contains(out, " Ready ") {
		t.Errorf("node %s not Ready in kubectl's view:\n%s", nodeName, out)
	}
	if _, err = c.Kubectl(ctx, "get", "serviceaccount", "default", "-n", "default"); err != nil {
		t.Error(err)
	}
	// The node's network lives only in the holder: the machine has no cni0
	// and no node address.
	if _, err := netlink.LinkByName("nodeeth0"); err == nil {
		t.Error("the node's link nodeeth0 is in the machine's network namespace")
	}
	images, err := c.Ctr(ctx, "images", "ls", "-q")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{pauseImage, nftmeshImage} {
		if !strings.Contains(images, want) {
			t.Errorf("image %s not in containerd:\n%s", want, images)
		}
	}
}
