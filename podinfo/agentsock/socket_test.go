package agentsock

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nftmesh/nftmesh/podinfo/meshpod"
)

// clientEnv makes the test binary a one-shot client (run as another user).
const clientEnv = "AGENTSOCK_TEST_CLIENT"

func TestMain(m *testing.M) {
	if path := os.Getenv(benchClientEnv); path != "" {
		benchClient(path)
	}
	if path := os.Getenv(serverEnv); path != "" {
		oneShotServer(path)
	}
	if path := os.Getenv(dialEnv); path != "" {
		dialAndWait(path)
	}
	if path := os.Getenv(clientEnv); path != "" {
		a, err := Ask(context.Background(), path, goodRequest())
		if err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		b, _ := json.Marshal(a)
		fmt.Println(string(b))
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("skipping: needs root (the socket answers root only)")
	}
}

// serve runs a server with r on a fresh run dir; it returns the run dir
// and the outcomes seen.
func serve(t *testing.T, r Resolver) (string, func() []Outcome) {
	t.Helper()
	return serveIn(t, t.TempDir(), r)
}

func serveIn(t *testing.T, runDir string, r Resolver) (string, func() []Outcome) {
	t.Helper()
	ln, err := Listen(runDir)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var outcomes []Outcome
	srv := &Server{Resolver: r, AllowUID: PeerUID, Observe: func(o Outcome) {
		mu.Lock()
		outcomes = append(outcomes, o)
		mu.Unlock()
	}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	// Observe runs after the answer is sent: wait a little for the
	// outcomes a test expects.
	return runDir, func() []Outcome {
		for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			mu.Lock()
			n := len(outcomes)
			mu.Unlock()
			if n > 0 {
				break
			}
		}
		time.Sleep(20 * time.Millisecond)
		mu.Lock()
		defer mu.Unlock()
		return append([]Outcome(nil), outcomes...)
	}
}

func podFor(req Request) *meshpod.Pod {
	return &meshpod.Pod{Namespace: req.Namespace, Name: req.Name, Annotations: map[string]string{"sidecar.istio.io/status": "{}"}}
}

// ResolverFunc adapts a function to Resolver.
type ResolverFunc func(ctx context.Context, req Request) Answer

func (f ResolverFunc) Resolve(ctx context.Context, req Request) Answer { return f(ctx, req) }

var found = ResolverFunc(func(_ context.Context, req Request) Answer { return Found(req.UID, podFor(req)) })

// TestSocketPermissions: the socket is 0600 in a 0700 directory, both
// root's; a directory left with a wider mode is narrowed, and a symlink in
// its place is refused.
func TestSocketPermissions(t *testing.T) {
	needRoot(t)
	runDir, _ := serve(t, found)
	for path, want := range map[string]os.FileMode{filepath.Join(runDir, DirName): 0o700 | os.ModeDir, Path(runDir): 0o600 | os.ModeSocket} {
		st, err := os.Lstat(path)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode() != want || st.Sys().(*syscall.Stat_t).Uid != 0 {
			t.Errorf("%s: mode %v uid %d, want %v owned by root", path, st.Mode(), st.Sys().(*syscall.Stat_t).Uid, want)
		}
	}

	wide := t.TempDir()
	if err := os.Mkdir(filepath.Join(wide, DirName), 0o777); err != nil {
		t.Fatal(err)
	}
	ln, err := Listen(wide)
	if err != nil {
		t.Fatal(err)
	}
	ln.Close()
	if st, _ := os.Stat(filepath.Join(wide, DirName)); st.Mode().Perm() != 0o700 {
		t.Errorf("a 0777 socket dir was left at %v", st.Mode().Perm())
	}

	link := t.TempDir()
	if err := os.Symlink(t.TempDir(), filepath.Join(link, DirName)); err != nil {
		t.Fatal(err)
	}
	if ln, err := Listen(link); err == nil || !strings.Contains(err.Error(), "not a directory") {
		if ln != nil {
			ln.Close()
		}
		t.Fatalf("Listen through a symlinked socket dir: %v, want refused", err)
	}
}

// runAsUser runs the test binary as a client of path as uid/gid 1000.
func runAsUser(t *testing.T, path string) (string, error) {
	t.Helper()
	out, err := userCmd(t, clientEnv+"="+path).CombinedOutput()
	return string(out), err
}

