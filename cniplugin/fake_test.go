package cniplugin

// The CNI verbs, driven in-process through skel's dispatcher against a
// local HTTP server playing the API server and capturetest's in-memory
// kernel: every decision of ADD, CHECK and DEL without root. The chain
// tests prove the same verbs on real namespaces with real traffic.

import (
	"encoding/json"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	corev1 "k8s.io/api/core/v1"

	"github.com/nftmesh/nftmesh/capture"
	"github.com/nftmesh/nftmesh/podinfo/meshpod"
	"github.com/nftmesh/nftmesh/redirect"
	"github.com/nftmesh/nftmesh/testkit/capturetest"
)

const fakeNetns = "/run/netns/cni-fake-pod"

// fakeNode is one node for the in-process verbs: a fake kernel holding
// the pod's namespace (addresses as the kernel lists them, IPv4 first),
// an agent run dir whose kubeconfig reaches a local server answering with
// pod, and the pod's CNI_ARGS.
type fakeNode struct {
	t      *testing.T
	kernel *capturetest.Fake
	runDir string
	pod    *corev1.Pod
	args   string
	// extra plugin config fields.
	conf map[string]any
}

func newFakeNode(t *testing.T, pod *corev1.Pod) *fakeNode {
	t.Helper()
	f := capturetest.New()
	f.AddNetns(fakeNetns, netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("198.51.100.20"), netip.MustParseAddr("::1"), netip.MustParseAddr("2001:db8::20"))
	old := pipeline
	pipeline = f.Pipeline()
	t.Cleanup(func() { pipeline = old })
	if pod.UID == "" {
		pod.UID = "uid-fake-1"
	}
	runDir, _ := fakeAPIRunDir(t, servePod(t, pod))
	return &fakeNode{t: t, kernel: f, runDir: runDir, pod: pod, args: cniArgsFor(pod, "ctr-fake"), conf: map[string]any{"backend": "auto"}}
}

// run runs one verb with a CNI 1.0.0 config and a prevResult.
func (n *fakeNode) run(verb string) (string, *types.Error) {
	n.t.Helper()
	return n.runConf(verb, directConf(n.t, "1.0.0", n.runDir, prevResultV4("1.0.0", "198.51.100.20/24"), n.conf))
}

func (n *fakeNode) runConf(verb string, conf []byte) (string, *types.Error) {
	n.t.Helper()
	vars := cniVars(verb, fakeNetns, "ctr-fake", n.args)
	// skel checks that CNI_NETNS exists; the namespace lives in the fake.
	vars["CNI_NETNS_OVERRIDE"] = "1"
	return runSkel(n.t, vars, conf)
}

// plan is what the pod should get, decided independently of the plugin
// from the pod object and the namespace's address families.
func (n *fakeNode) plan(ipv6 bool) redirect.Plan {
	return wantPlan(n.t, n.pod, ipv6)
}

// applies counts the Apply calls the fake's backends saw.
func (n *fakeNode) applies() int {
	c := 0
	for _, call := range n.kernel.Calls() {
		if strings.HasPrefix(call, capturetest.OpApply+" ") {
			c++
		}
	}
	return c
}

// decisions are the decision lines the verbs logged, as "VERB decision".
func (n *fakeNode) decisions() []string {
	n.t.Helper()
	data, err := os.ReadFile(filepath.Join(n.runDir, LogFileName))
	if err != nil {
		n.t.Fatal(err)
	}
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		var e struct{ Decision, Message string }
		if json.Unmarshal([]byte(l), &e) == nil && e.Decision != "" {
			out = append(out, strings.Fields(e.Message)[0]+" "+e.Decision)
		}
	}
	return out
}

func wantCode(t *testing.T, verb string, err *types.Error, code uint) {
	t.Helper()
	if err == nil || err.Code != code {
		t.Fatalf("%s = %v, want CNI code %d", verb, err, code)
	}
}

func noErr(t *testing.T, verb string, err *types.Error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", verb, err)
	}
}

