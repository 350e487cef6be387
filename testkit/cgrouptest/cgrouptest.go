// Package cgrouptest puts test processes into cgroups named as the kubelet
// names a pod's, so that /proc/PID/cgroup says which pod a process belongs
// to exactly as on a node. The cgroups live in a hierarchy without
// controllers (cgroup v1's name=systemd, else cgroup2): nothing is limited.
package cgrouptest

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// NewUID returns a pod UID as the API server makes them (a UUID).
func NewUID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	h := hex.EncodeToString(b)
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}

// CgroupfsLeaf is the kubelet's name of a pod's cgroup with the cgroupfs
// driver; SystemdLeaf with the systemd driver.
func CgroupfsLeaf(uid string) string { return "pod" + uid }

// SystemdLeaf is the kubelet's name of a best-effort pod's cgroup with the
// systemd driver.
func SystemdLeaf(uid string) string {
	return "kubepods-besteffort-pod" + strings.ReplaceAll(uid, "-", "_") + ".slice"
}

// MovePod moves pid into a throw-away cgroup …/kubepods/besteffort/<leaf>.
// t.Cleanup moves it back to the hierarchy's root and removes the dirs. It
// skips the test when the machine has no suitable hierarchy.
func MovePod(t testing.TB, pid int, leaf string) {
	t.Helper()
	root := hierarchy(t)
	top := filepath.Join(root, "nftmesh-test-"+strconv.Itoa(os.Getpid())+"-"+NewUID()[:8])
	dir := filepath.Join(top, "kubepods", "besteffort", leaf)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatalf("creating cgroup: %v", err)
	}
	t.Cleanup(func() {
		_ = os.WriteFile(filepath.Join(root, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644)
		for d := dir; strings.HasPrefix(d, top); d = filepath.Dir(d) {
			for i := 0; i < 50; i++ {
				if err := os.Remove(d); err == nil || os.IsNotExist(err) {
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
		}
	})
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644); err != nil {
		t.Fatalf("moving %d into %s: %v", pid, dir, err)
	}
}

// hierarchy is the mount point of a cgroup hierarchy where a test may make
// cgroups without limiting anything.
func hierarchy(t testing.TB) string {
	t.Helper()
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	v2 := ""
	for _, line := range strings.Split(string(mi), "\n") {
		pre, post, ok := strings.Cut(line, " - ")
		if !ok {
			continue
		}
		f, g := strings.Fields(pre), strings.Fields(post)
		if len(f) < 5 || len(g) < 3 {
			continue
		}
		switch {
		case g[0] == "cgroup" && strings.Contains(","+g[2]+",", ",name=systemd,"):
			return f[4]
		case g[0] == "cgroup2" && v2 == "":
			v2 = f[4]
		}
	}
	if v2 == "" {
		t.Skip("skipping: no name=systemd or cgroup2 hierarchy to make a pod's cgroup in")
	}
	return v2
}
