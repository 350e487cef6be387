package node

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/nftmesh/nftmesh/testkit/nonroot"
)

// The attacker's settings, in its environment: the targets (host:port/path,
// comma-separated), the connections it keeps trying to hold, the most it
// opens per second, its source addresses (spread over several so the
// flood does not run out of ephemeral ports).
const (
	attackEnv        = "NFTMESH_FLOOD_TARGETS"
	attackConnsEnv   = "NFTMESH_FLOOD_CONNS"
	attackRateEnv    = "NFTMESH_FLOOD_RATE"
	attackSourcesEnv = "NFTMESH_FLOOD_SOURCES"
)

// attack is the test binary run as an attacker: it keeps trying to hold
// its connections, each one GET then silence; one the server closes is
// opened again a second later. Every 100 ms it prints what it holds:
// "opened=N open=N closed=N failed=N err=...".
func attack() {
	targets := strings.Split(os.Getenv(attackEnv), ",")
	conns, _ := strconv.Atoi(os.Getenv(attackConnsEnv))
	perSec, _ := strconv.Atoi(os.Getenv(attackRateEnv))
	sources := strings.Split(os.Getenv(attackSourcesEnv), ",")
	lim := rate.NewLimiter(rate.Limit(perSec), 50)
	var st attackStats
	for i := range conns {
		target := targets[i%len(targets)]
		addr, path, _ := strings.Cut(target, "/")
		d := &net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(sources[i%len(sources)])}}
		go st.hold(lim, d, addr, "/"+path)
	}
	for range time.Tick(100 * time.Millisecond) {
		st.mu.Lock()
		last := st.lastErr
		st.mu.Unlock()
		fmt.Printf("opened=%d open=%d closed=%d failed=%d err=%q\n", st.opened.Load(), st.open.Load(), st.closed.Load(), st.failed.Load(), last)
	}
}

type attackStats struct {
	opened, open, closed, failed atomic.Int64
	mu                           sync.Mutex
	lastErr                      string
}

func (st *attackStats) hold(lim *rate.Limiter, d *net.Dialer, addr, path string) {
	req := "GET " + path + " HTTP/1.1\r\nHost: agent\r\n\r\n"
	for {
		_ = lim.Wait(context.Background())
		c, err := d.Dial("tcp", addr)
		if err != nil {
			st.failed.Add(1)
			st.mu.Lock()
			st.lastErr = err.Error()
			st.mu.Unlock()
			time.Sleep(time.Second)
			continue
		}
		st.opened.Add(1)
		st.open.Add(1)
		r := bufio.NewReader(c)
		if _, err := io.WriteString(c, req); err == nil {
			if resp, err := http.ReadResponse(r, nil); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}
		// Silence, until the server closes the connection.
		_, _ = r.ReadByte()
		c.Close()
		st.open.Add(-1)
		st.closed.Add(1)
		time.Sleep(time.Second)
	}
}

// attacker is one running attacker process and its last status line.
type attacker struct {
	cmd    *exec.Cmd
	mu     sync.Mutex
	status string
}

func (a *attacker) field(name string) int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, f := range strings.Fields(a.status) {
		if v, ok := strings.CutPrefix(f, name+"="); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return 0
}

// startAttackers starts floodAttackers copies of this test binary (more if
// the descriptor limit they inherit is low) as user nobody in the node's
// namespace, each trying to hold its share of floodConns connections, half
// to each port; they are killed by PID when the test ends.
func startAttackers(t *testing.T, netns string) []*attacker {
	t.Helper()
	// nobody cannot read the go build cache: a copy it can run.
	dir, err := os.MkdirTemp("", "flood-attacker-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	// Each attacker holds its share of the flood in descriptors, up to the
	// hard limit it inherits (Go raises its soft limit to it at start):
	// more attackers where that is low.
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	per := int(min(lim.Max, 1<<20)) - 256
	if per < 256 {
		t.Fatalf("descriptor limit %d: too low for an attacker", lim.Max)
	}
	procs := max(floodAttackers, (floodConns+per-1)/per)
	bin := filepath.Join(dir, "attacker")
	copyFile(t, os.Args[0], bin, 0o755)
	var out []*attacker
	for i := range procs {
		var sources []string
		for s := 2; s < 10; s++ {
			sources = append(sources, fmt.Sprintf("127.0.%d.%d", i, s))
		}
		cmd := exec.Command(bin)
		cmd.Dir = "/"
		cmd.Env = []string{"PATH=/usr/bin:/bin", attackEnv + "=" + agentHealth + "/healthz," + agentMetrics + "/metrics",
			attackConnsEnv + "=" + strconv.Itoa(floodConns/procs), attackRateEnv + "=" + strconv.Itoa(floodRate/procs),
			attackSourcesEnv + "=" + strings.Join(sources, ",")}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nonroot.Nobody, Gid: nonroot.Nobody, Groups: []uint32{}}}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := inNetns(netns, cmd.Start); err != nil {
			t.Fatal(err)
		}
		a := &attacker{cmd: cmd}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		go func() {
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				a.mu.Lock()
				a.status = sc.Text()
				a.mu.Unlock()
			}
		}()
		out = append(out, a)
	}
	return out
}

func sumOpened(as []*attacker) int64 {
	var n int64
	for _, a := range as {
		n += a.field("opened")
	}
	return n
}

func attackerStatus(as []*attacker) string {
	var s []string
	for _, a := range as {
		a.mu.Lock()
		s = append(s, fmt.Sprintf("[pid %d %s]", a.cmd.Process.Pid, a.status))
		a.mu.Unlock()
	}
	return strings.Join(s, " ")
}
