package cniplugin

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"

	"github.com/nftmesh/nftmesh/internal/cnisock"
	"github.com/nftmesh/nftmesh/podinfo/agentsock"
	"github.com/nftmesh/nftmesh/testkit/nstest"
)

// The tests in this file need root (a throw-away netns to pass) but no API
// server: the agent's server runs with a resolver of their own.

// hostKnown stands for the agent's registration of the host's network
// namespace: in tests, the host's is the test's own, refused anyway.
func hostKnown() error { return nil }

// resolverFunc adapts a function to agentsock.Resolver.
type resolverFunc func(ctx context.Context, req agentsock.Request) agentsock.Answer

func (f resolverFunc) Resolve(ctx context.Context, req agentsock.Request) agentsock.Answer {
	return f(ctx, req)
}

// serveWith serves the CNI socket in a fresh run dir with srv (RunDir and
// AllowUID filled in) until the test ends, and returns the run dir.
func serveWith(t testing.TB, srv *Server) string {
	t.Helper()
	runDir := t.TempDir()
	ln, err := agentsock.ListenAt(runDir, cnisock.SocketName)
	if err != nil {
		t.Fatal(err)
	}
	srv.RunDir = runDir
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return runDir
}

// dialCNI connects to the CNI socket in runDir and sends frame with fds.
func dialCNI(t testing.TB, runDir string, frame []byte, fds ...int) *net.UnixConn {
	t.Helper()
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: cnisock.Path(runDir), Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	if _, _, err := c.WriteMsgUnix(frame, oob, nil); err != nil {
		c.Close()
		t.Fatal(err)
	}
	return c
}