// samePrevResult checks that ADD printed the primary plugin's result.
func samePrevResult(t *testing.T, stdout string) {
	t.Helper()
	var got struct {
		CNIVersion string `json:"cniVersion"`
		IPs        []struct{ Address string }
		Interfaces []struct{ Name, Sandbox string }
	}
	if err := json.Unmarshal([]byte(stdout), &got); err != nil {
		t.Fatalf("ADD printed %q: %v", stdout, err)
	}
	if got.CNIVersion != "1.0.0" || len(got.IPs) != 1 || got.IPs[0].Address != "198.51.100.20/24" ||
		len(got.Interfaces) != 1 || got.Interfaces[0].Sandbox != "/run/netns/x" {
		t.Errorf("ADD printed %s, not the prevResult", stdout)
	}
}

// TestFakeMeshPod: ADD programs the pod's plan (IPv4 only: the kernel
// lists IPv4 first and the sidecar is not dual-stack) and passes the
// prevResult on; CHECK passes; DEL removes everything; DEL again, and DEL
// once the namespace is gone, succeed.
func TestFakeMeshPod(t *testing.T) {
	n := newFakeNode(t, injectedPod(t))
	stdout, err := n.run("ADD")
	noErr(t, "ADD", err)
	samePrevResult(t, stdout)
	want := n.plan(false)
	if got := n.kernel.Backends(fakeNetns); !slices.Equal(got, []string{capture.NFTables}) {
		t.Fatalf("ADD programmed %v, want nftables", got)
	}
	if d := redirect.Diff(want, n.kernel.Holds(fakeNetns, capture.NFTables)); len(d) > 0 {
		t.Fatalf("ADD programmed another plan:\n%s", strings.Join(d, "\n"))
	}
	text, rerr := capture.RenderNft(want)
	if rerr != nil {
		t.Fatal(rerr)
	}
	if got := n.kernel.Dump(fakeNetns); got != "# nftables\n"+text {
		t.Errorf("namespace holds:\n%s\nwant:\n%s", got, text)
	}
	_, err = n.run("CHECK")
	noErr(t, "CHECK", err)
	_, err = n.run("DEL")
	noErr(t, "DEL", err)
	if d := n.kernel.Dump(fakeNetns); d != "" {
		t.Errorf("DEL left:\n%s", d)
	}
	_, err = n.run("DEL")
	noErr(t, "DEL of nothing", err)
	n.kernel.DeleteNetns(fakeNetns)
	_, err = n.run("DEL")
	noErr(t, "DEL after the namespace went", err)
	if got, want := n.decisions(), []string{"ADD capture", "CHECK capture", "DEL remove", "DEL skip", "DEL skip"}; !slices.Equal(got, want) {
		t.Errorf("decisions %v, want %v", got, want)
	}
}

// TestFakeDualStackSidecar: a dual-stack sidecar in a namespace with an
// IPv6 address gets IPv6 capture, decided from the namespace's addresses.
func TestFakeDualStackSidecar(t *testing.T) {
	pod := injectedPod(t)
	for i := range pod.Spec.Containers {
		if pod.Spec.Containers[i].Name == meshpod.ProxyContainer {
			pod.Spec.Containers[i].Env = append(pod.Spec.Containers[i].Env, corev1.EnvVar{Name: meshpod.EnvDualStack, Value: "true"})
		}
	}
	n := newFakeNode(t, pod)
	_, err := n.run("ADD")
	noErr(t, "ADD", err)
	if d := redirect.Diff(n.plan(true), n.kernel.Holds(fakeNetns, capture.NFTables)); len(d) > 0 {
		t.Fatalf("ADD programmed another plan:\n%s", strings.Join(d, "\n"))
	}
}

// TestFakeNotInMesh: a pod without a sidecar is let through untouched
// with the prevResult; CHECK passes while the namespace holds nothing of
// ours and fails once it does.
func TestFakeNotInMesh(t *testing.T) {
	n := newFakeNode(t, loadPod(t, "no-sidecar.yaml"))
	stdout, err := n.run("ADD")
	noErr(t, "ADD", err)
	samePrevResult(t, stdout)
	if n.applies() != 0 || n.kernel.Dump(fakeNetns) != "" {
		t.Fatalf("ADD of a pod without a sidecar programmed: %v", n.kernel.Calls())
	}
	_, err = n.run("CHECK")
	noErr(t, "CHECK", err)
	n.kernel.Install(fakeNetns, capture.NFTables, wantPlan(t, injectedPod(t), false))
	_, err = n.run("CHECK")
	wantCode(t, "CHECK with rules of ours", err, CodeDrift)
}

