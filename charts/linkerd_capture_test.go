package charts

import (
	"bytes"
	"encoding/json"
	"net/netip"
	"os"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nftmesh/nftmesh/cniplugin"
	"github.com/nftmesh/nftmesh/netlab"
	"github.com/nftmesh/nftmesh/podinfo"
	"github.com/nftmesh/nftmesh/podinfo/agentsock"
	"github.com/nftmesh/nftmesh/redirect"
	"github.com/nftmesh/nftmesh/testkit/nstest"
)

// The agent configured from what the chart renders for linkerd2-cni's
// values file (with other ports, UID and skip lists on top) writes a
// conflist entry under which the plugin's ADD, as the agent runs it,
// captures a Linkerd pod on those settings, on the backend iptablesMode
// names: inbound to the configured inbound port, the app's outbound to the
// configured outbound port, the proxy's configured UID, its admin port and
// the ignored outbound port left alone; UID 2102 (linkerd2-cni's default,
// not the proxy here) captured like any app. Real namespaces, real
// connections.
func TestLinkerdChartCapturesWithRenderedSettings(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("skipping: needs root (network namespaces, nftables)")
	}
	file := linkerdValuesFile(t)
	over := map[string]any{"inboundProxyPort": 7143, "outboundProxyPort": 7140, "proxyAdminPort": 5191,
		"proxyUID": 2103, "ignoreOutboundPorts": "443"}
	for _, mode := range []string{"nft", "legacy"} {
		t.Run(mode, func(t *testing.T) {
			over["iptablesMode"] = mode
			r := render(t, "-f", file, "-f", valuesFile(t, over))
			cfg := r.agentConfig(t)
			want := map[string]string{"nft": "nftables", "legacy": "iptables-legacy"}[mode]
			if cfg.Backend != want {
				t.Fatalf("backend %s, want %s", cfg.Backend, want)
			}
			topo, err := netlab.NewTopology(netlab.TopologyOptions{Prefix: "lkc-", Stack: netlab.StackIPv4,
				AppPorts: []uint16{7143, 7140, 5191, 9090}, PeerTCPPorts: []uint16{80, 443}})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = topo.Close() })
			ls, err := netlab.StartListeners(topo, netlab.ListenerOptions{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = ls.Close() })
			linkerdAdd(t, cfg.PluginConf().JSON(), topo)
			app := func(uid uint32, port uint16) netlab.Probe {
				return netlab.Probe{From: netlab.FromApp, UID: uid, GID: netlab.AppGID, Proto: redirect.ProtoTCP, Dst: netip.AddrPortFrom(netlab.OtherV4Host, port)}
			}
			peer := func(port uint16) netlab.Probe {
				return netlab.Probe{From: netlab.FromPeer, Proto: redirect.ProtoTCP, Dst: netip.AddrPortFrom(netlab.PodV4, port)}
			}
			for _, c := range []struct {
				p    netlab.Probe
				want string
			}{
				{peer(9090), netlab.AppListener(7143)},
				{peer(5191), netlab.AppListener(5191)},
				{app(netlab.AppUID, 80), netlab.AppListener(7140)},
				{app(2102, 80), netlab.AppListener(7140)},
				{app(2103, 80), netlab.PeerListener(netip.AddrPortFrom(netlab.OtherV4Host, 80))},
				{app(netlab.AppUID, 443), netlab.PeerListener(netip.AddrPortFrom(netlab.OtherV4Host, 443))},
			} {
				if got := topo.Probe(c.p); got.Landed != c.want {
					t.Errorf("%s landed %s, want %s", c.p, got.Landed, c.want)
				}
			}
		})
	}
}

// linkerdAdd runs the plugin's ADD (cniplugin.Run, as the agent runs it)
// for a Linkerd-injected pod in topo, under the conflist entry the agent
// writes (entry), its run dir moved to a temporary one.
func linkerdAdd(t *testing.T, entry []byte, topo *netlab.Topology) {
	t.Helper()
	var conf map[string]any
	if err := json.Unmarshal(entry, &conf); err != nil {
		t.Fatal(err)
	}
	conf["cniVersion"] = "1.0.0"
	conf["agent_run_dir"] = t.TempDir()
	conf["prevResult"] = map[string]any{"cniVersion": "1.0.0",
		"interfaces": []any{map[string]any{"name": topo.PodIface, "sandbox": topo.PodNetnsPath()}},
		"ips":        []any{map[string]any{"address": netip.PrefixFrom(netlab.PodV4, 24).String(), "interface": 0}}}
	stdin, err := json.Marshal(conf)
	if err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "emojivoto", Name: "web-1", UID: types.UID("u-" + nstest.RandHex(6))},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "web"}, {Name: "linkerd-proxy"}}}}
	ask := func(agentsock.Request) (agentsock.Answer, error) {
		m := podinfo.Mesh(pod)
		m.NamespaceAnnotations = map[string]string{} // the agent's namespace watch: no overrides
		return agentsock.Found(string(pod.UID), m), nil
	}
	id := "ctr-" + nstest.RandHex(6)
	env := map[string]string{"CNI_COMMAND": "ADD", "CNI_CONTAINERID": id, "CNI_NETNS": topo.PodNetnsPath(), "CNI_IFNAME": topo.PodIface, "CNI_PATH": "/opt/cni/bin",
		"CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAMESPACE=emojivoto;K8S_POD_NAME=web-1;K8S_POD_INFRA_CONTAINER_ID=" + id + ";K8S_POD_UID=" + string(pod.UID)}
	var out, errOut bytes.Buffer
	rc, err := cniplugin.Run(cniplugin.Env{Getenv: func(k string) string { return env[k] }, Stdin: bytes.NewReader(stdin), Stdout: &out, Stderr: &errOut, Ask: ask})
	if err != nil || rc != 0 {
		t.Fatalf("ADD: rc %d, %v\nstdout %s\nstderr %s", rc, err, out.String(), errOut.String())
	}
}