// TestServeStopsWhenTheFrontHangsUp: a call whose front closes its end (killed,
// or out of its own time) is stopped at once, its context cancelled, and
// its slot freed, instead of running to its own timeout for nobody. A front
// that only shuts its writing half down still waits, and its call runs on.
func TestServeStopsWhenTheFrontHangsUp(t *testing.T) {
	nstest.NeedRoot(t)
	pod := loadPod(t, "injected.yaml")
	pod.UID = "uid-hangup"
	type ended struct {
		err error
		at  time.Time
	}
	entered := make(chan struct{}, 1)
	ends := make(chan ended, 1)
	outcomes := make(chan agentsock.Outcome, 1)
	// halfClosed: the second part's resolver, which waits a little
	// and reports whether its call was cancelled meanwhile.
	var halfClosed atomic.Bool
	srv := &Server{AllowUID: agentsock.PeerUID, HostNetns: hostKnown, Resolver: resolverFunc(func(ctx context.Context, _ agentsock.Request) agentsock.Answer {
		if halfClosed.Load() {
			select {
			case <-ctx.Done():
				ends <- ended{ctx.Err(), time.Now()}
			case <-time.After(300 * time.Millisecond):
				ends <- ended{nil, time.Now()}
			}
			return agentsock.Unknown("not here")
		}
		entered <- struct{}{}
		<-ctx.Done()
		ends <- ended{ctx.Err(), time.Now()}
		return agentsock.Unknown("stopped")
	}), Observe: func(o agentsock.Outcome) { outcomes <- o }}
	runDir := serveWith(t, srv)
	_, nsPath := nstest.New(t, "cni-hangup-")
	c := dialCNI(t, runDir, callFrame(t, "ADD", nsPath, runDir, pod), openPath(t, nsPath))
	<-entered
	closed := time.Now()
	c.Close()
	select {
	case e := <-ends:
		if !errors.Is(e.err, context.Canceled) {
			t.Fatalf("the call's context ended with %v, want cancelled by the hang-up", e.err)
		}
		if d := e.at.Sub(closed); d > time.Second {
			t.Fatalf("the call was stopped %v after its front hung up", d)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the call runs on 5 s after its front hung up")
	}
	select {
	case o := <-outcomes:
		if o.Status == agentsock.OutcomeOK || o.Status == agentsock.OutcomeError {
			t.Fatalf("outcome %+v for a call whose front hung up", o)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the call's slot is still held 5 s after its front hung up")
	}
	assertNoRules(t, nsPath)

	// Half-closed: the front still reads; its call is not cancelled.
	halfClosed.Store(true)
	c = dialCNI(t, runDir, callFrame(t, "ADD", nsPath, runDir, pod), openPath(t, nsPath))
	defer c.Close()
	if err := c.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if e := <-ends; e.err != nil {
		t.Fatalf("a half-closed front's call was cancelled: %v", e.err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	var hdr [cnisock.HeaderLen]byte
	if _, err := c.Read(hdr[:]); err != nil {
		t.Fatalf("a half-closed front got no reply: %v", err)
	}
	if o := <-outcomes; o.Status != agentsock.OutcomeDeclined {
		t.Fatalf("outcome %+v, want declined (no answer for the pod)", o)
	}
}

// floodFrame is an ADD for pod whose config is padded with prevResult
// routes (each one decoded into its own objects) to size bytes of frame.
func floodFrame(t testing.TB, nsPath, runDir string, pod *corev1.Pod, size int) []byte {
	t.Helper()
	id := "ctr-" + nstest.RandHex(6)
	env := []string{"CNI_COMMAND=ADD", "CNI_CONTAINERID=" + id, "CNI_NETNS=" + nsPath, "CNI_IFNAME=eth0",
		"CNI_ARGS=" + cniArgsFor(pod, id), "CNI_PATH=/opt/cni/bin"}
	frame := func(n int) []byte {
		prev := prevResultV4("1.0.0", "198.51.100.40/24")
		routes := make([]any, n)
		for i := range routes {
			routes[i] = map[string]any{"dst": "10.0.0.0/8"}
		}
		prev["routes"] = routes
		b, err := cnisock.AppendRequest(nil, cnisock.Request{Env: env, Stdin: directConf(t, "1.0.0", runDir, prev, nil)})
		if err != nil {
			return nil
		}
		return b
	}
	lo, hi := 0, size
	for lo < hi { // the most routes that fit
		mid := (lo + hi + 1) / 2
		if b := frame(mid); b != nil && len(b) <= size {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return frame(lo)
}

// TestServeMemoryBound: a flood of calls at the largest request the agent
// reads, all held at once, keeps the agent's heap bounded: the calls
// beyond its budget of bytes in flight are declined at once (the front
// runs them itself), and a request over the limit is not read at all.
func TestServeMemoryBound(t *testing.T) {
	nstest.NeedRoot(t)
	pod := loadPod(t, "injected.yaml")
	pod.UID = "uid-flood"
	const conns = 200 // under the socket's 256 connections at once
	var mu sync.Mutex
	outcomes := map[string]int{}
	entered := make(chan struct{}, conns)
	release := make(chan struct{})
	// A held call ends at the resolver's own timeout (2 s), which a
	// loaded machine may reach before all the connections are dialed:
	// the budget is about calls held at once, so count those.
	var inResolver, mostAtOnce atomic.Int64
	srv := &Server{AllowUID: agentsock.PeerUID, HostNetns: hostKnown, Resolver: resolverFunc(func(ctx context.Context, _ agentsock.Request) agentsock.Answer {
		n := inResolver.Add(1)
		for m := mostAtOnce.Load(); n > m && !mostAtOnce.CompareAndSwap(m, n); m = mostAtOnce.Load() {
		}
		entered <- struct{}{}
		select {
		case <-release:
		case <-ctx.Done():
		}
		inResolver.Add(-1)
		return agentsock.Unknown("flood")
	}), Observe: func(o agentsock.Outcome) {
		mu.Lock()
		outcomes[o.Status]++
		mu.Unlock()
	}}
	runDir := serveWith(t, srv)
	_, nsPath := nstest.New(t, "cni-flood-")
	nsFD := openPath(t, nsPath)
	frame := floodFrame(t, nsPath, runDir, pod, cnisock.MaxRequest)
	if len(frame) < cnisock.MaxRequest*9/10 {
		t.Fatalf("flood frame of %d bytes", len(frame))
	}

	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	var cs []*net.UnixConn
	defer func() {
		for _, c := range cs {
			c.Close()
		}
	}()
	for range conns {
		cs = append(cs, dialCNI(t, runDir, frame, nsFD))
	}
	// Every call is either held in the resolver or declined as busy.
	busy := func() int { mu.Lock(); defer mu.Unlock(); return outcomes[agentsock.OutcomeBusy] }
	held := 0
	deadline := time.After(60 * time.Second)
	for held+busy() < conns {
		select {
		case <-entered:
			held++
		case <-deadline:
			t.Fatalf("after 60 s: %d calls held, %v", held, outcomes)
		case <-time.After(10 * time.Millisecond):
		}
	}
	runtime.GC()
	var during runtime.MemStats
	runtime.ReadMemStats(&during)
	grew := int64(during.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("%d calls of %d bytes: %d held (%d at once at most), %d declined as busy; live heap grew %.1f MiB",
		conns, len(frame), held, mostAtOnce.Load(), busy(), float64(grew)/(1<<20))
	if held == 0 || busy() == 0 {
		t.Errorf("%d held, %d busy: want the budget to hold some and decline the rest", held, busy())
	}
	if limit := int64(DefaultMaxBytesInFlight) / int64(len(frame)); mostAtOnce.Load() > limit {
		t.Errorf("%d calls held at once, the budget allows %d", mostAtOnce.Load(), limit)
	}
	if grew > 64<<20 {
		t.Errorf("live heap grew %.1f MiB with the flood held; want at most 64 MiB", float64(grew)/(1<<20))
	}
	close(release)
	for _, c := range cs {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		var hdr [cnisock.HeaderLen]byte
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			t.Fatalf("a flooded call got no reply: %v", err)
		}
	}
	// The budget is given back (each handler's last step, after its
	// reply).
	for wait := time.Now().Add(5 * time.Second); srv.inFlight.Load() != 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(wait) {
			t.Fatalf("%d bytes still counted in flight 5 s after every call ended", srv.inFlight.Load())
		}
	}

	// A request over the limit: declined from its header, body unread.
	big := make([]byte, cnisock.HeaderLen, cnisock.HeaderLen+cnisock.MaxRequest+1)
	copy(big, cnisock.RequestMagic[:])
	binary.BigEndian.PutUint32(big[4:], cnisock.MaxRequest+1)
	big = append(big, make([]byte, cnisock.MaxRequest+1)...)
	mu.Lock()
	before2 := outcomes[agentsock.OutcomeBadRequest]
	mu.Unlock()
	c := dialCNI(t, runDir, big[:cnisock.HeaderLen])
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	var hdr [cnisock.HeaderLen]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		t.Fatalf("an oversized request got no reply: %v", err)
	}
	deadline2 := time.Now().Add(5 * time.Second)
	for {
		mu.Lock()
		n := outcomes[agentsock.OutcomeBadRequest]
		mu.Unlock()
		if n == before2+1 {
			break
		}
		if time.Now().After(deadline2) {
			t.Fatalf("an oversized request was not refused as a bad request: %v", outcomes)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// frontEnv makes the test binary a front: it sends the frame in the file
// the variable names (with no descriptor) to the CNI socket in the run dir
// of frontDirEnv, and prints "reply" with the status, or "no reply".
const (
	frontEnv    = "NFTMESH_TEST_FRONT_FRAME"
	frontDirEnv = "NFTMESH_TEST_FRONT_RUN_DIR"
)

func frontMain() int {
	frame, err := os.ReadFile(os.Getenv(frontEnv))
	if err != nil {
		fmt.Println(err)
		return 2
	}
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: cnisock.Path(os.Getenv(frontDirEnv)), Net: "unix"})
	if err != nil {
		fmt.Println(err)
		return 2
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write(frame); err != nil {
		fmt.Println("no reply:", err)
		return 0
	}
	var hdr [cnisock.HeaderLen]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		fmt.Println("no reply:", err)
		return 0
	}
	n, _ := cnisock.BodyLen(hdr, cnisock.ReplyMagic)
	body := make([]byte, n)
	_, _ = io.ReadFull(c, body)
	r, err := cnisock.ParseReply(body)
	fmt.Println("reply", r.Status, err)
	return 0
}

// TestServeRefusesRootWithoutNetAdmin: root is not enough to have the agent
// run a call: a root front without CAP_NET_ADMIN in its effective set, or
// root of a user namespace of its own, gets no reply and nothing runs;
// root with its capabilities has its call run.
func TestServeRefusesRootWithoutNetAdmin(t *testing.T) {
	nstest.NeedRoot(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	outcomes := make(chan agentsock.Outcome, 1)
	srv := &Server{AllowUID: agentsock.PeerUID, HostNetns: hostKnown, Resolver: resolverFunc(func(context.Context, agentsock.Request) agentsock.Answer {
		return agentsock.Unknown("not here")
	}), Observe: func(o agentsock.Outcome) { outcomes <- o }}
	runDir := serveWith(t, srv)
	// A call without a namespace: a STATUS, which a refused peer must
	// not get run either.
	frame, err := cnisock.AppendRequest(nil, cnisock.Request{Env: []string{"CNI_COMMAND=STATUS", "CNI_PATH=/opt/cni/bin"},
		Stdin: directConf(t, "1.1.0", runDir, nil, nil)})
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "frame")
	if err := os.WriteFile(file, frame, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name string
		wrap []string
		want string // the outcome
	}{
		{"root with its capabilities", nil, agentsock.OutcomeOK},
		{"root without any capability", []string{"setpriv", "--inh-caps=-all", "--ambient-caps=-all", "--bounding-set=-all", "--"}, agentsock.OutcomeRefused},
		{"root of its own user namespace", []string{"unshare", "--user", "--map-root-user", "--"}, agentsock.OutcomeRefused},
	} {
		t.Run(tt.name, func(t *testing.T) {
			args := append(append([]string{}, tt.wrap...), self)
			cmd := exec.Command(args[0], args[1:]...)
			cmd.Env = []string{frontEnv + "=" + file, frontDirEnv + "=" + runDir}
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("front: %v %s", err, out)
			}
			o := <-outcomes
			if o.Status == agentsock.OutcomeError {
				o.Status = agentsock.OutcomeOK // run: its CNI error is not the point
			}
			if o.Status != tt.want {
				t.Fatalf("outcome %+v, want %s (front: %s)", o, tt.want, out)
			}
			if replied := strings.HasPrefix(string(out), "reply"); replied != (tt.want != agentsock.OutcomeRefused) {
				t.Fatalf("front printed %q", out)
			}
		})
	}
}

// TestServeDeclinesWithoutTheHostNetns: until the host's network namespace
// is registered to be refused (the agent reads it through the host's /proc),
// the agent cannot tell it from a pod's, and declines every call, however
// well formed, without running anything; once it is known, the same call
// runs.
func TestServeDeclinesWithoutTheHostNetns(t *testing.T) {
	nstest.NeedRoot(t)
	pod := loadPod(t, "injected.yaml")
	pod.UID = "uid-hostns"
	found := foundAnswer(t, pod)
	for _, tt := range []struct {
		name string
		host func() error
		want string
	}{
		{"not registered", func() error { return errors.New("registering /host/proc/1/ns/net: permission denied") }, agentsock.OutcomeDeclined},
		{"no registration given", nil, agentsock.OutcomeDeclined},
		{"registered", hostKnown, agentsock.OutcomeOK},
	} {
		t.Run(tt.name, func(t *testing.T) {
			outcomes := make(chan agentsock.Outcome, 1)
			asked := false
			srv := &Server{AllowUID: agentsock.PeerUID, HostNetns: tt.host, Resolver: resolverFunc(func(context.Context, agentsock.Request) agentsock.Answer {
				asked = true
				return found
			}), Observe: func(o agentsock.Outcome) { outcomes <- o }}
			runDir := serveWith(t, srv)
			_, nsPath := nstest.New(t, "cni-hostns-")
			r, ok := handOver(t, runDir, callFrame(t, "ADD", nsPath, runDir, pod), openPath(t, nsPath))
			o := <-outcomes
			if o.Status != tt.want {
				t.Fatalf("outcome %+v (reply status %d, %v), want %s", o, r.Status, ok, tt.want)
			}
			if tt.want == agentsock.OutcomeOK {
				return
			}
			if !ok || r.Status != cnisock.StatusDeclined || asked {
				t.Fatalf("reply %+v (%v), pod asked for: %v; want declined before anything ran", r, ok, asked)
			}
			assertNoRules(t, nsPath)
		})
	}
}

// BenchmarkFrontAddAgent is the agent-up ADD as the runtime pays it: the
// built nftmesh-cni front process, exec'd with the call, hands it to an
// agent serving in this process (its pod answer at hand, no API server),
// which programs a fresh netns; p50 and p90 of the whole exec. It needs
// root only, so the front's own cost (what it links and initialises) can
// be compared where the API server is not built.
//
//	go test -run '^$' -bench BenchmarkFrontAddAgent -benchtime=100x ./cniplugin
func BenchmarkFrontAddAgent(b *testing.B) {
	nstest.NeedRoot(b)
	if env.pluginBin == "" {
		b.Skip("skipping: the front was not built (needs root and the reference plugins)")
	}
	pod := loadPod(b, "injected.yaml")
	pod.UID = "uid-front-bench"
	found := foundAnswer(b, pod)
	srv := &Server{AllowUID: agentsock.PeerUID, HostNetns: hostKnown, Resolver: resolverFunc(func(context.Context, agentsock.Request) agentsock.Answer {
		return found
	})}
	runDir := serveWith(b, srv)
	conf := directConf(b, "1.0.0", runDir, prevResultV4("1.0.0", "198.51.100.30/24"), nil)
	netns := make([]string, b.N)
	for i := range netns {
		_, netns[i] = nstest.New(b, "cni-fbench-")
	}
	// NFTMESH_BENCH_FRONT_B: another build of the front (with its
	// standalone companion beside it), run alternately with this one;
	// b-p50-ms and b/a compare the two in one interleaved loop.
	bins := []string{env.pluginBin}
	if other := os.Getenv("NFTMESH_BENCH_FRONT_B"); other != "" {
		bins = append(bins, other)
	}
	times := make([][]time.Duration, len(bins))
	b.ResetTimer()
	for i := range b.N {
		id := "ctr-" + nstest.RandHex(6)
		k := i % len(bins)
		cmd := exec.Command(bins[k])
		cmd.Env = []string{"CNI_COMMAND=ADD", "CNI_CONTAINERID=" + id, "CNI_NETNS=" + netns[i], "CNI_IFNAME=eth0",
			"CNI_ARGS=" + cniArgsFor(pod, id), "CNI_PATH=" + filepath.Dir(bins[k])}
		cmd.Stdin = bytes.NewReader(conf)
		var out, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &stderr
		start := time.Now()
		err := cmd.Run()
		times[k] = append(times[k], time.Since(start))
		if err != nil || !strings.Contains(stderr.String(), `"ran_by":"agent"`) {
			b.Fatalf("ADD by %s: %v\n%s\n%s", bins[k], err, out.String(), stderr.String())
		}
	}
	b.StopTimer()
	reportPercentiles(b, times[0])
	if len(bins) > 1 && len(times[1]) > 0 {
		p50 := func(v []time.Duration) float64 {
			v = slices.Clone(v)
			slices.Sort(v)
			return float64(v[len(v)/2].Microseconds()) / 1000
		}
		a, o := p50(times[0]), p50(times[1])
		b.ReportMetric(o, "b-p50-ms")
		b.ReportMetric(a/o, "a/b")
	}
}

// TestServeDeclinesWhenStopping: an agent that stops while it runs a call
// (the pod looked up, the rules not yet written) declines it, so that the
// front runs it itself, instead of failing the pod's ADD with "context
// canceled" (TestAgentRestartMidBurst saw code 102 so, now and then).
func TestServeDeclinesWhenStopping(t *testing.T) {
	nstest.NeedRoot(t)
	pod := loadPod(t, "injected.yaml")
	pod.UID = "uid-stopping"
	runDir := t.TempDir()
	ln, err := agentsock.ListenAt(runDir, cnisock.SocketName)
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	srv := &Server{AllowUID: agentsock.PeerUID, HostNetns: hostKnown, RunDir: runDir,
		Resolver: resolverFunc(func(context.Context, agentsock.Request) agentsock.Answer {
			stop() // the agent is told to stop while it has the pod
			return foundAnswer(t, pod)
		})}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln) }()
	_, nsPath := nstest.New(t, "cni-stop-")
	r, ok := handOver(t, runDir, callFrame(t, "ADD", nsPath, runDir, pod), openPath(t, nsPath))
	if err := <-done; err != nil {
		t.Error(err)
	}
	if !ok || r.Status != cnisock.StatusDeclined {
		t.Fatalf("reply %v (status %q, stdout %.300s), want declined: the front must run the call", ok, r.Status, r.Stdout)
	}
}
