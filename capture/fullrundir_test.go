package capture_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/nftmesh/nftmesh/capture"
	"github.com/nftmesh/nftmesh/cniplugin"
	"github.com/nftmesh/nftmesh/iptables"
	"github.com/nftmesh/nftmesh/podinfo"
	"github.com/nftmesh/nftmesh/podinfo/agentsock"
	"github.com/nftmesh/nftmesh/testkit/kubetest"
	"github.com/nftmesh/nftmesh/testkit/nstest"
)

// mountTmpfs mounts a tmpfs with opts at a new directory under the test's
// temp dir (in the test's private mount namespace) and returns it.
func mountTmpfs(t *testing.T, opts string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "run")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, opts); err != nil {
		t.Fatalf("mounting a tmpfs (%s) on %s: %v", opts, dir, err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	return dir
}

// fillInodes creates empty files in dir until its file system has no
// inode left.
func fillInodes(t *testing.T, dir string) {
	t.Helper()
	for i := 0; ; i++ {
		f, err := os.Create(filepath.Join(dir, fmt.Sprintf("filler-%d", i)))
		if errors.Is(err, unix.ENOSPC) {
			return
		}
		if err != nil || i > 100000 {
			t.Fatalf("filling the inodes of %s: %v after %d files", dir, err, i)
		}
		f.Close()
	}
}

// fillSpace writes one file in dir until its file system has no block
// left.
func fillSpace(t *testing.T, dir string) {
	t.Helper()
	f, err := os.Create(filepath.Join(dir, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 64<<10)
	for {
		if _, err := f.Write(buf); err != nil {
			if !errors.Is(err, unix.ENOSPC) {
				t.Fatalf("filling %s: %v", dir, err)
			}
			return
		}
	}
}

func remountRO(t *testing.T, dir string) {
	t.Helper()
	if err := unix.Mount("", dir, "", unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
		t.Fatalf("remounting %s read-only: %v", dir, err)
	}
}

// pluginRun is one CNI call through the plugin's code (cniplugin.Run, what
// the standalone plugin and the agent run), the pod looked up as the agent
// answers it.
type pluginRun struct {
	t       *testing.T
	backend string
	ask     func(agentsock.Request) (agentsock.Answer, error)
	uid     string
}

func (r pluginRun) run(verb, netns, runDir string) (rc int, stdout, stderr string) {
	r.t.Helper()
	conf, err := json.Marshal(map[string]any{
		"cniVersion": "1.0.0", "name": "k8s", "type": "nftmesh-cni",
		"agent_run_dir": runDir, "backend": r.backend,
		"prevResult": map[string]any{"cniVersion": "1.0.0", "ips": []any{map[string]any{"address": "198.51.100.7/24"}}},
	})
	if err != nil {
		r.t.Fatal(err)
	}
	id := filepath.Base(netns)
	env := map[string]string{
		"CNI_COMMAND": verb, "CNI_CONTAINERID": id, "CNI_NETNS": netns, "CNI_IFNAME": "eth0", "CNI_PATH": "/opt/cni/bin",
		"CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAMESPACE=shop;K8S_POD_NAME=web-1;K8S_POD_INFRA_CONTAINER_ID=" + id + ";K8S_POD_UID=" + r.uid,
	}
	var out, errOut bytes.Buffer
	rc, err = cniplugin.Run(cniplugin.Env{Getenv: func(k string) string { return env[k] }, Stdin: bytes.NewReader(conf), Stdout: &out, Stderr: &errOut, Ask: r.ask})
	if err != nil {
		r.t.Fatalf("%s in %s: %v", verb, netns, err)
	}
	return rc, out.String(), errOut.String()
}

// ourRules is what the independent tools show of nftmesh's rules in the
// namespace at path: nft's ruleset, or the legacy tables' chains and
// tagged rules.
func ourRules(t *testing.T, backend, path string) string {
	t.Helper()
	var keep []string
	if backend == capture.NFTables {
		for _, l := range strings.Split(nstest.Run(t, path, "", "nft", "list", "ruleset"), "\n") {
			if strings.Contains(l, "nftmesh") {
				keep = append(keep, l)
			}
		}
		return strings.Join(keep, "\n")
	}
	for _, tool := range []string{"iptables-legacy-save", "ip6tables-legacy-save"} {
		for _, l := range strings.Split(nstest.Run(t, path, "", tool), "\n") {
			if strings.Contains(l, "nftmesh") || strings.Contains(l, "ISTIO_") {
				keep = append(keep, l)
			}
		}
	}
	return strings.Join(keep, "\n")
}

// lockFileOf is the path of the netns lock file of the namespace at path
// in runDir.
func lockFileOf(t *testing.T, runDir, path string) string {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(runDir, "netns-locks", fmt.Sprintf("netns-%d-%d.lock", st.Dev, st.Ino))
}

// TestDelOnFullRunDir: with the run dir's file system out of inodes, out
// of space or read-only, the plugin's DEL exits 0, with either backend, for
// a namespace nftmesh never captured, for one it captured (lock file in
// place) and for one captured through another run dir (no lock file
// here), twice each as containerd calls it; the rules are gone (read with
// nft and iptables-legacy-save), and DEL of a namespace with nothing of
// ours creates no file. ADD fails closed where it cannot lock, with an
// error naming the run dir and the errno; on a tmpfs out of blocks (not
// inodes) an empty lock file still fits, and ADD works. Before the fix,
// DEL failed (ENOSPC or EROFS on the lock directory or file) for the
// never-captured namespace, the one captured elsewhere, and on the
// read-only run dir for the captured one too.
func TestDelOnFullRunDir(t *testing.T) {
	if !nstest.InPrivateMountNS(t) {
		return
	}
	pod, err := kubetest.ReadPodFile(filepath.Join("..", "testdata", "pods", "injected.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	pod.UID = "uid-full-1"
	ask := func(agentsock.Request) (agentsock.Answer, error) {
		return agentsock.Found(string(pod.UID), podinfo.Mesh(pod)), nil
	}
	for _, fs := range []struct {
		name, opts string
		fill       func(*testing.T, string)
		errno      string // ADD's error names it; "" for an ADD that works
	}{
		{"no inodes", "size=4m,nr_inodes=48,mode=0755", fillInodes, "ENOSPC"},
		{"no space", "size=256k,mode=0755", fillSpace, ""},
		{"read-only", "size=1m,mode=0755", remountRO, "EROFS"},
	} {
		for _, backend := range []string{capture.NFTables, capture.Legacy} {
			t.Run(fs.name+"/"+backend, func(t *testing.T) {
				if backend == capture.Legacy {
					if err := iptables.LegacyAvailable(); err != nil {
						t.Skipf("no legacy x_tables: %v", err)
					}
				}
				r := pluginRun{t: t, backend: backend, ask: ask, uid: string(pod.UID)}
				runDir := mountTmpfs(t, fs.opts)
				_, never := nstest.New(t, "full-never-")
				_, captured := nstest.New(t, "full-capt-")
				_, elsewhere := nstest.New(t, "full-else-")
				_, fresh := nstest.New(t, "full-fresh-")
				for _, c := range []struct{ netns, runDir string }{{captured, runDir}, {elsewhere, t.TempDir()}} {
					if rc, out, log := r.run("ADD", c.netns, c.runDir); rc != 0 || ourRules(t, backend, c.netns) == "" {
						t.Fatalf("ADD in %s = %d: %s\n%s\nrules: %q", c.netns, rc, out, log, ourRules(t, backend, c.netns))
					}
				}
				fs.fill(t, runDir)

				for _, ns := range []string{never, captured, elsewhere, never, captured} {
					if rc, out, log := r.run("DEL", ns, runDir); rc != 0 {
						t.Fatalf("DEL of %s on a run dir with %s = %d: %s\n%s", ns, fs.name, rc, out, log)
					}
					if left := ourRules(t, backend, ns); left != "" {
						t.Fatalf("after DEL of %s:\n%s", ns, left)
					}
				}
				if _, err := os.Lstat(lockFileOf(t, runDir, never)); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("DEL of a namespace with nothing of ours made its lock file: %v", err)
				}

				// A DEL that removed a lock file freed an inode.
				fs.fill(t, runDir)
				rc, out, log := r.run("ADD", fresh, runDir)
				if fs.errno == "" {
					if rc != 0 || ourRules(t, backend, fresh) == "" {
						t.Fatalf("ADD on a run dir out of blocks = %d: %s\n%s", rc, out, log)
					}
					return
				}
				var cerr struct{ Code int }
				if rc == 0 || json.Unmarshal([]byte(out), &cerr) != nil || cerr.Code == 0 {
					t.Fatalf("ADD on a run dir with %s = %d: %s, want a CNI error", fs.name, rc, out)
				}
				if !strings.Contains(out, runDir) || !strings.Contains(out, fs.errno) {
					t.Errorf("ADD's error does not name the run dir %s and %s: %s", runDir, fs.errno, out)
				}
				if left := ourRules(t, backend, fresh); left != "" {
					t.Errorf("a failed ADD left rules:\n%s", left)
				}
				t.Logf("ADD on a run dir with %s: %s", fs.name, strings.TrimSpace(out))
			})
		}
	}
}
