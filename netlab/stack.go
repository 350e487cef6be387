package netlab

import (
	"fmt"
	"net/netip"
)

// The pod's own addresses in every topology (as its Stack says):
// 198.18.0.0/15 (benchmarking range) and a ULA.
var (
	PodV4 = netip.MustParseAddr("198.18.0.2")
	PodV6 = netip.MustParseAddr("fd00:6e74:7300::2")
)

// Stack is which address families the pod has, and the order its primary
// plugin gave them (its pod IPs' order).
type Stack uint8

const (
	StackDual        Stack = iota // PodV4, then PodV6 (the usual order); the zero value
	StackDualV6First              // PodV6, then PodV4
	StackIPv4                     // PodV4 only
	StackIPv6                     // PodV6 only
)

var stackNames = [...]string{StackDual: "dual-stack", StackDualV6First: "dual-stack, IPv6 first", StackIPv4: "IPv4 only", StackIPv6: "IPv6 only"}

func (st Stack) String() string {
	if int(st) < len(stackNames) {
		return stackNames[st]
	}
	return fmt.Sprintf("stack(%d)", uint8(st))
}

// Added lists the pod's addresses in the order they are added to its
// interface.
func (st Stack) Added() []netip.Addr {
	switch st {
	case StackDualV6First:
		return []netip.Addr{PodV6, PodV4}
	case StackIPv4:
		return []netip.Addr{PodV4}
	case StackIPv6:
		return []netip.Addr{PodV6}
	}
	return []netip.Addr{PodV4, PodV6}
}

// Has4 reports whether the pod has an IPv4 address.
func (st Stack) Has4() bool { return st != StackIPv6 }

// Has6 reports whether the pod has an IPv6 address.
func (st Stack) Has6() bool { return st != StackIPv4 }
