package capture

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/nftmesh/nftmesh/internal/hostns"
)

// TestLinuxViaPanic: a panic while LinuxVia lists a namespace's addresses,
// on its own goroutine or inside the namespace (hostns.Do's goroutine),
// fails that call's Addrs with an error saying so and leaves the process
// serving: the next call lists the addresses. Before the fix the panic
// ended the test binary.
func TestLinuxViaPanic(t *testing.T) {
	path := freshNetns(t)
	for _, tc := range []struct {
		name string
		list func(*hostns.Netns, string) ([]netip.Addr, error)
	}{
		{"on LinuxVia's goroutine", func(*hostns.Netns, string) ([]netip.Addr, error) { panic("injected") }},
		{"inside the namespace", func(n *hostns.Netns, _ string) ([]netip.Addr, error) {
			return nil, n.Do(func() error { panic("injected") })
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fd, err := unix.Open(path, unix.O_PATH|unix.O_CLOEXEC, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer unix.Close(fd)
			listAddrsIn = tc.list
			addrs, err := LinuxVia(path, fd).Addrs(path)
			listAddrsIn = defaultListAddrsIn
			if err == nil || !strings.Contains(err.Error(), "panic: injected") || addrs != nil {
				t.Fatalf("Addrs with a panicking list = %v, %v; want an error naming the panic", addrs, err)
			}
			addrs, err = LinuxVia(path, fd).Addrs(path)
			if err != nil || !slices.ContainsFunc(addrs, netip.Addr.IsLoopback) {
				t.Fatalf("Addrs after the panic = %v, %v; want lo's addresses", addrs, err)
			}
		})
	}
}

var defaultListAddrsIn = listAddrsIn