// TestFakeBadAnnotation: an invalid annotation fails ADD closed with code
// 101, naming the annotation and the value; nothing is programmed.
func TestFakeBadAnnotation(t *testing.T) {
	pod := injectedPod(t)
	pod.Annotations[redirect.AnnotationExcludeOutboundIPRanges] = "10.0.0.0/33"
	n := newFakeNode(t, pod)
	stdout, err := n.run("ADD")
	wantCode(t, "ADD", err, CodeInvalidCapture)
	for _, s := range []string{redirect.AnnotationExcludeOutboundIPRanges, "10.0.0.0/33"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not name %s", err, s)
		}
	}
	if !strings.Contains(stdout, `"code": 101`) && !strings.Contains(stdout, `"code":101`) {
		t.Errorf("stdout %q is not the CNI error", stdout)
	}
	if n.applies() != 0 {
		t.Errorf("ADD with a bad annotation programmed: %v", n.kernel.Calls())
	}
	_, err = n.run("CHECK")
	wantCode(t, "CHECK", err, CodeInvalidCapture)
}

// TestFakeApplyFails: a failed Apply fails ADD with code 102 and leaves
// nothing, even when the kernel took part of the write.
func TestFakeApplyFails(t *testing.T) {
	n := newFakeNode(t, injectedPod(t))
	n.kernel.FailApply("", errors.New("netlink receive: no buffer space available"), true)
	_, err := n.run("ADD")
	wantCode(t, "ADD", err, CodeApply)
	if !strings.Contains(err.Error(), "no buffer space") {
		t.Errorf("error %q does not carry the cause", err)
	}
	if d := n.kernel.Dump(fakeNetns); d != "" {
		t.Errorf("a failed ADD left:\n%s", d)
	}
}

// TestFakeUserNamespacedLegacy: backend iptables-legacy for a pod with
// hostUsers: false fails ADD with code 104 (no retry can help).
func TestFakeUserNamespacedLegacy(t *testing.T) {
	n := newFakeNode(t, injectedPod(t))
	n.conf["backend"] = capture.Legacy
	n.kernel.SetForeign(fakeNetns, capturetest.Foreign{UserNamespaced: true})
	_, err := n.run("ADD")
	wantCode(t, "ADD", err, CodeBackendUnsupported)
	if n.applies() != 0 {
		t.Errorf("programmed: %v", n.kernel.Calls())
	}
}

// TestFakeDrift: CHECK fails with code 103 when a rule was changed behind
// the plugin's back, and when another installer's capture sits next to
// ours; an unreadable namespace is an I/O error, not drift.
func TestFakeDrift(t *testing.T) {
	n := newFakeNode(t, injectedPod(t))
	_, err := n.run("ADD")
	noErr(t, "ADD", err)
	n.kernel.Tamper(fakeNetns, capture.NFTables, func(p *redirect.Plan) {
		c := &p.Tables[0].Chains[0]
		c.Rules = c.Rules[1:]
	})
	_, err = n.run("CHECK")
	wantCode(t, "CHECK after tampering", err, CodeDrift)
	if !strings.Contains(err.Details, "- rule nat-prerouting") {
		t.Errorf("drift %q does not name the missing rule", err.Details)
	}

	_, err = n.run("ADD")
	noErr(t, "ADD again", err)
	_, err = n.run("CHECK")
	noErr(t, "CHECK after ADD again", err)
	n.kernel.SetForeign(fakeNetns, capturetest.Foreign{LegacyChains: []string{"ipv4 nat ISTIO_OUTPUT"}})
	_, err = n.run("CHECK")
	wantCode(t, "CHECK beside Istio's chains", err, CodeDrift)
	if !strings.Contains(err.Details, "iptables-legacy ipv4 nat ISTIO_OUTPUT") {
		t.Errorf("error %q does not name the foreign chain", err.Details)
	}

	n.kernel.SetForeign(fakeNetns, capturetest.Foreign{})
	n.kernel.FailList("", errors.New("permission denied"))
	_, err = n.run("CHECK")
	wantCode(t, "CHECK of an unreadable namespace", err, types.ErrIOFailure)
}

