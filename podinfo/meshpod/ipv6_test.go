package meshpod

import (
	"net/netip"
	"slices"
	"testing"
)

func addrs(ss ...string) []netip.Addr {
	out := make([]netip.Addr, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParseAddr(s)
	}
	return out
}

// The addresses are given in the order the kernel lists them (as
// net.InterfaceAddrs returns them inside the pod's namespace).
func TestIPv6Capture(t *testing.T) {
	tests := []struct {
		name          string
		addrs         []netip.Addr
		single, multi bool // without and with ISTIO_DUAL_STACK
	}{
		{"no addresses", nil, false, false},
		{"only loopback and link-local", addrs("127.0.0.1", "::1", "fe80::1", "ff02::1"), false, false},
		{"ipv4 only", addrs("127.0.0.1", "198.51.100.7", "::1", "fe80::7"), false, false},
		{"dual-stack, ipv4 listed first", addrs("127.0.0.1", "198.51.100.7", "::1", "2001:db8::7", "fe80::7"), false, true},
		{"dual-stack, ipv6 listed first", addrs("2001:db8::7", "198.51.100.7"), true, true},
		{"ipv6 only", addrs("127.0.0.1", "::1", "2001:db8::7", "fe80::7"), true, true},
		{"ipv6 ULA only", addrs("fd00::7"), true, true},
		{"link-local ipv4 does not count", addrs("169.254.1.1", "2001:db8::7"), true, true},
		{"ipv4-mapped counts as ipv4", addrs("::ffff:198.51.100.7", "2001:db8::7"), false, true},
		{"ipv4-mapped loopback does not count", addrs("::ffff:127.0.0.1", "2001:db8::7"), true, true},
		{"invalid entries are skipped", []netip.Addr{{}, netip.MustParseAddr("2001:db8::7")}, true, true},
		{"two ipv4, then ipv6", addrs("198.51.100.7", "203.0.113.7", "2001:db8::7"), false, true},
		{"second interface's ipv4 still first", addrs("198.51.100.7", "192.0.2.7", "2001:db8::7", "2001:db8:1::7"), false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := IPv6Capture(tt.addrs, false); got != tt.single {
				t.Errorf("IPv6Capture(%v, dual-stack false) = %v, want %v", tt.addrs, got, tt.single)
			}
			if got := IPv6Capture(tt.addrs, true); got != tt.multi {
				t.Errorf("IPv6Capture(%v, dual-stack true) = %v, want %v", tt.addrs, got, tt.multi)
			}
		})
	}
}

func TestKernelOrder(t *testing.T) {
	in := addrs("2001:db8::7", "198.51.100.7", "fd00::1", "::ffff:192.0.2.1", "203.0.113.7")
	want := addrs("198.51.100.7", "::ffff:192.0.2.1", "203.0.113.7", "2001:db8::7", "fd00::1")
	if got := KernelOrder(in); !slices.Equal(got, want) {
		t.Fatalf("KernelOrder(%v) = %v, want %v", in, got, want)
	}
	if in[0] != netip.MustParseAddr("2001:db8::7") {
		t.Fatal("KernelOrder changed its input")
	}
}

// FuzzIPv6Capture checks the rule's properties on arbitrary address lists:
// dual-stack never captures less; addresses that do not count change
// nothing wherever they are; in kernel order, a sidecar that is not
// dual-stack gets IPv6 exactly when the pod has no IPv4 address that counts
// and an IPv6 one that does.
func FuzzIPv6Capture(f *testing.F) {
	f.Add([]byte{4, 198, 51, 100, 7, 6, 0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7}, uint8(0))
	f.Add([]byte{6, 0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 4, 127, 0, 0, 1}, uint8(1))
	f.Fuzz(func(t *testing.T, data []byte, at uint8) {
		var list []netip.Addr
		for len(data) > 0 {
			kind := data[0]
			data = data[1:]
			n := 4
			if kind%2 == 0 {
				n = 16
			}
			if len(data) < n {
				break
			}
			a, _ := netip.AddrFromSlice(data[:n])
			list = append(list, a)
			data = data[n:]
		}
		single, multi := IPv6Capture(list, false), IPv6Capture(list, true)
		if single && !multi {
			t.Fatalf("%v: captured without dual-stack but not with it", list)
		}
		for _, noise := range addrs("127.0.0.1", "::1", "fe80::1", "169.254.0.1", "ff02::1") {
			i := int(at) % (len(list) + 1)
			with := slices.Insert(slices.Clone(list), i, noise)
			if IPv6Capture(with, false) != single || IPv6Capture(with, true) != multi {
				t.Fatalf("inserting %v at %d into %v changed the decision", noise, i, list)
			}
		}
		var has4, has6 bool
		for _, a := range list {
			if Counts(a) {
				has4 = has4 || a.Unmap().Is4()
				has6 = has6 || a.Unmap().Is6()
			}
		}
		if got := IPv6Capture(KernelOrder(list), false); got != (has6 && !has4) {
			t.Fatalf("%v in kernel order, not dual-stack: %v, want %v", list, got, has6 && !has4)
		}
		if multi != has6 {
			t.Fatalf("%v dual-stack: %v, want %v (any IPv6 that counts)", list, multi, has6)
		}
	})
}
