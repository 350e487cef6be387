package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftmesh/nftmesh/installer/podevents"
	"github.com/nftmesh/nftmesh/testkit/kubetest"
	"github.com/nftmesh/nftmesh/testkit/nstest"
)

// TestAgentRunCallsReportInProcess: the calls the agent runs itself hand
// their decisions to its metrics and Events, and their lines to its log,
// in process. With the plugin's log file unwritable (a directory in its
// place: not even root can append to it) an ADD that captures and one
// whose annotation is invalid, both run by the agent, are counted by path
// and decision, the failed one gets its CaptureFailed Event, and both
// decision lines are in the agent's log as the plugin's. Before, the
// agent learned of its own calls only by reading that file back.
func TestAgentRunCallsReportInProcess(t *testing.T) {
	nstest.NeedRoot(t)
	api := kubetest.Start(t)
	front := buildFront(t)
	good := starvedPod(t, api)
	bad := good.DeepCopy()
	bad.Name, bad.UID, bad.ResourceVersion = good.Name+"-bad", "", ""
	bad.Annotations["traffic.sidecar.istio.io/excludeOutboundIPRanges"] = "10.0.0.0/33"
	bad, err := api.Client().CoreV1().Pods(bad.Namespace).Create(context.Background(), bad, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, nsPath := nstest.New(t, "inproc-")
	a := startNodeAgent(t, api, good.Spec.NodeName, func(h *fakeHost) {
		if err := os.MkdirAll(filepath.Join(h.run, "nftmesh-cni.log"), 0o755); err != nil {
			t.Fatal(err)
		}
	})
	if out, err := runFront(front, "ADD", nsPath, a.host.run, good); err != nil {
		t.Fatalf("ADD of %s: %v\n%s", good.Name, err, out)
	}
	if out, err := runFront(front, "ADD", nsPath, a.host.run, bad); err == nil || !strings.Contains(out, "10.0.0.0/33") {
		t.Fatalf("ADD of %s with an invalid annotation: %v, want its CNI error\n%s", bad.Name, err, out)
	}
	a.node.waitMetrics(t, a.metrics,
		`nftmesh_agent_socket_cni_calls_total{outcome="error"} 1`,
		`nftmesh_agent_socket_cni_calls_total{outcome="ok"} 1`,
		`nftmesh_plugin_events_total{command="ADD",decision="capture"} 1`,
		`nftmesh_plugin_events_total{command="ADD",decision="error"} 1`,
		`nftmesh_cni_add_duration_by_path_seconds_count{path="agent"} 2`,
		`nftmesh_cni_pod_lookups_total{command="ADD",path="agent"} 2`)

	deadline := time.Now().Add(10 * time.Second)
	for {
		evs, err := api.Client().CoreV1().Events(bad.Namespace).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if captureFailed(evs.Items, bad) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s Event on %s/%s: %+v", podevents.ReasonCaptureFailed, bad.Namespace, bad.Name, evs.Items)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, want := range []struct{ pod, decision string }{{good.Name, "capture"}, {bad.Name, "error"}} {
		if !hasPluginLine(a.logs.String(), want.pod, want.decision) {
			t.Errorf("the agent's log has no plugin line deciding %s for %s:\n%s", want.decision, want.pod, a.logs.String())
		}
	}
}

func captureFailed(evs []corev1.Event, pod *corev1.Pod) bool {
	for _, e := range evs {
		if e.Reason == podevents.ReasonCaptureFailed && e.InvolvedObject.Name == pod.Name &&
			e.Source.Component == podevents.Component && strings.Contains(e.Message, "run by the agent") {
			return true
		}
	}
	return false
}

// hasPluginLine reports whether logs holds the plugin's decision line for
// pod, as the agent re-emits the standalone plugin's: component
// cni-plugin, once.
func hasPluginLine(logs, pod, decision string) bool {
	for _, l := range strings.Split(logs, "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) == nil && m["component"] == "cni-plugin" && m["pod"] == pod &&
			m["decision"] == decision && m["ran_by"] == "agent" && m["plugin"] == "nftmesh-cni" && strings.Count(l, `"component"`) == 1 {
			return true
		}
	}
	return false
}