// TestFakeDelEveryBackend: DEL removes ours from every backend that holds
// it (rules split across both worlds by hand or an older version), the
// TPROXY routes included; a failed removal is an I/O error, and the rules
// stay for the runtime's retry.
func TestFakeDelEveryBackend(t *testing.T) {
	n := newFakeNode(t, injectedPod(t))
	tproxy := wantPlan(t, injectedPod(t), false)
	tproxy.Routes = []redirect.PolicyRoute{{Family: redirect.FamilyIPv4, Mark: redirect.TProxyMark, Table: redirect.TProxyRouteTab}}
	n.kernel.Install(fakeNetns, capture.NFTables, tproxy)
	n.kernel.Install(fakeNetns, capture.Legacy, tproxy)

	n.kernel.FailRemove(capture.Legacy, errors.New("device or resource busy"))
	_, err := n.run("DEL")
	wantCode(t, "DEL with a failing backend", err, types.ErrIOFailure)
	if got := n.kernel.Backends(fakeNetns); !slices.Contains(got, capture.Legacy) {
		t.Errorf("after a failed DEL the legacy rules are gone: %v", got)
	}

	n.kernel.Heal()
	_, err = n.run("DEL")
	noErr(t, "DEL", err)
	if d := n.kernel.Dump(fakeNetns); d != "" {
		t.Errorf("DEL left:\n%s", d)
	}
}

// TestFakeHostNetns: CNI_NETNS naming the host's namespace is refused for
// every verb before any backend is asked anything.
func TestFakeHostNetns(t *testing.T) {
	n := newFakeNode(t, injectedPod(t))
	n.kernel.DeleteNetns(fakeNetns)
	if err := n.kernel.AddHostNetns(fakeNetns); err != nil {
		t.Skip(err)
	}
	for _, verb := range []string{"ADD", "CHECK", "DEL"} {
		_, err := n.run(verb)
		wantCode(t, verb, err, types.ErrInvalidEnvironmentVariables)
		if !strings.Contains(err.Msg, "host's network namespace") {
			t.Errorf("%s: %q", verb, err.Msg)
		}
	}
	if c := n.kernel.Calls(); len(c) != 0 {
		t.Errorf("backends were asked about the host's namespace: %v", c)
	}
}

// TestFakePrevResultVersions: ADD prints the prevResult in the config's
// version for every version the plugin speaks, and an empty result when
// there is none; a pod in the mesh and one that is not alike.
func TestFakePrevResultVersions(t *testing.T) {
	for _, file := range []string{"injected.yaml", "no-sidecar.yaml"} {
		for _, v := range []string{"0.3.1", "0.4.0", "1.0.0", "1.1.0"} {
			t.Run(file+"/"+v, func(t *testing.T) {
				pod := loadPod(t, file)
				n := newFakeNode(t, pod)
				stdout, err := n.runConf("ADD", directConf(t, v, n.runDir, prevResultV4(v, "198.51.100.20/24"), n.conf))
				noErr(t, "ADD", err)
				var got map[string]any
				if jerr := json.Unmarshal([]byte(stdout), &got); jerr != nil {
					t.Fatalf("ADD printed %q: %v", stdout, jerr)
				}
				ips, _ := got["ips"].([]any)
				if got["cniVersion"] != v || len(ips) != 1 || !strings.Contains(stdout, "198.51.100.20/24") {
					t.Errorf("ADD printed %s", stdout)
				}
				n.kernel.DeleteNetns(fakeNetns)
				n.kernel.AddNetns(fakeNetns, netip.MustParseAddr("198.51.100.20"))
				stdout, err = n.runConf("ADD", directConf(t, v, n.runDir, nil, n.conf))
				noErr(t, "ADD without prevResult", err)
				var empty map[string]any
				if jerr := json.Unmarshal([]byte(stdout), &empty); jerr != nil || empty["cniVersion"] != v || empty["ips"] != nil {
					t.Errorf("ADD without prevResult printed %s (%v)", stdout, jerr)
				}
			})
		}
	}
}

