package capture

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/nftmesh/nftmesh/internal/hostns"
	"github.com/nftmesh/nftmesh/internal/netnsaddr"
	"github.com/nftmesh/nftmesh/iptables"
	"github.com/nftmesh/nftmesh/nft"
	"github.com/nftmesh/nftmesh/policyroute"
	"github.com/nftmesh/nftmesh/redirect"
)

// Kernel is everything the pipeline reads and writes below itself: the
// network namespace files, the two backends, and the probes selection and
// CHECK read. The pipeline keeps every decision (the host guard, the lock,
// selection, clean-up after a failure); a Kernel only answers.
//
// Paths passed to the methods are a namespace's pinned path (see pin).
type Kernel interface {
	// OpenNetns opens the network namespace file at path without blocking
	// and checks that it is one (see hostns.Open); the pipeline refuses
	// the host's.
	OpenNetns(path string) (*Netns, error)
	// Prepare starts on p, the plan an Apply is about to write, while the
	// pipeline locks and selects; the result (maybe nil) goes to Enter.
	Prepare(p redirect.Plan) Prepared
	// Enter opens what one verb reads and writes in n, whose pinned path is
	// path (see Visit); the visit's backends use prep (nil for none) for
	// its plan and refuse what g, the pipeline's host guard, refuses. The
	// pipeline enters after the host guard and the lock, so what the visit
	// reads is what the verb's writes start from.
	Enter(n *Netns, path string, prep Prepared, g Guard) (Visit, error)
	// LegacyAvailable is nil when the kernel has legacy x_tables.
	LegacyAvailable() error
	// Addrs lists the namespace's addresses in the kernel's order.
	Addrs(path string) ([]netip.Addr, error)
}

// Visit is one verb's way into one namespace: on Linux, sockets opened from
// inside it by one thread that entered it once. Close releases them; the
// Netns stays open.
type Visit interface {
	// Backend returns the backend named NFTables or Legacy, working in
	// the visited namespace.
	Backend(name string) redirect.Backend
	// LegacyPresence reads the namespace's legacy tables: nothing where
	// none exists, as on a kernel without legacy x_tables.
	LegacyPresence() (LegacyPresence, error)
	// NFTPresence reports whether nftmesh's table and iptables-nft
	// nat/mangle tables exist in the namespace.
	NFTPresence() (ours, iptablesNFT bool, err error)
	// NFTForeign names another installer's capture in the nftables world
	// of the namespace (see Foreign).
	NFTForeign() ([]string, error)
	// ForeignUserns reports whether the namespace is owned by a user
	// namespace other than this process's (see ErrUserNamespaced).
	ForeignUserns() (bool, error)
	Close() error
}

// Prepared is a Kernel's work on a plan ahead of its Apply, read only by
// the Kernel that made it.
type Prepared any

// LegacyPresence is what the legacy tables of a namespace hold.
type LegacyPresence = iptables.Presence

// Guard is the host check a pipeline applies (see AllowingOwnNetns).
type Guard = hostns.Guard

// Pipeline runs the verbs against one Kernel. Its guard is its own: the
// zero value refuses every namespace of the host's.
type Pipeline struct {
	k     Kernel
	guard Guard
}

// New returns a pipeline over k.
func New(k Kernel) *Pipeline { return &Pipeline{k: k} }

var linux = New(linuxKernel{})

// Linux is the pipeline over the running kernel.
func Linux() *Pipeline { return linux }

// LinuxVia is the pipeline over the running kernel in which the namespace
// file at path is reached through fd (O_PATH is enough), opened by another
// process in its own mount namespace and passed over a unix socket. Errors
// name path. fd stays the caller's to close.
//
// It starts listing the namespace's addresses at once, on a goroutine with
// a descriptor of its own: the agent has a core to spare while the call's
// pod is looked up, and the plan needs the addresses next.
func LinuxVia(path string, fd int) *Pipeline {
	k := viaKernel{path: path, fd: fd, addrs: &addrsResult{done: make(chan struct{})}}
	dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		k.addrs.err = fmt.Errorf("listing addresses: duplicating the descriptor of netns %s: %w", path, err)
		close(k.addrs.done)
		return New(k)
	}
	go func() {
		defer close(k.addrs.done)
		defer unix.Close(dup)
		// Outside the caller's recover a panic would end the agent with
		// every call in flight; it fails this call instead.
		defer func() {
			if p := recover(); p != nil {
				k.addrs.list, k.addrs.err = nil, fmt.Errorf("listing addresses of netns %s: panic: %v", path, p)
			}
		}()
		n, err := hostns.OpenFD(dup, path)
		if err != nil {
			k.addrs.err = fmt.Errorf("listing addresses: %w", err)
			return
		}
		defer n.Close()
		k.addrs.list, k.addrs.err = listAddrsIn(n, path)
	}()
	return New(k)
}

// listAddrsIn is netnsaddr.ListIn; tests replace it to make it panic.
var listAddrsIn = netnsaddr.ListIn

type addrsResult struct {
	done chan struct{}
	list []netip.Addr
	err  error
}

type linuxKernel struct{}

// viaKernel is the running kernel with one namespace path reached through
// a descriptor.
type viaKernel struct {
	linuxKernel
	path  string
	fd    int
	addrs *addrsResult
}

