package cnisock

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestOpenFile: a file in the run dir opens (created when missing, for a
// writer), and what is not a regular file of its own is refused, for
// reading and for appending, with an error naming it and what it is, its
// target untouched: a symlink to a file elsewhere (or to none), a hard
// link to one, a FIFO (without blocking on it), a directory, a socket.
func TestOpenFile(t *testing.T) {
	const (
		write = os.O_WRONLY | os.O_APPEND | os.O_CREATE
		read  = os.O_RDONLY
	)
	for _, tc := range []struct {
		name  string
		plant func(t *testing.T, path, target string)
		kind  string // refused as; "" opens
	}{
		{"missing", func(*testing.T, string, string) {}, ""},
		{"regular", func(t *testing.T, path, _ string) { must(t, os.WriteFile(path, []byte("x\n"), 0o640)) }, ""},
		{"symlink", func(t *testing.T, path, target string) { must(t, os.Symlink(target, path)) }, "symlink"},
		{"dangling symlink", func(t *testing.T, path, target string) { must(t, os.Symlink(target+".none", path)) }, "symlink"},
		{"hard link", func(t *testing.T, path, target string) { must(t, os.Link(target, path)) }, "hard link"},
		{"FIFO", func(t *testing.T, path, _ string) { must(t, syscall.Mkfifo(path, 0o600)) }, "FIFO"},
		{"directory", func(t *testing.T, path, _ string) { must(t, os.Mkdir(path, 0o700)) }, "directory"},
		{"socket", func(t *testing.T, path, _ string) {
			ln, err := net.Listen("unix", path)
			must(t, err)
			t.Cleanup(func() { ln.Close() })
		}, "socket"},
	} {
		for _, flag := range []int{write, read} {
			t.Run(tc.name, func(t *testing.T) {
				dir := t.TempDir()
				target := filepath.Join(t.TempDir(), "elsewhere")
				must(t, os.WriteFile(target, []byte("the test's own file\n"), 0o600))
				path := filepath.Join(dir, "nftmesh-cni.log")
				tc.plant(t, path, target)
				if tc.name == "missing" && flag == read {
					if _, err := OpenFile(path, flag, 0o640); !errors.Is(err, os.ErrNotExist) {
						t.Fatalf("OpenFile of a missing file for reading = %v", err)
					}
					return
				}
				done := make(chan struct{})
				var f *os.File
				var err error
				go func() { f, err = OpenFile(path, flag, 0o640); close(done) }()
				select {
				case <-done:
				case <-time.After(5 * time.Second):
					t.Fatalf("OpenFile blocked on a %s", tc.name)
				}
				if tc.kind == "" {
					if err != nil {
						t.Fatalf("OpenFile: %v", err)
					}
					f.Close()
					return
				}
				var re *RefusedError
				if !errors.As(err, &re) || re.Path != path || re.Kind[:len(tc.kind)] != tc.kind {
					t.Fatalf("OpenFile(%s) = %v, %v; want it refused as a %s", tc.name, f, err, tc.kind)
				}
				if f != nil {
					t.Errorf("OpenFile returned a file with its refusal")
				}
				if data, err := os.ReadFile(target); err != nil || string(data) != "the test's own file\n" {
					t.Errorf("target after the refusal: %q, %v", data, err)
				}
			})
		}
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