// userCmd is the test binary to run as uid/gid 1000 with env.
func userCmd(t *testing.T, env ...string) *exec.Cmd {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// The test binary's own directory is root's only: copy it where uid
	// 1000 may run it.
	dir := openTempDir(t, "agentsock-client-", 0o755)
	bin := filepath.Join(dir, "client")
	data, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin)
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 1000, Gid: 1000}}
	return cmd
}

// TestNonRootRefused: a process of another user cannot reach the socket
// through its directory; and with the directory and socket opened up (as a
// mistake or an attack might leave them), the server still refuses it by
// its SO_PEERCRED credentials, answering nothing.
func TestNonRootRefused(t *testing.T) {
	needRoot(t)
	// A run dir every user can search, as on a node: only the socket's
	// own directory keeps others out.
	runDir := openTempDir(t, "agentsock-rundir-", 0o755)
	runDir, outcomes := serveIn(t, runDir, found)
	path := Path(runDir)
	out, err := runAsUser(t, path)
	if err == nil || !strings.Contains(out, "permission denied") {
		t.Fatalf("uid 1000 through the 0700 dir: %v %s, want permission denied", err, out)
	}
	if got := outcomes(); len(got) != 0 {
		t.Fatalf("the server saw a connection it should not have: %+v", got)
	}

	if err := os.Chmod(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o666); err != nil {
		t.Fatal(err)
	}
	out, err = runAsUser(t, path)
	if err == nil || strings.Contains(out, `"status"`) {
		t.Fatalf("uid 1000 with the socket opened up got an answer: %s", out)
	}
	got := outcomes()
	if len(got) != 1 || got[0].Status != OutcomeRefused || got[0].PeerUID != 1000 {
		t.Fatalf("outcomes = %+v, want one refusal of uid 1000", got)
	}

	// Root still gets its answer.
	if a, err := Ask(context.Background(), path, goodRequest()); err != nil || a.Status != StatusFound {
		t.Fatalf("root: %+v, %v", a, err)
	}
}

// TestAskAnswers: a found and an unknown answer come through; a resolver
// answering about another UID (a stale cache) is turned into unknown by the
// server, and a server that forges such an answer is refused by the client.
func TestAskAnswers(t *testing.T) {
	needRoot(t)
	req := goodRequest()
	runDir, _ := serve(t, found)
	a, err := Ask(context.Background(), Path(runDir), req)
	if err != nil || a.Status != StatusFound || a.UID != req.UID || a.Pod.Annotations["sidecar.istio.io/status"] != "{}" {
		t.Fatalf("found: %+v, %v", a, err)
	}

	stale := ResolverFunc(func(_ context.Context, req Request) Answer { return Found("some-older-uid", podFor(req)) })
	runDir, outcomes := serve(t, stale)
	a, err = Ask(context.Background(), Path(runDir), req)
	if err != nil || a.Status != StatusUnknown || a.Pod != nil || !strings.Contains(a.Reason, "some-older-uid") {
		t.Fatalf("stale resolver: %+v, %v; want unknown naming the UID", a, err)
	}
	if o := outcomes(); len(o) != 1 || o[0].Status != StatusUnknown {
		t.Fatalf("outcomes %+v", o)
	}

	// A forged server (no checks of its own) answering about another pod.
	for name, forged := range map[string]Answer{
		"other uid":  Found("some-older-uid", podFor(req)),
		"other name": Found(req.UID, &meshpod.Pod{Namespace: req.Namespace, Name: "web-2"}),
		"version 9":  {V: 9, Status: StatusFound, UID: req.UID, Pod: podFor(req)},
	} {
		t.Run(name, func(t *testing.T) {
			path := rawServer(t, func(c net.Conn) {
				readReq(c)
				_ = writeFrame(c, forged, MaxAnswer)
			})
			a, err := Ask(context.Background(), path, req)
			if !errors.Is(err, ErrWrongAnswer) {
				t.Fatalf("forged answer: %+v, %v; want ErrWrongAnswer", a, err)
			}
		})
	}
}

func readReq(c net.Conn) {
	_, _ = readRequest(c)
}

// rawServer listens on a fresh socket and hands each connection to fn.
func rawServer(t *testing.T, fn func(net.Conn)) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "s.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); fn(c) }()
		}
	}()
	return path
}

