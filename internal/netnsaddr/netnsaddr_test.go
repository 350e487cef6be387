package netnsaddr_test

import (
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/nftmesh/nftmesh/internal/hostns"
	"github.com/nftmesh/nftmesh/internal/netnsaddr"
	"github.com/nftmesh/nftmesh/netlab"
)

// interfaceAddrs is the independent reader: Go's net.InterfaceAddrs run on
// a thread inside the namespace, which is what Istio's IPv6 decision reads.
func interfaceAddrs(t *testing.T, path string) []netip.Addr {
	t.Helper()
	var out []netip.Addr
	err := netlab.Do(path, func() error {
		as, err := net.InterfaceAddrs()
		if err != nil {
			return err
		}
		for _, a := range as {
			if n, ok := a.(*net.IPNet); ok {
				ip, _ := netip.AddrFromSlice(n.IP)
				out = append(out, ip.Unmap())
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("net.InterfaceAddrs in %s: %v", path, err)
	}
	return out
}

func addAddr(t *testing.T, path, link, cidr string) {
	t.Helper()
	n, err := hostns.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	var h *netlink.Handle
	if err := n.Do(func() (err error) { h, err = netlink.NewHandle(); return err }); err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	l, err := h.LinkByName(link)
	if err != nil {
		t.Fatal(err)
	}
	p := netip.MustParsePrefix(cidr)
	a := &netlink.Addr{IPNet: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}, Flags: unix.IFA_F_NODAD}
	if err := h.AddrAdd(l, a); err != nil {
		t.Fatalf("adding %s to %s: %v", cidr, link, err)
	}
}

// TestListOrderMatchesInterfaceAddrs: in every stack, and with more
// addresses added later on another interface (IPv6 before IPv4), List gives
// exactly the addresses in the order net.InterfaceAddrs sees them inside the
// namespace, and that order puts every IPv4 address before any IPv6 one.
func TestListOrderMatchesInterfaceAddrs(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces")
	}
	for _, st := range []netlab.Stack{netlab.StackDual, netlab.StackDualV6First, netlab.StackIPv4, netlab.StackIPv6} {
		t.Run(strings.ReplaceAll(st.String(), " ", "-"), func(t *testing.T) {
			topo, err := netlab.NewTopology(netlab.TopologyOptions{Prefix: "nna-", Stack: st})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				if err := topo.Close(); err != nil {
					t.Error(err)
				}
			})
			check := func(stage string) []netip.Addr {
				got, err := netnsaddr.List(topo.PodNetnsPath())
				if err != nil {
					t.Fatal(err)
				}
				if want := interfaceAddrs(t, topo.PodNetnsPath()); !slices.Equal(got, want) {
					t.Fatalf("%s: List = %v, net.InterfaceAddrs in the namespace = %v", stage, got, want)
				}
				t.Logf("%s: %v", stage, got)
				seen6 := false
				for _, a := range got {
					if a.Is6() {
						seen6 = true
					} else if seen6 {
						t.Fatalf("%s: IPv4 %s listed after an IPv6 address: %v", stage, a, got)
					}
				}
				return got
			}
			got := check("as built")
			for _, a := range st.Added() {
				if !slices.Contains(got, a) {
					t.Errorf("pod address %s missing from %v", a, got)
				}
			}
			if !slices.Contains(got, netip.MustParseAddr("127.0.0.1")) || !slices.Contains(got, netip.IPv6Loopback()) {
				t.Errorf("loopback addresses missing from %v", got)
			}
			// lo has a lower ifindex than eth0: its new addresses come first
			// within each family, but IPv4 still before IPv6.
			addAddr(t, topo.PodNetnsPath(), "lo", "2001:db8:77::1/128")
			addAddr(t, topo.PodNetnsPath(), "lo", "192.0.2.77/32")
			got = check("with more addresses on lo")
			if i, j := slices.Index(got, netip.MustParseAddr("192.0.2.77")), slices.Index(got, netip.MustParseAddr("2001:db8:77::1")); i < 0 || j < 0 || i > j {
				t.Errorf("added addresses not both listed, IPv4 first: %v", got)
			}
			// A point-to-point address is listed by its local end.
			if out, err := exec.Command("nsenter", "--net="+topo.PodNetnsPath(), "ip", "addr", "add", "203.0.113.1", "peer", "203.0.113.2/32", "dev", "lo").CombinedOutput(); err != nil {
				t.Fatalf("adding a peer address: %v %s", err, out)
			}
			got = check("with a point-to-point address")
			if !slices.Contains(got, netip.MustParseAddr("203.0.113.1")) || slices.Contains(got, netip.MustParseAddr("203.0.113.2")) {
				t.Errorf("point-to-point address not listed by its local end: %v", got)
			}
		})
	}
}

func TestListErrors(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "no-such-netns")
	_, err := netnsaddr.List(missing)
	if err == nil || !strings.Contains(err.Error(), missing) {
		t.Fatalf("List(%s) error = %v, want one naming the path", missing, err)
	}
	notNetns := filepath.Join(t.TempDir(), "plain-file")
	if err := os.WriteFile(notNetns, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := netnsaddr.List(notNetns); err == nil || !strings.Contains(err.Error(), notNetns) {
		t.Fatalf("List(plain file) error = %v, want one naming the path", err)
	}
}
