package netnsaddr

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"slices"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// addrMsg is one RTM_NEWADDR message with the given attributes (type,
// value), as the kernel lays it out.
func addrMsg(family uint8, flags uint16, attrs ...any) []byte {
	body := []byte{family, 32, 0, 0, 1, 0, 0, 0} // ifaddrmsg: family, prefixlen, flags, scope, index
	for i := 0; i < len(attrs); i += 2 {
		v := attrs[i+1].([]byte)
		a := make([]byte, 4, 4+len(v)+3)
		binary.NativeEndian.PutUint16(a[0:], uint16(4+len(v)))
		binary.NativeEndian.PutUint16(a[2:], attrs[i].(uint16))
		a = append(a, v...)
		for len(a)%4 != 0 {
			a = append(a, 0)
		}
		body = append(body, a...)
	}
	return nlMsg(syscall.RTM_NEWADDR, flags, body)
}

func nlMsg(typ, flags uint16, body []byte) []byte {
	h := make([]byte, 16)
	binary.NativeEndian.PutUint32(h[0:], uint32(16+len(body)))
	binary.NativeEndian.PutUint16(h[4:], typ)
	binary.NativeEndian.PutUint16(h[6:], flags)
	return append(h, body...)
}

func ip(s string) []byte { return netip.MustParseAddr(s).AsSlice() }

func TestParseAddrs(t *testing.T) {
	done := nlMsg(syscall.NLMSG_DONE, unix.NLM_F_MULTI, make([]byte, 4))
	for _, tc := range []struct {
		name string
		rib  []byte
		want []string
		err  error
	}{
		{name: "empty", rib: nil, want: []string{}},
		{name: "in order, local end of point-to-point", want: []string{"192.0.2.1", "198.51.100.7", "2001:db8::1"}, rib: slices.Concat(
			addrMsg(syscall.AF_INET, unix.NLM_F_MULTI, uint16(syscall.IFA_ADDRESS), ip("192.0.2.1"), uint16(syscall.IFA_LOCAL), ip("192.0.2.1")),
			addrMsg(syscall.AF_INET, unix.NLM_F_MULTI, uint16(syscall.IFA_ADDRESS), ip("198.51.100.8"), uint16(syscall.IFA_LOCAL), ip("198.51.100.7")),
			addrMsg(syscall.AF_INET6, unix.NLM_F_MULTI, uint16(syscall.IFA_ADDRESS), ip("2001:db8::1")),
			addrMsg(syscall.AF_INET6, unix.NLM_F_MULTI, uint16(syscall.IFA_LABEL), []byte("lo\x00")),
			done)},
		{name: "interrupted", err: errDumpInterrupted, rib: slices.Concat(
			addrMsg(syscall.AF_INET, unix.NLM_F_MULTI|unix.NLM_F_DUMP_INTR, uint16(syscall.IFA_ADDRESS), ip("192.0.2.1")), done)},
		{name: "not an address", want: []string{}, rib: addrMsg(syscall.AF_INET, 0, uint16(syscall.IFA_ADDRESS), []byte{1, 2, 3})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseAddrs(tc.rib)
			if tc.err != nil {
				if !errors.Is(err, tc.err) {
					t.Fatalf("parseAddrs = %v, %v; want %v", got, err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var s []string
			for _, a := range got {
				s = append(s, a.String())
			}
			if !slices.Equal(s, tc.want) && !(len(s) == 0 && len(tc.want) == 0) {
				t.Errorf("parseAddrs = %v, want %v", s, tc.want)
			}
		})
	}
	if _, err := parseAddrs(addrMsg(syscall.AF_INET, 0, uint16(syscall.IFA_ADDRESS), ip("192.0.2.1"))[:20]); err == nil {
		t.Error("a truncated message parsed")
	}
}

// FuzzParseAddrs: whatever a dump holds, parsing it never panics.
func FuzzParseAddrs(f *testing.F) {
	f.Add(addrMsg(syscall.AF_INET, unix.NLM_F_MULTI, uint16(syscall.IFA_ADDRESS), ip("192.0.2.1"), uint16(syscall.IFA_LOCAL), ip("192.0.2.2")))
	f.Add(addrMsg(syscall.AF_INET6, 0, uint16(syscall.IFA_ADDRESS), ip("2001:db8::1")))
	f.Fuzz(func(t *testing.T, b []byte) { _, _ = parseAddrs(b) })
}
