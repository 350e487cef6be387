package netlab

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/nftmesh/nftmesh/testkit/usernstest"
)

// TestUsernsThreadCredsMatchChildProcess: in a pod netns owned by its own
// user namespace, a probe thread running as the host ID of an in-pod ID
// (PodUIDBase) lands exactly where a real process inside the pod's user
// namespace running as that in-pod ID does, under rules written from the
// host that match the in-pod UID and GID 1337.
func TestUsernsThreadCredsMatchChildProcess(t *testing.T) {
	needRoot(t)
	if _, err := exec.LookPath("nsenter"); err != nil {
		t.Skip("needs nsenter (util-linux) to start a process inside the user namespace")
	}
	const base = 3_300_000
	var holder *usernstest.Netns
	topo, _ := newTopo(t, TopologyOptions{
		NewPodNetns: func(path string) (io.Closer, error) {
			n, err := usernstest.NewAt(path, base)
			holder = n
			return n, err
		},
		PodUIDBase: base, PodGIDBase: base,
	})
	child := childBinary(t)
	checkThreadMatchesProcess(t, topo, "a real process in the user namespace", func(p Probe) Result {
		return usernsChildResult(t, holder.PID(), child, p)
	})
}

// usernsChildResult runs the child probe inside the holder's user and
// network namespaces as the probe's in-pod UID and GID.
func usernsChildResult(t *testing.T, pid int, bin string, p Probe) Result {
	t.Helper()
	cmd := exec.Command("nsenter", "--target", strconv.Itoa(pid), "--user", "--net",
		"--setuid", strconv.Itoa(int(p.UID)), "--setgid", strconv.Itoa(int(p.GID)), bin)
	cmd.Env = []string{childEnv + "=" + fmt.Sprintf("%s %s", p.Proto, p.Dst)}
	out, err := cmd.Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("child probe %s: %v %s", p, err, stderr)
	}
	line, _ := bufio.NewReader(strings.NewReader(string(out))).ReadString('\n')
	var r Reply
	if err := json.Unmarshal([]byte(line), &r); err != nil {
		return Result{Landed: strings.TrimSpace(line)}
	}
	orig, _ := netip.ParseAddrPort(r.Orig)
	local, _ := netip.ParseAddrPort(r.Local)
	return Result{Landed: r.Listener, OrigDst: orig, Local: local}
}
