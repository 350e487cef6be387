package capture

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/google/nftables"

	"github.com/nftmesh/nftmesh/internal/hostns"
	"github.com/nftmesh/nftmesh/internal/netnsaddr"
	"github.com/nftmesh/nftmesh/iptables"
	"github.com/nftmesh/nftmesh/nft"
	"github.com/nftmesh/nftmesh/redirect"
)

// Kernel is everything the pipeline reads and writes below itself: the
// network namespace files, the two backends, and the few probes backend
// selection and CHECK read. The pipeline keeps every decision (the host
// guard, the lock, selection, clean-up after a failure, counts); a Kernel
// only answers. Linux() drives the running kernel; package capturetest has
// an in-memory one, so the pipeline and the front ends run without root.
//
// Paths passed to the methods are what the pipeline hands the backends: a
// namespace's pinned /proc/self/fd path or, for a Netns without a
// descriptor, its Path.
type Kernel interface {
	// OpenNetns opens the network namespace file at path without blocking
	// and checks that it is one (see hostns.Open); it does not refuse the
	// host's: the pipeline does.
	OpenNetns(path string) (*Netns, error)
	// Backend returns the backend named NFTables or Legacy.
	Backend(name string) redirect.Backend
	// LegacyAvailable is nil when the kernel has legacy x_tables.
	LegacyAvailable() error
	// LegacyPresence reads the legacy tables of the namespace at path.
	LegacyPresence(path string) (LegacyPresence, error)
	// NFTPresence reports whether nftmesh's table and iptables-nft
	// nat/mangle tables exist in the namespace at path.
	NFTPresence(path string) (ours, iptablesNFT bool, err error)
	// NFTForeign names another installer's capture in the nftables world
	// of the namespace at path (see Foreign).
	NFTForeign(path string) ([]string, error)
	// ForeignUserns reports whether the namespace at path is owned by a
	// user namespace other than this process's (see ErrUserNamespaced).
	ForeignUserns(path string) (bool, error)
	// Addrs lists the namespace's addresses in the kernel's order (see
	// netnsaddr.List).
	Addrs(path string) ([]netip.Addr, error)
}

// LegacyPresence is what the legacy tables of a namespace hold.
type LegacyPresence = iptables.Presence

// Pipeline runs the verbs against one Kernel. Front ends hold one (Linux()
// in production) so that tests can hand them an in-memory kernel.
type Pipeline struct{ k Kernel }

// New returns a pipeline over k.
func New(k Kernel) *Pipeline { return &Pipeline{k: k} }

var linux = New(linuxKernel{})

// Linux is the pipeline over the running kernel; the package-level verbs
// use it.
func Linux() *Pipeline { return linux }

// linuxKernel is the running kernel.
type linuxKernel struct{}

func (linuxKernel) OpenNetns(path string) (*Netns, error) { return hostns.Open(path) }

func (linuxKernel) Backend(name string) redirect.Backend {
	if name == Legacy {
		return iptables.New()
	}
	return nft.New()
}

func (linuxKernel) LegacyAvailable() error { return iptables.LegacyAvailable() }

func (linuxKernel) LegacyPresence(path string) (LegacyPresence, error) { return iptables.Probe(path) }

func (linuxKernel) ForeignUserns(path string) (bool, error) { return foreignUserns(path) }

func (linuxKernel) Addrs(path string) ([]netip.Addr, error) { return netnsaddr.List(path) }

// NFTPresence reads, from one table dump, whether our table exists and
// whether iptables-nft tables (ip/ip6 "nat" or "mangle") do.
func (linuxKernel) NFTPresence(netnsPath string) (ours, iptablesNFT bool, err error) {
	n, err := hostns.Open(netnsPath)
	if err != nil {
		return false, false, err
	}
	defer n.Close()
	c, err := nftables.New(nftables.WithNetNSFd(n.Fd()))
	if err != nil {
		return false, false, err
	}
	defer c.CloseLasting()
	tables, err := c.ListTables()
	if err != nil {
		return false, false, fmt.Errorf("listing nftables tables in %s: %w", netnsPath, err)
	}
	for _, t := range tables {
		switch {
		case t.Family == nftables.TableFamilyINet && t.Name == nft.TableName:
			ours = true
		case (t.Family == nftables.TableFamilyIPv4 || t.Family == nftables.TableFamilyIPv6) && (t.Name == "nat" || t.Name == "mangle"):
			iptablesNFT = true
		}
	}
	return ours, iptablesNFT, nil
}

// NFTForeign lists the tables of Istio's native nftables mode (inet
// istio-proxy-*) and, where iptables-nft tables exist, their ISTIO_*
// chains.
func (linuxKernel) NFTForeign(netnsPath string) ([]string, error) {
	n, err := hostns.Open(netnsPath)
	if err != nil {
		return nil, err
	}
	defer n.Close()
	c, err := nftables.New(nftables.WithNetNSFd(n.Fd()))
	if err != nil {
		return nil, fmt.Errorf("looking for foreign capture in %s: %w", netnsPath, err)
	}
	defer c.CloseLasting()
	tables, err := c.ListTables()
	if err != nil {
		return nil, fmt.Errorf("listing nftables tables in %s: %w", netnsPath, err)
	}
	var out []string
	xt := false
	for _, t := range tables {
		switch {
		case t.Family == nftables.TableFamilyINet && strings.HasPrefix(t.Name, "istio-proxy-"):
			out = append(out, "nftables table inet "+t.Name)
		case t.Family == nftables.TableFamilyIPv4 || t.Family == nftables.TableFamilyIPv6:
			xt = true
		}
	}
	if xt {
		chains, err := c.ListChains()
		if err != nil {
			return nil, fmt.Errorf("listing nftables chains in %s: %w", netnsPath, err)
		}
		for _, ch := range chains {
			fam := map[nftables.TableFamily]string{nftables.TableFamilyIPv4: "ipv4", nftables.TableFamilyIPv6: "ipv6"}[ch.Table.Family]
			if fam != "" && strings.HasPrefix(ch.Name, "ISTIO_") {
				out = append(out, "iptables-nft "+fam+" "+ch.Table.Name+" "+ch.Name)
			}
		}
	}
	return out, nil
}
