package agentsock

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nftmesh/nftmesh/internal/phase"
	"github.com/nftmesh/nftmesh/podinfo"
	"github.com/nftmesh/nftmesh/testkit/kubetest"
)

// benchClientEnv makes the test binary a one-shot client that prints its
// phase marks, as the plugin is: a fresh process asking once.
const benchClientEnv = "AGENTSOCK_BENCH_CLIENT"

// benchClient is the one-shot client's work (called from TestMain).
func benchClient(path string) {
	phase.Mark("start")
	a, err := Ask(context.Background(), path, goodRequest())
	if err != nil || a.Status != StatusFound {
		fmt.Println("error:", a.Status, err)
		os.Exit(1)
	}
	fmt.Println(phase.String())
	os.Exit(0)
}

// injectedResolver answers with the decision fields of the repository's
// injected pod, as the agent's cache source does.
func injectedResolver(tb testing.TB) Resolver {
	tb.Helper()
	pod, err := kubetest.ReadPodFile(filepath.Join("..", "..", "testdata", "pods", "injected.yaml"))
	if err != nil {
		tb.Fatal(err)
	}
	return ResolverFunc(func(_ context.Context, req Request) Answer {
		p := podinfo.Mesh(pod)
		p.Namespace, p.Name = req.Namespace, req.Name
		return Found(req.UID, p)
	})
}

// BenchmarkAskProcess is one question from a fresh process (the plugin's
// case: a cold runtime, netpoller and encoders) to a real Server with an
// in-memory resolver; it reports the medians of the client's steps (each
// the time since the previous one) and of the server's handling.
func BenchmarkAskProcess(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("skipping: needs root (the socket answers root only)")
	}
	self, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	ln, err := Listen(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	var mu sync.Mutex
	var handled []float64
	srv := &Server{Resolver: injectedResolver(b), AllowUID: PeerUID, Observe: func(o Outcome) {
		mu.Lock()
		handled = append(handled, float64(o.Duration.Nanoseconds())/1e3)
		mu.Unlock()
	}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln) }()
	defer func() { cancel(); <-done }()

	steps := map[string][]float64{}
	var order []string
	for b.Loop() {
		cmd := exec.Command(self)
		cmd.Env = []string{benchClientEnv + "=" + ln.Path()}
		out, err := cmd.CombinedOutput()
		if err != nil {
			b.Fatalf("client: %v: %s", err, out)
		}
		prev := -1.0
		for _, f := range strings.Fields(string(out)) {
			name, v, _ := strings.Cut(f, "=")
			if name == "t0" {
				continue // the marks' own start, as Unix time
			}
			us, err := strconv.ParseFloat(v, 64)
			if err != nil {
				b.Fatalf("client output %q", out)
			}
			if prev >= 0 {
				if _, ok := steps[name]; !ok {
					order = append(order, name)
				}
				steps[name] = append(steps[name], us-prev)
			}
			prev = us
		}
	}
	b.StopTimer()
	total := 0.0
	for _, name := range order {
		m := median(steps[name])
		total += m
		b.ReportMetric(m, name+"-us")
	}
	b.ReportMetric(total, "ask-us")
	time.Sleep(10 * time.Millisecond)
	mu.Lock()
	b.ReportMetric(median(handled), "server-us")
	mu.Unlock()
}

// BenchmarkAsk is the question asked again and again from one warm
// process: the floor the one-shot client's cold costs sit on.
func BenchmarkAsk(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("skipping: needs root (the socket answers root only)")
	}
	ln, err := Listen(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	srv := &Server{Resolver: injectedResolver(b), AllowUID: PeerUID}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln) }()
	defer func() { cancel(); <-done }()
	req := goodRequest()
	for b.Loop() {
		if a, err := Ask(context.Background(), ln.Path(), req); err != nil || a.Status != StatusFound {
			b.Fatalf("%+v %v", a, err)
		}
	}
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

// BenchmarkDecodeAnswer: the plugin's decoding of the injected pod's
// answer.
func BenchmarkDecodeAnswer(b *testing.B) {
	raw, err := json.Marshal(injectedResolver(b).Resolve(context.Background(), goodRequest()))
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := decode[Answer](raw, "answer"); err != nil {
			b.Fatal(err)
		}
	}
}
