package cluster

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestHelmUninstall is assertion 6, the last step: `helm uninstall` takes
// our entry and binary off the node, the primary's conflist is byte for
// byte what it was before the install, and a new pod outside the mesh
// starts normally through the primary alone.
func TestHelmUninstall(t *testing.T) {
	c := need(t)
	ctx := context.Background()
	installChart(t, c)

	t0 := time.Now()
	// The agent restores the config on SIGTERM; helm returns once the
	// DaemonSet is gone, its pod may still be terminating.
	if err := uninstallChart(ctx, c); err != nil {
		t.Fatal(err)
	}
	record("chart: helm uninstall → agent gone %.2fs", time.Since(t0).Seconds())

	got, err := os.ReadFile(c.PrimaryConflist)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, []byte(primaryConflist)) {
		t.Errorf("%s after uninstall is not the original:\n--- got\n%s\n--- want\n%s", c.PrimaryConflist, got, primaryConflist)
	}
	ents, err := os.ReadDir(c.CNIConfDir)
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != 1 {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Errorf("CNI conf dir holds %v, want only %s", names, filepath.Base(c.PrimaryConflist))
	}
	for _, name := range []string{"nftmesh-cni", "nftmesh-cni-standalone"} {
		if _, err := os.Lstat(filepath.Join(c.CNIBinDir, name)); !os.IsNotExist(err) {
			t.Errorf("%s still in the node's CNI bin dir after uninstall (%v)", name, err)
		}
	}

	pod := plainPod("after-uninstall")
	pod.Labels["e2e-run"] = "after-uninstall"
	p, d, err := c.createAndWait(ctx, pod, 60*time.Second)
	if err != nil {
		t.Fatalf("%v (%s)", err, podState(p))
	}
	t.Logf("plain pod after uninstall: Running in %v", d.Round(time.Millisecond))
	if err := c.deletePods(ctx, "default", "e2e-run=after-uninstall"); err != nil {
		t.Fatal(err)
	}
}