func (k viaKernel) OpenNetns(path string) (*Netns, error) {
	if path != k.path {
		return hostns.Open(path)
	}
	return hostns.OpenFD(k.fd, path)
}

func (k viaKernel) Addrs(path string) ([]netip.Addr, error) {
	if path != k.path {
		return netnsaddr.List(path)
	}
	<-k.addrs.done
	return slices.Clone(k.addrs.list), k.addrs.err
}

func (linuxKernel) OpenNetns(path string) (*Netns, error) { return hostns.Open(path) }

func (linuxKernel) LegacyAvailable() error { return iptables.LegacyAvailable() }

// Prepare has the nftables backend, the likeliest, prepare p on another
// goroutine (see nft.Backend.Prepare).
func (linuxKernel) Prepare(p redirect.Plan) Prepared { return nft.New().Prepare(p) }

func (linuxKernel) Addrs(path string) ([]netip.Addr, error) { return netnsaddr.List(path) }

// Enter opens, from one thread inside n, the sockets a verb uses there:
// nftables (nft.DialHere), rtnetlink for the policy routes and ::6, and
// the legacy tables'. Entering costs a thread switch and back.
func (linuxKernel) Enter(n *Netns, path string, prep Prepared, g Guard) (Visit, error) {
	pr, _ := prep.(*nft.Prepared)
	v := &linuxVisit{n: n, path: path, prep: pr, guard: g}
	err := n.Do(func() (err error) {
		if v.nf, err = nft.DialHere(); err != nil {
			return err
		}
		if v.route, err = policyroute.OpenHere(); err != nil {
			return err
		}
		v.xt, err = iptables.OpenHere()
		return err
	})
	if err != nil {
		v.Close()
		return nil, fmt.Errorf("opening sockets in netns %s: %w", path, err)
	}
	return v, nil
}

type linuxVisit struct {
	n     *Netns
	path  string
	nf    *nft.Conn
	route *policyroute.Handle
	xt    *iptables.Sockets
	prep  *nft.Prepared
	guard Guard
}

func (v *linuxVisit) Close() error {
	var err error
	if v.nf != nil {
		err = v.nf.Close()
	}
	if v.route != nil {
		v.route.Close()
	}
	if v.xt != nil {
		v.xt.Close()
	}
	return err
}

func (v *linuxVisit) Backend(name string) redirect.Backend {
	if name == Legacy {
		return iptables.New(iptables.WithGuard(v.guard))
	}
	b := nft.New(nft.WithGuard(v.guard)).Via(v.n.Fd(), v.nf, v.route)
	if v.prep != nil {
		b = b.With(v.prep)
	}
	return b
}

func (v *linuxVisit) LegacyPresence() (LegacyPresence, error) {
	pr, err := v.xt.Probe()
	if err != nil {
		return pr, fmt.Errorf("probing legacy tables in netns %s: %w", v.path, err)
	}
	return pr, nil
}

func (v *linuxVisit) ForeignUserns() (bool, error) { return ownerIsForeign(v.n.Fd(), v.path) }

// NFTPresence reads one table dump, which the visit's nftables backend
// reuses.
func (v *linuxVisit) NFTPresence() (ours, iptablesNFT bool, err error) {
	tables, err := v.nf.Tables()
	if err != nil {
		return false, false, fmt.Errorf("listing nftables tables in %s: %w", v.path, err)
	}
	for _, t := range tables {
		switch {
		case t.Family == unix.NFPROTO_INET && t.Name == nft.TableName:
			ours = true
		case (t.Family == unix.NFPROTO_IPV4 || t.Family == unix.NFPROTO_IPV6) && (t.Name == "nat" || t.Name == "mangle"):
			iptablesNFT = true
		}
	}
	return ours, iptablesNFT, nil
}

// NFTForeign lists the tables of Istio's native nftables mode (inet
// istio-proxy-*) and, where iptables-nft tables exist, their ISTIO_*
// chains.
func (v *linuxVisit) NFTForeign() ([]string, error) {
	tables, err := v.nf.Tables()
	if err != nil {
		return nil, fmt.Errorf("listing nftables tables in %s: %w", v.path, err)
	}
	var out []string
	xt := false
	for _, t := range tables {
		switch {
		case t.Family == unix.NFPROTO_INET && strings.HasPrefix(t.Name, "istio-proxy-"):
			out = append(out, "nftables table inet "+t.Name)
		case t.Family == unix.NFPROTO_IPV4 || t.Family == unix.NFPROTO_IPV6:
			xt = true
		}
	}
	if xt {
		chains, err := v.nf.Chains()
		if err != nil {
			return nil, fmt.Errorf("listing nftables chains in %s: %w", v.path, err)
		}
		for _, ch := range chains {
			fam := map[uint8]string{unix.NFPROTO_IPV4: "ipv4", unix.NFPROTO_IPV6: "ipv6"}[ch.Family]
			if fam != "" && strings.HasPrefix(ch.Name, "ISTIO_") {
				out = append(out, "iptables-nft "+fam+" "+ch.Table+" "+ch.Name)
			}
		}
	}
	return out, nil
}
