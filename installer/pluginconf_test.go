package installer

import (
	"slices"
	"testing"

	"github.com/nftmesh/nftmesh/podinfo/cniconf"
)

// The entry the agent writes is read back by the plugin's own parser with
// every value intact, and its bytes (key order included) are the ones
// earlier agents wrote, so a restart does not rewrite the CNI config.
func TestPluginConfRoundTrip(t *testing.T) {
	c, err := ParseConfig([]string{"--service-account-dir=", "--exclude-namespaces=kube-system,istio-system", "--pod-namespace=nftmesh",
		"--agent-run-dir=/run/nm", "--backend=nftables", "--api-timeout=7s", "--log-level=warn"}, withEnv(nil))
	if err != nil {
		t.Fatal(err)
	}
	b := c.PluginConf().JSON()
	const want = `{"name":"nftmesh-cni","type":"nftmesh-cni","log_level":"warn","exclude_namespaces":["kube-system","istio-system"],"pod_namespace":"nftmesh","agent_run_dir":"/run/nm","kubeconfig":"/run/nm/kubeconfig","backend":"nftables","api_timeout":"7s"}`
	if string(b) != want {
		t.Errorf("entry\n got %s\nwant %s", b, want)
	}
	pc, err := cniconf.ParseConfig(b)
	if err != nil {
		t.Fatal(err)
	}
	if pc.LogLevel != "warn" || !slices.Equal(pc.ExcludeNamespaces, c.ExcludeNamespaces) || pc.PodNamespace != "nftmesh" ||
		pc.AgentRunDir != "/run/nm" || pc.Kubeconfig != "/run/nm/kubeconfig" || pc.Backend != "nftables" || pc.APITimeout != c.APITimeout ||
		pc.Type != PluginName || pc.Name != PluginName {
		t.Errorf("the plugin reads %+v from %s", pc, b)
	}
}
