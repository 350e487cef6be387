package repair

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/nftmesh/nftmesh/podinfo"
	"github.com/nftmesh/nftmesh/podinfo/meshpod"
	"github.com/nftmesh/nftmesh/testkit/istiotest"
	"github.com/nftmesh/nftmesh/testkit/kubetest"
)

// slimTestPods are every sample pod and every pod template Istio's injector
// wrote, each with the status a broken pod has (validation exited 126), an
// owner, a deletion time and fields the agent never reads filled in.
func slimTestPods(t *testing.T) []*corev1.Pod {
	t.Helper()
	var pods []*corev1.Pod
	files, _ := filepath.Glob(filepath.Join("..", "testdata", "pods", "*"))
	for _, f := range files {
		p, err := kubetest.ReadPodFile(f)
		if err != nil {
			continue // the deliberately bad samples
		}
		pods = append(pods, p)
	}
	injected, _ := filepath.Glob(filepath.Join(istiotest.TestdataDir(), "injected", "*.yaml"))
	for _, f := range injected {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		objs, err := istiotest.SplitManifests(data)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range objs {
			if meta, spec, err := istiotest.PodTemplate(o); err == nil {
				meta.Name, meta.Namespace = filepath.Base(f), "shop"
				pods = append(pods, &corev1.Pod{ObjectMeta: meta, Spec: spec})
			}
		}
	}
	if len(injected) == 0 || len(pods) < len(injected) {
		t.Fatalf("found %d pods (%d injected manifests): testdata missing", len(pods), len(injected))
	}
	now := metav1.Now()
	for i, p := range pods {
		p.UID = types.UID("uid-" + p.Name)
		p.ResourceVersion = "42"
		p.DeletionTimestamp = &now
		p.OwnerReferences = []metav1.OwnerReference{{Kind: "ReplicaSet", Name: "rs", UID: "rs-uid"}}
		p.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubelet", Operation: metav1.ManagedFieldsOperationUpdate}}
		p.Spec.NodeName = "node-1"
		p.Spec.HostNetwork = i%5 == 4
		p.Status = corev1.PodStatus{
			Phase:  corev1.PodPending,
			PodIP:  "10.0.0.5",
			PodIPs: []corev1.PodIP{{IP: "10.0.0.5"}, {IP: "fd00::5"}},
			InitContainerStatuses: []corev1.ContainerStatus{{
				Name:                 "istio-validation",
				Image:                "proxyv2",
				State:                corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}},
				LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 126, Message: "iptables rules are not set"}},
			}},
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionFalse}},
		}
	}
	return pods
}

// TestSlimPodKeepsWhatTheAgentReads: every decision the agent makes from a
// cached pod (in mesh, capture spec, broken, host network, repair
// preconditions) is the same on the slimmed pod as on the full one, and
// injected pods shrink.
func TestSlimPodKeepsWhatTheAgentReads(t *testing.T) {
	cfg := Config{InitContainerName: "istio-validation", InitContainerExitCode: 126,
		InitContainerTerminationMessage: "iptables", SidecarAnnotation: "sidecar.istio.io/status"}
	appFields := 0 // containers other than the proxy with args or env
	for _, pod := range slimTestPods(t) {
		t.Run(pod.Name, func(t *testing.T) {
			orig := pod.DeepCopy()
			obj, err := SlimPod(pod)
			if err != nil {
				t.Fatal(err)
			}
			slim := obj.(*corev1.Pod)
			if !reflect.DeepEqual(pod, orig) {
				t.Fatal("SlimPod changed its argument")
			}
			// The decision's input, less what it never reads: the
			// arguments, environment and user of containers other than
			// the proxy.
			want := podinfo.Mesh(pod)
			for _, cs := range [][]meshpod.Container{want.InitContainers, want.Containers} {
				for i := range cs {
					if cs[i].Name != meshpod.ProxyContainer {
						if cs[i].Args != nil || cs[i].Env != nil {
							appFields++
						}
						cs[i] = meshpod.Container{Name: cs[i].Name}
					}
				}
			}
			if got := podinfo.Mesh(slim); !reflect.DeepEqual(got, want) {
				t.Errorf("decision input differs:\n got %+v\nwant %+v", got, want)
			}
			in1, r1, s1, e1 := podinfo.FromPod(pod)
			in2, r2, s2, e2 := podinfo.FromPod(slim)
			if in1 != in2 || r1 != r2 || !reflect.DeepEqual(s1, s2) || fmt.Sprint(e1) != fmt.Sprint(e2) {
				t.Errorf("FromPod differs: (%v %q %v) vs (%v %q %v)", in1, r1, e1, in2, r2, e2)
			}
			if Broken(slim, cfg) != Broken(pod, cfg) {
				t.Errorf("BrokenPod: slim %v, full %v", Broken(slim, cfg), Broken(pod, cfg))
			}
			if slim.UID != pod.UID || slim.ResourceVersion != pod.ResourceVersion || slim.Spec.HostNetwork != pod.Spec.HostNetwork ||
				!slim.DeletionTimestamp.Equal(pod.DeletionTimestamp) || !reflect.DeepEqual(slim.OwnerReferences, pod.OwnerReferences) ||
				slim.Spec.NodeName != pod.Spec.NodeName || slim.Status.Phase != pod.Status.Phase {
				t.Errorf("identity or preconditions lost: %+v", slim.ObjectMeta)
			}
			if slim.ManagedFields != nil || slim.Status.Conditions != nil || slim.Status.InitContainerStatuses[0].Image != "" {
				t.Error("fields the agent never reads were kept")
			}
			// SlimPod of a slim pod changes nothing (the list slims, then
			// the informer's transform runs again).
			again, _ := SlimPod(slim)
			if !reflect.DeepEqual(again, slim) {
				t.Error("SlimPod is not idempotent")
			}
			full, _ := json.Marshal(pod)
			small, _ := json.Marshal(slim)
			if len(pod.Spec.Volumes) > 0 && len(small)*5 > len(full)*3 {
				t.Errorf("slimmed pod is %d bytes of %d: want at most 60%%", len(small), len(full))
			}
		})
	}
	if appFields == 0 {
		t.Error("no sample pod has a container other than the proxy with arguments or environment")
	}
	tomb := cache.DeletedFinalStateUnknown{Key: "a/b"}
	if got, err := SlimPod(tomb); err != nil || got != tomb {
		t.Errorf("a tombstone came back as %v, %v", got, err)
	}
}