// TestAskBounded: no agent, a mute agent, an agent that sends too much or
// garbage: each is an error within the caller's deadline, never a hang.
func TestAskBounded(t *testing.T) {
	needRoot(t)
	req := goodRequest()
	if _, err := Ask(context.Background(), filepath.Join(t.TempDir(), "none.sock"), req); !errors.Is(err, ErrNoAgent) {
		t.Fatalf("no socket: %v, want ErrNoAgent", err)
	}
	// A socket file nobody listens on (an agent that died).
	dead := filepath.Join(t.TempDir(), "dead.sock")
	l, err := net.Listen("unix", dead)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
	if _, err := Ask(context.Background(), dead, req); !errors.Is(err, ErrNoAgent) {
		t.Fatalf("dead socket: %v, want ErrNoAgent", err)
	}

	for name, tc := range map[string]struct {
		fn   func(net.Conn)
		want string
	}{
		"mute": {func(c net.Conn) { time.Sleep(2 * time.Second) }, "i/o timeout"},
		"oversized": {func(c net.Conn) {
			readReq(c)
			_, _ = c.Write([]byte{0x7f, 0xff, 0xff, 0xff})
			_, _ = io.Copy(c, strings.NewReader(strings.Repeat("x", 1<<16)))
		}, "field length"},
		"garbage": {func(c net.Conn) { readReq(c); _, _ = c.Write(frame("<html>")) }, "decoding answer"},
		"two frames": {func(c net.Conn) {
			readReq(c)
			b, _ := json.Marshal(Unknown("x"))
			_, _ = c.Write(append(frame(string(b)), frame(string(b))...))
		}, "bytes after its"},
		"closes": {func(c net.Conn) { readReq(c) }, "reading answer length"},
	} {
		t.Run(name, func(t *testing.T) {
			path := rawServer(t, tc.fn)
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			start := time.Now()
			_, err := Ask(ctx, path, req)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Ask = %v, want an error containing %q", err, tc.want)
			}
			if took := time.Since(start); took > time.Second {
				t.Fatalf("Ask took %v past its 200ms deadline", took)
			}
		})
	}
}

