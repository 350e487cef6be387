package agentsock

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// starvedChild makes the test binary the server of TestServeConnsStarved,
// its socket in the run dir the variable names.
const starvedChild = "AGENTSOCK_TEST_STARVED_SERVER"

// TestServeConnsStarved: a process out of descriptors still takes a
// connection, with its reserve descriptor, and hands it to Starved with
// the accept's error, which answers at once; with descriptors again, the
// connections are served. Before, the connection waited in the backlog
// until descriptors were free or its peer gave up (the front: 10 s per
// call). The server is a child with its soft RLIMIT_NOFILE at the
// descriptors it has open (no privilege needed).
func TestServeConnsStarved(t *testing.T) {
	if dir := os.Getenv(starvedChild); dir != "" {
		starvedServer(dir)
		return
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestServeConnsStarved$")
	cmd.Env = append(os.Environ(), starvedChild+"="+dir)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	lines := bufio.NewScanner(stdout)
	if !lines.Scan() || lines.Text() != "starved" {
		t.Fatalf("child: %q %v", lines.Text(), lines.Err())
	}
	ask := func() string {
		start := time.Now()
		c, err := net.Dial("unix", filepath.Join(dir, DirName, SocketName))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		b, err := io.ReadAll(c)
		if took := time.Since(start); err != nil || took > 2*time.Second {
			t.Fatalf("answer after %v: %q %v", took, b, err)
		}
		return string(b)
	}
	// (Once: closing it gives a descriptor back, which the next accept
	// takes as usual.)
	if got := ask(); !strings.HasPrefix(got, "starved: ") || !strings.Contains(got, "too many open files") {
		t.Fatalf("out of descriptors: %q, want the connection handed to Starved", got)
	}
	// Descriptors again: served as usual.
	fmt.Fprintln(stdin, "recover")
	if !lines.Scan() || lines.Text() != "recovered" {
		t.Fatalf("child: %q %v", lines.Text(), lines.Err())
	}
	if got := ask(); got != "served" {
		t.Fatalf("with descriptors: %q, want served", got)
	}
}

// starvedServer serves a socket in dir with its descriptors all taken
// until told "recover" on stdin.
func starvedServer(dir string) {
	l, err := Listen(dir)
	if err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	var old unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &old); err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	go func() {
		_ = l.ServeConns(context.Background(), Handlers{
			Serve: func(c *net.UnixConn) { defer c.Close(); _, _ = c.Write([]byte("served")) },
			Starved: func(c *net.UnixConn, err error) {
				if c != nil {
					defer c.Close()
					_, _ = c.Write([]byte("starved: " + err.Error()))
				}
			},
		})
	}()
	time.Sleep(100 * time.Millisecond) // the reserve is taken before the first accept
	// The lowest free descriptor number, as a new one gets it: with the
	// limit there, none is to be had.
	free, err := unix.Dup(0)
	if err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	unix.Close(free)
	lim := unix.Rlimit{Cur: uint64(free), Max: old.Max}
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	// Descriptors the process closes later (its start's) leave holes:
	// take them too.
	var filler []int
	for {
		fd, err := unix.Dup(0)
		if err != nil {
			break
		}
		filler = append(filler, fd)
	}
	fmt.Println("starved")
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		if in.Text() == "recover" {
			for _, fd := range filler {
				unix.Close(fd)
			}
			if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &old); err != nil {
				fmt.Println(err)
				os.Exit(1)
			}
			fmt.Println("recovered")
		}
	}
	os.Exit(0)
}
