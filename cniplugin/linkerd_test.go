package cniplugin

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/nftmesh/nftmesh/podinfo/agentsock"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftmesh/nftmesh/installer/podcache"
	"github.com/nftmesh/nftmesh/netlab"
	"github.com/nftmesh/nftmesh/podinfo/meshpod"
	"github.com/nftmesh/nftmesh/redirect"
	"github.com/nftmesh/nftmesh/testkit/nstest"
)

// TestLinkerdAddByAgent: with the agent up and its Linkerd watches synced,
// a Linkerd pod's ADD is run by the agent (which never reads the API for a
// call: it declines instead) with no pod read either, and the rules honour
// the node's settings from the conflist and the namespace's annotation the
// pod lacks. Without the watches the agent declines the call, and the
// standalone plugin reads the namespace itself: the same capture.
func TestLinkerdAddByAgent(t *testing.T) {
	needEnv(t)
	ctx := context.Background()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "lk-agent",
		Annotations: map[string]string{meshpod.AnnotationLinkerdSkipOutboundPorts: "443"}}}
	if _, err := env.api.Client().CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	grantLinkerdReads(t)
	node := meshpod.DefaultLinkerd()
	node.IncomingProxyPort = 8081 // a listener netlab runs: where inbound must land
	pod := createPod(t, env.api, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "lk-agent", Name: "web"},
		Spec: corev1.PodSpec{NodeName: testNode, Containers: []corev1.Container{{Name: "web"}, {Name: meshpod.LinkerdProxyContainer}}}})

	for _, withWatches := range []bool{true, false} {
		name := map[bool]string{true: "agent-with-watches", false: "agent-declines"}[withWatches]
		t.Run(name, func(t *testing.T) {
			runDir := agentRunDir(t, env.token)
			var ws []*podcache.Watches
			if withWatches {
				ws = append(ws, podcache.NewWatches(env.api.Client().CoreV1()))
			}
			ag := startAgent(t, runDir, ws...)
			if withWatches {
				waitLinkerdFacts(t, ws[0])
			}
			topo, err := netlab.NewTopology(netlab.TopologyOptions{Prefix: "lka-", Stack: netlab.StackIPv4})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = topo.Close() })
			ls, err := netlab.StartListeners(topo, netlab.ListenerOptions{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = ls.Close() })
			id := "ctr-" + nstest.RandHex(6)
			prev := map[string]any{"cniVersion": "1.0.0", "interfaces": []any{map[string]any{"name": topo.PodIface, "sandbox": topo.PodNetnsPath()}},
				"ips": []any{map[string]any{"address": netip.PrefixFrom(netlab.PodV4, 24).String(), "interface": 0}}}
			ok0, declined0 := ag.calls(agentsock.OutcomeOK), ag.calls(agentsock.OutcomeDeclined)
			out, stderr, err := execPlugin("ADD", topo.PodNetnsPath(), id, cniArgsFor(pod, id), directConf(t, "1.0.0", runDir, prev, map[string]any{"linkerd": node}))
			if err != nil {
				t.Fatalf("ADD: %v\nstdout %s\nstderr %s", err, out, stderr)
			}
			if withWatches {
				if n := ag.callsReach(agentsock.OutcomeOK, ok0+1); n != ok0+1 || ag.calls(agentsock.OutcomeDeclined) != declined0 || ag.gets.Load() != 0 {
					t.Fatalf("agent ran %d calls, declined %d, read %d pods: want the ADD run by the agent from its caches", n-ok0, ag.calls(agentsock.OutcomeDeclined)-declined0, ag.gets.Load())
				}
			} else if n := ag.callsReach(agentsock.OutcomeDeclined, declined0+1); n != declined0+1 {
				t.Fatalf("agent declined %d calls, want 1 (it has no namespace annotations)", n-declined0)
			}
			checkLinkerdLanding(t, topo)
		})
	}
}

// grantLinkerdReads gives the plugin's account what a Linkerd pod's
// standalone ADD reads besides the pod (the chart's Linkerd profile must
// grant the same): namespaces, and the kubernetes Service.
func grantLinkerdReads(t *testing.T) {
	rules := []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"namespaces"}, Verbs: []string{"get"}}}
	ctx := context.Background()
	const name = "nftmesh-cni-linkerd"
	if _, err := env.api.Client().RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: rules}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := env.api.Client().RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: agentNS, Name: "nftmesh-cni"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	env.api.WaitAllowed(t, agentNS, "nftmesh-cni", "", rules...)
}

func waitLinkerdFacts(t *testing.T, w *podcache.Watches) {
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, okNS := w.NamespaceAnnotations("lk-agent")
		_, okAPI := w.APIServerPorts()
		if okNS && okAPI {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the Linkerd watches did not sync")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// checkLinkerdLanding: the app's outbound on the proxy's 4140 (netlab's
// app listener there is absent: refused proves the redirect's port), 443
// skipped by the namespace's annotation, inbound on the node's port.
func checkLinkerdLanding(t *testing.T, topo *netlab.Topology) {
	app := func(port uint16) netlab.Probe {
		return netlab.Probe{From: netlab.FromApp, UID: netlab.AppUID, GID: netlab.AppGID, Proto: redirect.ProtoTCP, Dst: netip.AddrPortFrom(netlab.OtherV4Host, port)}
	}
	for _, c := range []struct {
		p    netlab.Probe
		want string
	}{
		{app(443), netlab.PeerListener(netip.AddrPortFrom(netlab.OtherV4Host, 443))},
		{app(80), netlab.LandedRefused}, // redirected to 4140, where nothing listens
		{netlab.Probe{From: netlab.FromPeer, Proto: redirect.ProtoTCP, Dst: netip.AddrPortFrom(netlab.PodV4, 9090)}, netlab.AppListener(8081)},
	} {
		if got := topo.Probe(c.p); got.Landed != c.want {
			t.Errorf("%s landed %s, want %s", c.p, got, c.want)
		}
	}
}