// TestListSlimPodsPages: a list that starts is asked for in pages of
// listPageSize at the version the reflector asked (resourceVersion "0",
// which the API server serves from its watch cache, not a read of etcd at
// the most recent version), continue tokens are followed,
// every pod comes back slimmed in order with the first page's version, and
// an error on any page is the result (never a partial list).
func TestListSlimPodsPages(t *testing.T) {
	pods := slimTestPods(t)
	mk := func(n int) []corev1.Pod {
		out := make([]corev1.Pod, n)
		for i := range out {
			out[i] = *pods[i%len(pods)].DeepCopy()
			out[i].Name = fmt.Sprintf("p-%03d", i)
		}
		return out
	}
	all := mk(2*listPageSize + 7)
	var calls []metav1.ListOptions
	failAt := -1
	list := func(_ context.Context, o metav1.ListOptions) (*corev1.PodList, error) {
		calls = append(calls, o)
		if len(calls)-1 == failAt {
			return nil, errors.New("410 Gone: continue token expired")
		}
		start := 0
		if o.Continue != "" {
			fmt.Sscanf(o.Continue, "at-%d", &start)
		}
		end := min(start+int(o.Limit), len(all))
		if o.Limit == 0 {
			end = len(all)
		}
		l := &corev1.PodList{ListMeta: metav1.ListMeta{ResourceVersion: fmt.Sprint(100 + len(calls))}, Items: all[start:end]}
		if end < len(all) {
			l.Continue = fmt.Sprintf("at-%d", end)
		}
		return l, nil
	}
	got, err := ListSlimPods(context.Background(), list, metav1.ListOptions{ResourceVersion: "0", Limit: 500, FieldSelector: "spec.nodeName=node-1"})
	if err != nil {
		t.Fatal(err)
	}
	if len(calls) != 3 {
		t.Fatalf("%d requests, want 3 pages of %d: %+v", len(calls), listPageSize, calls)
	}
	for i, c := range calls {
		wantRV := "0" // the first page: from the watch cache
		if i > 0 {
			wantRV = "" // the continue token pins the version
		}
		if c.Limit != listPageSize || c.ResourceVersion != wantRV || c.FieldSelector != "spec.nodeName=node-1" || (i > 0) != (c.Continue != "") {
			t.Errorf("request %d: %+v", i, c)
		}
	}
	if len(got.Items) != len(all) || got.ResourceVersion != "101" || got.Continue != "" {
		t.Fatalf("got %d pods at version %q (continue %q), want %d at 101", len(got.Items), got.ResourceVersion, got.Continue, len(all))
	}
	for i := range got.Items {
		want, _ := SlimPod(&all[i])
		if !reflect.DeepEqual(&got.Items[i], want) {
			t.Fatalf("pod %d is not the slimmed %s", i, all[i].Name)
		}
	}

	// A relist at the version last seen: that version and its match on
	// the first page only (the API server refuses either beside a
	// continue token).
	calls = nil
	if _, err := ListSlimPods(context.Background(), list, metav1.ListOptions{ResourceVersion: "42", ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan}); err != nil {
		t.Fatal(err)
	}
	for i, c := range calls {
		if (i == 0) != (c.ResourceVersion == "42" && c.ResourceVersionMatch == metav1.ResourceVersionMatchNotOlderThan) || (i > 0 && (c.ResourceVersion != "" || c.ResourceVersionMatch != "")) {
			t.Errorf("relist request %d: version %q match %q continue %q", i, c.ResourceVersion, c.ResourceVersionMatch, c.Continue)
		}
	}

	calls, failAt = nil, 1
	if l, err := ListSlimPods(context.Background(), list, metav1.ListOptions{}); err == nil || !strings.Contains(err.Error(), "expired") || l != nil {
		t.Errorf("failed second page: got %v, %v; want the error and no list", l, err)
	}

	calls, failAt = nil, -1
	got, err = ListSlimPods(context.Background(), list, metav1.ListOptions{Limit: 50, Continue: "at-10"})
	if err != nil || len(calls) != 1 || len(got.Items) != 50 || got.Continue != "at-60" {
		t.Errorf("a continued list: %d requests, %d pods, continue %q, %v; want one request passed through", len(calls), len(got.Items), got.Continue, err)
	}
}