// TestServerBadRequests: a bad request gets no answer and is counted as
// such; a slow client cannot hold a connection past the I/O timeout.
func TestServerBadRequests(t *testing.T) {
	needRoot(t)
	runDir, outcomes := serve(t, found)
	path := Path(runDir)
	send := func(b []byte) string {
		c, err := net.Dial("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_, _ = c.Write(b)
		_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
		out, _ := io.ReadAll(c)
		return string(out)
	}
	for _, in := range [][]byte{
		frame(`{"v":1,"namespace":"shop","name":"a/b","uid":"u"}`),
		frame(`{"v":1,"namespace":"shop","name":"web","uid":"u","extra":1}`),
		[]byte{0xff, 0xff, 0xff, 0xff},
		{}, // says nothing: cut off by the read deadline
	} {
		if out := send(in); out != "" {
			t.Fatalf("bad request %q got an answer %q", in, out)
		}
	}
	got := outcomes()
	if len(got) != 4 {
		t.Fatalf("outcomes = %+v, want 4", got)
	}
	for _, o := range got {
		if o.Status != OutcomeBadRequest || len(o.Reason) > 2048 {
			t.Fatalf("outcome %+v, want bad_request with a bounded reason", o)
		}
	}
}

// TestListenReplacesAndKeepsSuccessor: a new agent replaces the socket a
// previous one left; the old one closing afterwards leaves the new socket.
func TestListenReplacesAndKeepsSuccessor(t *testing.T) {
	needRoot(t)
	runDir := t.TempDir()
	old, err := Listen(runDir)
	if err != nil {
		t.Fatal(err)
	}
	next, err := Listen(runDir)
	if err != nil {
		t.Fatal(err)
	}
	defer next.Close()
	old.Close()
	if _, err := os.Lstat(Path(runDir)); err != nil {
		t.Fatalf("the old agent's Close removed its successor's socket: %v", err)
	}
	next.Close()
	if _, err := os.Lstat(Path(runDir)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Close left its own socket: %v", err)
	}
}

// quickResolver has web-now at hand; anything else it resolves the slow
// way, noting the deadline it was given.
type quickResolver struct {
	now      func(req Request) Answer
	resolved chan bool // whether Resolve's ctx had a deadline
}

func (q *quickResolver) ResolveNow(req Request) (Answer, bool) {
	if req.Name != "web-now" {
		return Answer{}, false
	}
	return q.now(req), true
}

func (q *quickResolver) Resolve(ctx context.Context, req Request) Answer {
	_, ok := ctx.Deadline()
	q.resolved <- ok
	return Found(req.UID, podFor(req))
}

// TestServerQuickResolver: an answer the resolver has at hand is sent
// without calling Resolve; one it has not is resolved within the server's
// deadline; and a fast answer about another UID is never sent.
func TestServerQuickResolver(t *testing.T) {
	needRoot(t)
	q := &quickResolver{now: func(req Request) Answer { return Found(req.UID, podFor(req)) }, resolved: make(chan bool, 10)}
	runDir, _ := serve(t, q)
	req := goodRequest()
	req.Name = "web-now"
	if a, err := Ask(context.Background(), Path(runDir), req); err != nil || a.Status != StatusFound || a.Pod.Name != "web-now" {
		t.Fatalf("at hand: %+v, %v", a, err)
	}
	if len(q.resolved) != 0 {
		t.Fatal("Resolve was called for an answer at hand")
	}
	if a, err := Ask(context.Background(), Path(runDir), goodRequest()); err != nil || a.Status != StatusFound {
		t.Fatalf("resolved: %+v, %v", a, err)
	}
	if deadline := <-q.resolved; !deadline {
		t.Fatal("Resolve got no deadline")
	}

	stale := &quickResolver{now: func(req Request) Answer { return Found("some-older-uid", podFor(req)) }, resolved: make(chan bool, 10)}
	runDir, _ = serve(t, stale)
	if a, err := Ask(context.Background(), Path(runDir), req); err != nil || a.Status != StatusUnknown || !strings.Contains(a.Reason, "some-older-uid") {
		t.Fatalf("stale answer at hand: %+v, %v; want unknown naming the UID", a, err)
	}
}

// openTempDir is a temporary directory outside the test's own (which only
// root may search), with mode: where another user's process can reach.
func openTempDir(t *testing.T, prefix string, mode os.FileMode) string {
	t.Helper()
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, mode); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestListenNotFollowingLinks: a symlink at the socket's path, to a file
// the test owns elsewhere, planted before Listen or swapped in for the
// socket while Listen runs (rename over it, 2,000 times, from another
// goroutine), never leads Listen's unlink, bind or mode setting to that
// file: its mode and content stay. Before, the socket's mode was set by
// path after bind, following a symlink swapped in meanwhile (the target
// became 0600 within a few hundred rounds).
func TestListenNotFollowingLinks(t *testing.T) {
	needRoot(t)
	runDir := t.TempDir()
	target := filepath.Join(t.TempDir(), "elsewhere")
	if err := os.WriteFile(target, []byte("the test's own file\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	untouched := func(when string) {
		t.Helper()
		st, err := os.Stat(target)
		data, rerr := os.ReadFile(target)
		if err != nil || rerr != nil || st.Mode().Perm() != 0o644 || string(data) != "the test's own file\n" {
			t.Fatalf("the symlink's target %s: %v %q (%v, %v), want mode 0644 and its content", when, st.Mode(), data, err, rerr)
		}
	}
	if err := os.MkdirAll(filepath.Join(runDir, DirName), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, Path(runDir)); err != nil {
		t.Fatal(err)
	}
	ln, err := Listen(runDir)
	if err != nil {
		t.Fatal(err)
	}
	ln.Close()
	untouched("after Listen over a planted symlink")

	stop := make(chan struct{})
	swapped := make(chan int)
	go func() {
		n := 0
		tmp := Path(runDir) + ".swap"
		for {
			select {
			case <-stop:
				swapped <- n
				return
			default:
			}
			_ = os.Remove(tmp)
			if os.Symlink(target, tmp) == nil && os.Rename(tmp, Path(runDir)) == nil {
				n++
			}
		}
	}()
	for i := range 2000 {
		if ln, err := Listen(runDir); err == nil {
			ln.Close()
		}
		if st, err := os.Stat(target); err == nil && st.Mode().Perm() != 0o644 {
			close(stop)
			<-swapped
			untouched(fmt.Sprintf("after round %d", i))
		}
	}
	close(stop)
	t.Logf("2,000 Listens, %d symlinks swapped in", <-swapped)
	untouched("after the swaps")
}
