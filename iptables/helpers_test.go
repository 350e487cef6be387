package iptables

import (
	"net/netip"
	"sort"
)

type netipPrefix = netip.Prefix

func mustPrefix(s string) netip.Prefix { return netip.MustParsePrefix(s) }

func slicesSort(s []string) { sort.Strings(s) }