// TestFakePrevResultAsGiven: a prevResult already in the config's version
// is printed as the runtime gave it, fields this plugin does not know
// included (nothing of the primary plugin's is lost); one of another
// version is converted to the config's, as the CNI library does.
func TestFakePrevResultAsGiven(t *testing.T) {
	pod := loadPod(t, "injected.yaml")
	n := newFakeNode(t, pod)
	prev := prevResultV4("1.0.0", "198.51.100.20/24")
	prev["dns"] = map[string]any{"nameservers": []any{"10.96.0.10"}}
	prev["x-primary-extension"] = map[string]any{"kept": true}
	stdout, err := n.runConf("ADD", directConf(t, "1.0.0", n.runDir, prev, n.conf))
	noErr(t, "ADD", err)
	var got, want map[string]any
	if jerr := json.Unmarshal([]byte(stdout), &got); jerr != nil {
		t.Fatalf("ADD printed %q: %v", stdout, jerr)
	}
	b, _ := json.Marshal(prev)
	_ = json.Unmarshal(b, &want)
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ADD printed\n%s\nwant the prevResult as given\n%s", stdout, b)
	}

	n.kernel.DeleteNetns(fakeNetns)
	n.kernel.AddNetns(fakeNetns, netip.MustParseAddr("198.51.100.20"))
	stdout, err = n.runConf("ADD", directConf(t, "1.1.0", n.runDir, prevResultV4("1.0.0", "198.51.100.20/24"), n.conf))
	noErr(t, "ADD with a 1.0.0 prevResult in a 1.1.0 config", err)
	got = nil
	if jerr := json.Unmarshal([]byte(stdout), &got); jerr != nil || got["cniVersion"] != "1.1.0" || !strings.Contains(stdout, "198.51.100.20/24") {
		t.Errorf("ADD printed %s (%v), want the result as 1.1.0", stdout, jerr)
	}
}

// TestFakeDelAfterBackendChange: DEL removes ours from every backend
// whatever backend the config names, so a sandbox programmed before the
// config changed backend can be set up again in the same namespace (the
// new backend refuses to add rules beside the old one's).
func TestFakeDelAfterBackendChange(t *testing.T) {
	n := newFakeNode(t, injectedPod(t))
	n.conf["backend"] = capture.Legacy
	_, err := n.run("ADD")
	noErr(t, "ADD with iptables-legacy", err)
	n.conf["backend"] = capture.NFTables
	_, err = n.run("ADD")
	wantCode(t, "ADD with nftables beside the legacy rules", err, CodeApply)
	_, err = n.run("DEL")
	noErr(t, "DEL", err)
	if d := n.kernel.Dump(fakeNetns); d != "" {
		t.Fatalf("DEL with backend nftables left:\n%s", d)
	}
	_, err = n.run("ADD")
	noErr(t, "ADD with nftables after DEL", err)
	if got := n.kernel.Backends(fakeNetns); !slices.Equal(got, []string{capture.NFTables}) {
		t.Errorf("after DEL and ADD the namespace has rules in %v", got)
	}
}

// TestFakeNetnsGone: ADD of a mesh pod whose namespace is gone fails
// (its addresses cannot be read) and programs nothing, while a pod outside
// the mesh is let through; DEL whose namespace goes away while it removes
// succeeds, as the rules went with it.
func TestFakeNetnsGone(t *testing.T) {
	n := newFakeNode(t, injectedPod(t))
	n.kernel.DeleteNetns(fakeNetns)
	_, err := n.run("ADD")
	wantCode(t, "ADD of a mesh pod without its netns", err, types.ErrIOFailure)
	if n.applies() != 0 {
		t.Errorf("programmed: %v", n.kernel.Calls())
	}

	m := newFakeNode(t, loadPod(t, "no-sidecar.yaml"))
	m.kernel.DeleteNetns(fakeNetns)
	stdout, err := m.run("ADD")
	noErr(t, "ADD of a pod outside the mesh without its netns", err)
	samePrevResult(t, stdout)

	d := newFakeNode(t, injectedPod(t))
	_, err = d.run("ADD")
	noErr(t, "ADD", err)
	entered, release := d.kernel.Block(capturetest.OpRemove, "")
	go func() {
		<-entered
		d.kernel.DeleteNetns(fakeNetns)
		release()
	}()
	_, err = d.run("DEL")
	noErr(t, "DEL while the netns goes", err)
	if got := d.decisions(); got[len(got)-1] != "DEL skip" {
		t.Errorf("decisions %v, want DEL skip last", got)
	}
}
