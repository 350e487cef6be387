package inplace

import (
	"context"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	"github.com/nftmesh/nftmesh/nft"
	"github.com/nftmesh/nftmesh/testkit/cgrouptest"
)

const (
	helperEnv    = "NFTMESH_INPLACE_CAPS_HELPER"
	helperUIDEnv = "NFTMESH_INPLACE_CAPS_HELPER_UID"
)

// The chart gives the agent exactly NET_ADMIN, NET_RAW, SYS_ADMIN and
// SYS_PTRACE in repairPods mode (capabilities drop ALL first). This runs a
// repair under exactly that set and under the set minus each of
// SYS_PTRACE and SYS_ADMIN, against a "pause" process of another user
// (65535, as the real pause image runs): the full set repairs, the others
// fail, so the set is both enough and needed.
func TestRepairCapabilities(t *testing.T) {
	needRoot(t)
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Skip("skipping: needs setpriv (util-linux) to drop capabilities")
	}
	cases := []struct {
		name string
		caps string
		ok   bool
		err  string
	}{
		{"chart set", "net_admin,net_raw,sys_admin,sys_ptrace", true, ""},
		{"without SYS_PTRACE", "net_admin,net_raw,sys_admin", false, "no network namespace on this host holds the pod's IPs"},
		{"without SYS_ADMIN", "net_admin,net_raw,sys_ptrace", false, "operation not permitted"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			v4, _ := uniqueAddrs()
			ns := podNetns(t, v4)
			pause := sleeper(t, ns, "setpriv", "--reuid=65535", "--regid=65535", "--clear-groups")
			uid := cgrouptest.NewUID()
			cgrouptest.MovePod(t, pause, cgrouptest.CgroupfsLeaf(uid))
			if _, err := FindNetns("/proc", "", []netip.Addr{v4.Addr()}); err != nil { // as full root: it is there
				t.Fatalf("the pause process is not findable even with every capability: %v", err)
			}

			bounding := "-all"
			for _, cp := range strings.Split(c.caps, ",") {
				bounding += ",+" + cp
			}
			cmd := exec.Command(setpriv, "--bounding-set", bounding, "--inh-caps", "-all", "--",
				os.Args[0], "-test.run", "^TestRepairCapabilitiesHelper$", "-test.v")
			cmd.Env = append(os.Environ(), helperEnv+"="+v4.Addr().String(), helperUIDEnv+"="+uid)
			out, err := cmd.CombinedOutput()
			t.Logf("helper with %s:\n%s", c.caps, out)
			if c.ok != (err == nil) {
				t.Fatalf("helper with %s: err %v, want success %v", c.caps, err, c.ok)
			}
			if !c.ok && !strings.Contains(string(out), c.err) {
				t.Errorf("helper failed without saying %q", c.err)
			}
			p, lerr := nft.New().List(context.Background(), "/run/netns/"+ns)
			if lerr != nil {
				t.Fatal(lerr)
			}
			if has := len(p.Tables) > 0; has != c.ok {
				t.Errorf("rules present %v, want %v", has, c.ok)
			}
		})
	}
}

// TestRepairCapabilitiesHelper is the repair run under reduced
// capabilities; it does nothing unless started by TestRepairCapabilities.
func TestRepairCapabilitiesHelper(t *testing.T) {
	ip := os.Getenv(helperEnv)
	if ip == "" {
		t.Skip("helper of TestRepairCapabilities")
	}
	caps, _ := os.ReadFile("/proc/self/status")
	for _, l := range strings.Split(string(caps), "\n") {
		if strings.HasPrefix(l, "CapEff") {
			t.Log(l)
		}
	}
	r, err := New(Options{ProcDir: "/proc", Backend: "auto"})
	if err != nil {
		t.Fatal(err)
	}
	pod := loadPod(t, "injected.yaml", netip.MustParseAddr(ip))
	pod.UID = types.UID(os.Getenv(helperUIDEnv))
	rep, err := r.RepairPod(context.Background(), pod)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("repaired: %+v", rep)
}
