package cniplugin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"

	"github.com/nftmesh/nftmesh/internal/cnisock"
	"github.com/nftmesh/nftmesh/nft"
	"github.com/nftmesh/nftmesh/podinfo/agentsock"
	"github.com/nftmesh/nftmesh/podinfo/meshpod"
	"github.com/nftmesh/nftmesh/testkit/capturetest"
	"github.com/nftmesh/nftmesh/testkit/nstest"
)

// TestAgentDeclinesWhatItsSandboxRefuses: run by the agent, a call the
// kernel refuses to the agent's process (EPERM, EACCES: a capability or a
// security profile its container lacks) is declined, for the standalone
// plugin to run with the host's privileges, and nothing of it stays behind;
// run by the standalone plugin, the same refusal is the call's CNI error.
// (Root-free: the kernel is the in-memory one, its refusals injected.)
func TestAgentDeclinesWhatItsSandboxRefuses(t *testing.T) {
	pod := loadPod(t, "injected.yaml")
	pod.UID = "uid-sandbox"
	found := foundAnswer(t, pod)
	for _, errno := range []unix.Errno{unix.EPERM, unix.EACCES} {
		for _, verb := range []string{"ADD", "DEL"} {
			for _, inAgent := range []bool{true, false} {
				t.Run(fmt.Sprintf("%s/%s/agent=%v", errno, verb, inAgent), func(t *testing.T) {
					f := capturetest.New()
					f.AddNetns(fakeNetns, netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("198.51.100.20"))
					if verb == "DEL" {
						f.Install(fakeNetns, "nftables", wantPlan(t, pod, false))
						f.FailRemove("", fmt.Errorf("removing: %w", errno))
					} else {
						f.FailApply("", fmt.Errorf("writing: %w", errno), false)
					}
					runDir, _ := fakeAPIRunDir(t, servePod(t, pod))
					vars := cniVars(verb, fakeNetns, "ctr-sandbox", cniArgsFor(pod, "ctr-sandbox"))
					var out, errOut bytes.Buffer
					e := Env{
						Getenv:   func(k string) string { return vars[k] },
						Stdin:    bytes.NewReader(directConf(t, "1.0.0", runDir, prevResultV4("1.0.0", "198.51.100.20/24"), nil)),
						Stdout:   &out,
						Stderr:   &errOut,
						Pipeline: f.Pipeline(),
					}
					if inAgent {
						e.Ask = func(agentsock.Request) (agentsock.Answer, error) { return found, nil }
						e.RunDir = runDir
					}
					code, err := Run(e)
					if !inAgent {
						var cerr types.Error
						if code != 1 || err != nil || json.Unmarshal(out.Bytes(), &cerr) != nil || !strings.Contains(cerr.Details, errno.Error()) {
							t.Fatalf("standalone: status %d, %v, stdout %q; want the refusal as the CNI error", code, err, out.String())
						}
						return
					}
					if !errors.Is(err, ErrDeclined) {
						t.Fatalf("agent: status %d, %v, stdout %q; want declined", code, err, out.String())
					}
					if verb == "ADD" && len(f.Backends(fakeNetns)) != 0 {
						t.Fatalf("a declined ADD left rules behind: %s", f.Dump(fakeNetns))
					}
				})
			}
		}
	}
}

// foundAnswer is the agent's answer for pod: its decision fields, as the
// API server would serve it.
func foundAnswer(t testing.TB, pod *corev1.Pod) agentsock.Answer {
	t.Helper()
	body, err := json.Marshal(pod)
	if err != nil {
		t.Fatal(err)
	}
	mp, uid, err := meshpod.DecodeAPIPod(body)
	if err != nil {
		t.Fatal(err)
	}
	return agentsock.Found(uid, mp)
}

// handOver sends one call to the agent's CNI socket in runDir as the front
// does, with fds passed beside it, and returns the reply (ok false: the
// connection ended without one).
func handOver(t testing.TB, runDir string, frame []byte, fds ...int) (cnisock.Reply, bool) {
	t.Helper()
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: cnisock.Path(runDir), Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	if _, _, err := c.WriteMsgUnix(frame, oob, nil); err != nil {
		return cnisock.Reply{}, false // the agent hung up (a refused peer)
	}
	_ = c.CloseWrite()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	var hdr [cnisock.HeaderLen]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		return cnisock.Reply{}, false
	}
	n, err := cnisock.BodyLen(hdr, cnisock.ReplyMagic)
	if err != nil {
		t.Fatal(err)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(c, body); err != nil {
		t.Fatal(err)
	}
	r, err := cnisock.ParseReply(body)
	if err != nil {
		t.Fatal(err)
	}
	return r, true
}

