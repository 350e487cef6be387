package agentsock

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// serverEnv makes the test binary a one-shot server on the socket path it
// names (run as another user): it prints "ready", answers one connection
// with a found answer to whatever it was asked, then prints the bytes it
// read.
const serverEnv = "AGENTSOCK_TEST_SERVER"

func oneShotServer(path string) {
	ln, err := net.Listen("unix", path)
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	fmt.Println("ready")
	c, err := ln.Accept()
	if err != nil {
		os.Exit(1)
	}
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	got, _ := io.ReadAll(io.LimitReader(c, MaxRequest))
	req := goodRequest()
	_ = writeFrame(c, Found(req.UID, podFor(req)), MaxAnswer)
	fmt.Printf("read %d bytes\n", len(got))
	os.Exit(0)
}

// TestAskRefusesNonRootServer: a socket bound by a process that is not
// root (should one ever be where the agent's belongs) gets no request and
// its answer is not used.
func TestAskRefusesNonRootServer(t *testing.T) {
	needRoot(t)
	dir := openTempDir(t, "agentsock-server-", 0o777)
	path := filepath.Join(dir, "s.sock")
	cmd := userCmd(t, serverEnv+"="+path)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	lines := bufio.NewScanner(out)
	if !lines.Scan() || lines.Text() != "ready" {
		t.Fatalf("server as uid 1000: %q", lines.Text())
	}
	a, err := Ask(context.Background(), path, goodRequest())
	if !errors.Is(err, ErrPeerRefused) || !strings.Contains(err.Error(), "uid 1000") {
		t.Fatalf("Ask of a uid 1000 server = %+v, %v; want ErrPeerRefused naming uid 1000", a, err)
	}
	if !lines.Scan() || lines.Text() != "read 0 bytes" {
		t.Fatalf("the uid 1000 server was sent the request: %q", lines.Text())
	}
}

// TestAskCancelled: a ctx cancelled before its deadline ends an Ask
// blocked on a mute agent at once.
func TestAskCancelled(t *testing.T) {
	needRoot(t)
	path := rawServer(t, func(c net.Conn) { time.Sleep(3 * time.Second) })
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	start := time.Now()
	_, err := Ask(ctx, path, goodRequest())
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Ask = %v, want context.Canceled", err)
	}
	if took := time.Since(start); took > time.Second {
		t.Fatalf("a cancelled Ask took %v", took)
	}
	if _, err := Ask(ctx, path, goodRequest()); !errors.Is(err, context.Canceled) {
		t.Fatalf("Ask with a done ctx = %v", err)
	}
}

// TestAskDeadlineWhole: the deadline bounds the whole exchange, not each
// read: an agent dribbling its answer a byte at a time (each read well
// within the time left) is cut off at the deadline.
func TestAskDeadlineWhole(t *testing.T) {
	needRoot(t)
	path := rawServer(t, func(c net.Conn) {
		readReq(c)
		_, _ = c.Write(binary.BigEndian.AppendUint32(nil, 1000))
		for range 1000 {
			if _, err := c.Write([]byte(" ")); err != nil {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := Ask(ctx, path, goodRequest())
	if !errors.Is(err, os.ErrDeadlineExceeded) || !strings.Contains(err.Error(), "reading answer of 1000 bytes") {
		t.Fatalf("Ask = %v, want a timeout reading the answer", err)
	}
	if took := time.Since(start); took < 250*time.Millisecond || took > time.Second {
		t.Fatalf("Ask took %v for a 300ms deadline", took)
	}
}

// TestAskBacklogFull: an agent that stopped accepting (its backlog full)
// is given up on at once (the plugin asks the API server), within the
// deadline at most.
func TestAskBacklogFull(t *testing.T) {
	needRoot(t)
	path := filepath.Join(t.TempDir(), "full.sock")
	lfd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(lfd)
	if err := unix.Bind(lfd, &unix.SockaddrUnix{Name: path}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Listen(lfd, 0); err != nil {
		t.Fatal(err)
	}
	// Fill the backlog with connections nobody accepts.
	for i := 0; ; i++ {
		fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(fd)
		if err := unix.Connect(fd, &unix.SockaddrUnix{Name: path}); err == unix.EAGAIN {
			break
		} else if err != nil || i > 100 {
			t.Fatalf("filling the backlog: %v after %d", err, i)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = Ask(ctx, path, goodRequest())
	if err == nil || !strings.Contains(err.Error(), "connecting") {
		t.Fatalf("Ask = %v, want an error connecting", err)
	}
	if took := time.Since(start); took > time.Second {
		t.Fatalf("Ask took %v for a 200ms deadline", took)
	}
}

// TestEncodeRequest: the request's frame is its length and what
// encoding/json writes for it (as every plugin so far has sent it).
func TestEncodeRequest(t *testing.T) {
	req := goodRequest()
	want, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	got, err := appendFrame(req, MaxRequest)
	if err != nil {
		t.Fatal(err)
	}
	if string(got[4:]) != string(want) || binary.BigEndian.Uint32(got) != uint32(len(want)) {
		t.Fatalf("appendFrame = %q, want %q after its length", got, want)
	}
}

// TestAskLargeAnswer: an answer larger than the first read's buffer (a pod
// with big annotations) comes through whole, and one at the limit too.
func TestAskLargeAnswer(t *testing.T) {
	needRoot(t)
	req := goodRequest()
	for _, size := range []int{firstRead - 200, firstRead, 3 * firstRead, MaxAnswer - 300} {
		big := ResolverFunc(func(_ context.Context, req Request) Answer {
			p := podFor(req)
			p.Annotations["big"] = strings.Repeat("x", size)
			return Found(req.UID, p)
		})
		runDir, _ := serve(t, big)
		a, err := Ask(context.Background(), Path(runDir), req)
		if err != nil || len(a.Pod.Annotations["big"]) != size {
			t.Fatalf("answer with a %d-byte annotation: %v", size, err)
		}
	}
}
