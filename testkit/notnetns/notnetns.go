// Package notnetns makes the files a network namespace path must never be
// mistaken for, so every front end's tests refuse the same set: a FIFO
// (opening one blocks), a regular file (what an undone bind mount leaves),
// a directory, a listening unix socket and a character device.
package notnetns

import (
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// Files creates dir/fifo, dir/file and dir/sock (a listening unix socket,
// closed when the test ends) and returns them, dir itself and /dev/null,
// each with the kind the refusal must name: "FIFO", "regular file",
// "socket", "directory", "character device".
func Files(t testing.TB, dir string) map[string]string {
	t.Helper()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	reg := filepath.Join(dir, "file")
	if err := os.WriteFile(reg, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return map[string]string{fifo: "FIFO", reg: "regular file", dir: "directory", sock: "socket", "/dev/null": "character device"}
}
