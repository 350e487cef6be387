package cluster

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"time"
)

// startDecoy starts, beside the node, a process in a network namespace of
// its own holding every address of the node's pod network: what the node's
// /proc shows when a second cluster runs on the same machine, or a kind
// cluster inside a CI pod. Repair in place finds a pod's namespace through
// /proc; it must program the pod's own namespace, never this one, which is
// older than every pod (the process that came first is what a lookup by IP
// alone prefers).
func (c *Cluster) startDecoy() error {
	prefix := netip.MustParsePrefix(podCIDR)
	var batch strings.Builder
	for a := prefix.Addr().Next().Next(); prefix.Contains(a); a = a.Next() {
		fmt.Fprintf(&batch, "address add %s/32 dev lo\n", a)
	}
	batchFile := c.path("decoy.batch")
	if err := os.WriteFile(batchFile, []byte(batch.String()), 0o644); err != nil {
		return err
	}
	ready := c.path("decoy.ready")
	script := fmt.Sprintf("set -eu\nip link set lo up\nip -batch %s\ntouch %s\nexec sleep infinity\n", batchFile, ready)
	comp, err := c.spawn("decoy", exec.Command(c.bin.unshare, "--net", "--", "/bin/sh", "-c", script))
	if err != nil {
		return err
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(ready); err == nil {
			return nil
		}
		select {
		case <-comp.done:
			return fmt.Errorf("decoy exited: %v\n%s", comp.err, tail(comp.log, 20))
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("decoy not ready after 10s\n%s", tail(comp.log, 20))
		}
	}
}