// callFrame is the front's request for verb on pod in nsPath.
func callFrame(t testing.TB, verb, nsPath, runDir string, pod *corev1.Pod, extraEnv ...string) []byte {
	t.Helper()
	id := "ctr-" + nstest.RandHex(6)
	env := []string{"CNI_COMMAND=" + verb, "CNI_CONTAINERID=" + id, "CNI_NETNS=" + nsPath, "CNI_IFNAME=eth0",
		"CNI_ARGS=" + cniArgsFor(pod, id), "CNI_PATH=/opt/cni/bin"}
	b, err := cnisock.AppendRequest(nil, cnisock.Request{
		Env:   append(env, extraEnv...),
		Stdin: directConf(t, "1.0.0", runDir, prevResultV4("1.0.0", "198.51.100.40/24"), nil),
	})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// openPath opens path as the front does (O_PATH).
func openPath(t testing.TB, path string) int {
	t.Helper()
	fd, err := unix.Open(path, unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return fd
}

// TestServeRefusesBadCalls: the agent's CNI socket runs a call only when the
// request is well formed and the namespace comes as exactly one descriptor
// for the CNI_NETNS it names; anything else is declined untouched (the front
// then runs the standalone plugin), with the reason counted. A call whose
// config names another run dir is declined too, and a peer that is not the
// allowed uid gets no answer at all.
func TestServeRefusesBadCalls(t *testing.T) {
	needEnv(t)
	runDir, _ := countingRunDir(t)
	ag := startAgent(t, runDir)
	pod := nodePod(t, "injected.yaml")
	time.Sleep(200 * time.Millisecond)
	_, nsPath := nstest.New(t, "cni-serve-")
	nsFD := openPath(t, nsPath)
	// This process's own namespace: the running thread's. (/proc/self is
	// the main thread's, which a test that left a namespace unrestored on a
	// locked goroutine may have wedged in a pod's.)
	runtime.LockOSThread()
	other := openPath(t, "/proc/thread-self/ns/net")
	runtime.UnlockOSThread()
	for _, tt := range []struct {
		name   string
		frame  []byte
		fds    []int
		reason string // the outcome counted
	}{
		{"garbage", []byte("GET / HTTP/1.1\r\n\r\n"), nil, agentsock.OutcomeBadRequest},
		{"truncated body", callFrame(t, "ADD", nsPath, runDir, pod)[:40], []int{nsFD}, agentsock.OutcomeBadRequest},
		{"no descriptor for CNI_NETNS", callFrame(t, "ADD", nsPath, runDir, pod), nil, agentsock.OutcomeBadRequest},
		{"two descriptors", callFrame(t, "ADD", nsPath, runDir, pod), []int{nsFD, other}, agentsock.OutcomeBadRequest},
		{"a descriptor without CNI_NETNS", callFrame(t, "ADD", "", runDir, pod), []int{nsFD}, agentsock.OutcomeBadRequest},
		{"another run dir", callFrame(t, "ADD", nsPath, t.TempDir(), pod), []int{nsFD}, agentsock.OutcomeDeclined},
	} {
		t.Run(tt.name, func(t *testing.T) {
			before := ag.calls(tt.reason)
			r, ok := handOver(t, runDir, tt.frame, tt.fds...)
			if !ok || r.Status != cnisock.StatusDeclined || len(r.Stdout) != 0 {
				t.Fatalf("reply %+v (got one: %v), want declined and nothing printed", r, ok)
			}
			if n := ag.callsReach(tt.reason, before+1); n != before+1 {
				t.Errorf("outcome %s counted %d times, want once", tt.reason, n-before)
			}
			assertNoRules(t, nsPath)
		})
	}
	// The host's namespace by descriptor: refused as CNI_NETNS always is
	// (CNI error 4), nothing touched.
	t.Run("host namespace", func(t *testing.T) {
		r, ok := handOver(t, runDir, callFrame(t, "ADD", "/proc/thread-self/ns/net", runDir, pod), other)
		if !ok || r.Status != cnisock.StatusError || !strings.Contains(string(r.Stdout), `"code": 4`) {
			t.Fatalf("reply %+v (%v), want CNI error 4", r, ok)
		}
	})
	// The call as the front sends it: run, printed, captured.
	t.Run("well formed", func(t *testing.T) {
		r, ok := handOver(t, runDir, callFrame(t, "ADD", nsPath, runDir, pod), nsFD)
		if !ok || r.Status != cnisock.StatusOK || !strings.Contains(string(r.Stdout), "198.51.100.40") {
			t.Fatalf("reply %+v (%v), want the prevResult printed", r, ok)
		}
		if err := nft.New().Check(context.Background(), nsPath, wantPlan(t, pod, false)); err != nil {
			t.Fatal(err)
		}
	})
}

// TestServeOnlyAllowedPeer: a peer whose uid is not the allowed one (here
// the test, root, against a server allowing uid 4242 only) gets no answer
// and nothing runs.
func TestServeOnlyAllowedPeer(t *testing.T) {
	needEnv(t)
	runDir := t.TempDir()
	ln, err := agentsock.ListenAt(runDir, cnisock.SocketName)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var outcomes []string
	srv := &Server{RunDir: runDir, AllowUID: 4242, HostNetns: hostKnown, Resolver: resolverFunc(func(context.Context, agentsock.Request) agentsock.Answer {
		t.Error("a refused peer's call was resolved")
		return agentsock.Unknown("no")
	}), Observe: func(o agentsock.Outcome) { mu.Lock(); outcomes = append(outcomes, o.Status); mu.Unlock() }}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln) }()
	_, nsPath := nstest.New(t, "cni-serve-")
	if r, ok := handOver(t, runDir, callFrame(t, "ADD", nsPath, runDir, loadPod(t, "injected.yaml")), openPath(t, nsPath)); ok {
		t.Fatalf("a refused peer got a reply: %+v", r)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if len(outcomes) != 1 || outcomes[0] != agentsock.OutcomeRefused {
		t.Fatalf("outcomes %v, want one refused", outcomes)
	}
	assertNoRules(t, nsPath)
}

// BenchmarkServeADD is the agent's side of one handed-over ADD of a mesh
// pod into a fresh netns: from the front's connect to its reply, in
// process (the front's own start-up and exit are not in it).
//
//	go test -run '^$' -bench BenchmarkServeADD -benchtime=200x ./cniplugin
func BenchmarkServeADD(b *testing.B) {
	needEnv(b)
	runDir, _ := countingRunDir(b)
	startAgent(b, runDir)
	pod := nodePod(b, "injected.yaml")
	time.Sleep(200 * time.Millisecond)
	for b.Loop() {
		b.StopTimer()
		_, nsPath := nstest.New(b, "cni-bench-")
		fd := openPath(b, nsPath)
		frame := callFrame(b, "ADD", nsPath, runDir, pod)
		b.StartTimer()
		r, ok := handOver(b, runDir, frame, fd)
		b.StopTimer()
		if !ok || r.Status != cnisock.StatusOK {
			b.Fatalf("reply %+v (%v): %s", r, ok, r.Stdout)
		}
		b.StartTimer()
	}
}

// TestServeRunDirAsThePluginReadsIt: an agent started with its run dir
// written unclean (a trailing slash, a dot) still runs the calls whose
// config names that dir: the plugin cleans the config's path, and the
// server compares the clean forms.
func TestServeRunDirAsThePluginReadsIt(t *testing.T) {
	needEnv(t)
	runDir := t.TempDir()
	ln, err := agentsock.ListenAt(runDir, cnisock.SocketName)
	if err != nil {
		t.Fatal(err)
	}
	pod := loadPod(t, "injected.yaml")
	pod.UID = "uid-clean"
	found := foundAnswer(t, pod)
	srv := &Server{RunDir: runDir + "/./", AllowUID: agentsock.PeerUID, HostNetns: hostKnown, Resolver: resolverFunc(func(context.Context, agentsock.Request) agentsock.Answer {
		return found
	})}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	_, nsPath := nstest.New(t, "cni-serve-")
	r, ok := handOver(t, runDir, callFrame(t, "ADD", nsPath, runDir, pod), openPath(t, nsPath))
	if !ok || r.Status != cnisock.StatusOK {
		t.Fatalf("reply %+v (%v): %s", r, ok, r.Stdout)
	}
	if err := nft.New().Check(context.Background(), nsPath, wantPlan(t, pod, false)); err != nil {
		t.Fatal(err)
	}
}
