// Package inplace repairs a running pod's traffic capture inside its network
// namespace: Istio's repairPods mode, for pods that started before the
// nftmesh-cni plugin was in place on their node.
//
// It owns finding a pod's network namespace from the host's /proc (the one
// holding the pod's IPs whose processes are in the pod's cgroup, reached
// through its oldest process, the pause container) and programming the plan
// the plugin would have programmed. It does not decide which pods are broken
// (installer/repair does) nor write to the API server. Functions never log.
package inplace

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/nftmesh/nftmesh/internal/hostns"
	"github.com/nftmesh/nftmesh/internal/netnsaddr"
	"github.com/nftmesh/nftmesh/redirect/quote"
)

// ErrNotFound means no process on the host lives in a network namespace
// holding any of the pod's IPs: the pod is gone, or its sandbox is not up.
var ErrNotFound = errors.New("no network namespace on this host holds the pod's IPs")

// Netns is a pod's network namespace as found through a process in it.
type Netns struct {
	// Path is <proc>/<pid>/ns/net of the oldest process in the namespace
	// (the pause container), the path the backends program.
	Path string
	PID  int
	// Dev and Inode identify the namespace (nsfs): a reused PID shows
	// another identity.
	Dev, Inode uint64
	StartTicks uint64 // the process's start, in clock ticks after boot
	Candidates int    // how many distinct namespaces held one of the IPs
	Match      string // why this namespace is the pod's: MatchCgroup or MatchAddress
}

type nsID struct{ dev, ino uint64 }

// ownNetns is the namespace this process started in, read by the main
// thread during package initialisation (before any thread can have moved).
var ownNetns, ownNetnsErr = nsIdentity("/proc/thread-self/ns/net")

// nsIdentity stats path, a /proc/PID/ns/net magic link, through to its nsfs inode.
func nsIdentity(path string) (nsID, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return nsID{}, err
	}
	return nsID{dev: uint64(st.Dev), ino: st.Ino}, nil
}

// StartTicks reads field 22 (starttime) of <proc>/<pid>/stat. The command
// name (field 2) may hold spaces and parentheses, so fields are counted
// from the last ')'.
func StartTicks(procDir string, pid int) (uint64, error) {
	b, err := os.ReadFile(filepath.Join(procDir, strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, err
	}
	return parseStartTicks(b)
}

func parseStartTicks(stat []byte) (uint64, error) {
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, fmt.Errorf("parsing /proc stat %s: no ')' after the command name", quote.ValueN(string(stat), 80))
	}
	// After ')' come fields 3 (state), 4, ...: starttime (22) is the 20th.
	fields := bytes.Fields(stat[i+1:])
	const idx = 22 - 3
	if len(fields) <= idx {
		return 0, fmt.Errorf("parsing /proc stat %s: %d fields after the command name, want at least %d", quote.ValueN(string(stat), 80), len(fields), idx+1)
	}
	v, err := strconv.ParseUint(string(fields[idx]), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("parsing /proc stat starttime %q: %w", fields[idx], err)
	}
	return v, nil
}

// FindNetns walks procDir (the host's /proc) for the network namespace of
// the pod with the given UID that holds one of ips, and returns it through
// its oldest process. Each namespace's addresses are read as the plugin
// reads a pod's (netnsaddr.ListIn, from a thread inside it that hostns
// switches there and back).
// The host's namespace (procDir's PID 1's) and the caller's are never
// candidates: a pod IP there means a host-network pod.
//
// An IP alone does not name a pod: another cluster on the same machine (kind
// in a CI pod, nested containers) can hold the same private addresses, and
// programming its namespace would capture a stranger's traffic. So a
// namespace is the pod's when one of its processes is in the pod's cgroup
// (the kubelet names it after the pod's UID with either cgroup driver). Only
// where no process is in any pod's cgroup (no per-pod cgroups), and exactly
// one namespace holds the IPs, is that one taken on the IPs alone; an empty
// uid takes the oldest holding them. Vanished processes are skipped.
func FindNetns(procDir, uid string, ips []netip.Addr) (Netns, error) {
	if len(ips) == 0 {
		return Netns{}, errors.New("finding a pod's network namespace: the pod has no IPs")
	}
	want := map[netip.Addr]bool{}
	for _, ip := range ips {
		want[ip.Unmap()] = true
	}
	groups, order, err := walkNamespaces(procDir)
	if err != nil {
		return Netns{}, err
	}
	f := found{podCgroups: uid == ""}
	for _, id := range order {
		f.inspect(procDir, uid, id, groups[id], want)
	}
	return f.pick(uid, ips)
}

// nsGroup is the processes of one network namespace and its oldest.
type nsGroup struct {
	pid   int
	ticks uint64
	pids  []int // every process in the namespace, for its cgroups
}

// walkNamespaces groups procDir's processes by network namespace, in the
// order first seen, leaving out those that may never be a pod's.
func walkNamespaces(procDir string) (map[nsID]*nsGroup, []nsID, error) {
	entries, err := os.ReadDir(procDir)
	if err != nil {
		return nil, nil, fmt.Errorf("finding a pod's network namespace: reading %s: %w", procDir, err)
	}
	skip := map[nsID]bool{}
	if id, err := nsIdentity(filepath.Join(procDir, "1", "ns", "net")); err == nil {
		skip[id] = true
	}
	if ownNetnsErr == nil {
		skip[ownNetns] = true
	}
	// Nor this process: its threads visit pod namespaces (netlink and
	// nftables sockets are opened from inside them), and /proc/PID/ns/net
	// shows the main thread's.
	self, _ := os.Readlink(filepath.Join(procDir, "self"))

	groups := map[nsID]*nsGroup{}
	var order []nsID
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 0 || e.Name() == self {
			continue
		}
		id, err := nsIdentity(filepath.Join(procDir, e.Name(), "ns", "net"))
		if err != nil || skip[id] {
			continue // gone, a kernel thread, or not ours to see
		}
		ticks, err := StartTicks(procDir, pid)
		if err != nil {
			continue
		}
		g := groups[id]
		if g == nil {
			groups[id] = &nsGroup{pid: pid, ticks: ticks, pids: []int{pid}}
			order = append(order, id)
			continue
		}
		g.pids = append(g.pids, pid)
		if ticks < g.ticks || (ticks == g.ticks && pid < g.pid) {
			g.pid, g.ticks = pid, ticks
		}
	}
	return groups, order, nil
}

// found is what the walk learnt of the namespaces holding one of the IPs.
type found struct {
	ours, others []*Netns // holding an IP: in the pod's cgroup, or not
	foreign      int      // of others, those in another pod's cgroup
	podCgroups   bool     // some namespace's process is in a pod's cgroup
	lastErr      error
}

// inspect sorts the namespace id (its processes g) into f.
func (f *found) inspect(procDir, uid string, id nsID, g *nsGroup, want map[netip.Addr]bool) {
	path := filepath.Join(procDir, strconv.Itoa(g.pid), "ns", "net")
	ok, err := holdsAny(path, id, want)
	if err != nil {
		f.lastErr = err
		return
	}
	if !ok {
		if !f.podCgroups {
			f.podCgroups = cgroupOwner(procDir, []int{g.pid}, uid) != ""
		}
		return
	}
	n := &Netns{Path: path, PID: g.pid, Dev: id.dev, Inode: id.ino, StartTicks: g.ticks, Match: MatchAddress}
	owner := ""
	if uid != "" {
		owner = cgroupOwner(procDir, g.pids, uid)
	}
	switch owner {
	case ownerPod:
		n.Match = MatchCgroup
		f.ours = append(f.ours, n)
	case ownerOtherPod:
		f.foreign++
		f.others = append(f.others, n)
	default:
		f.others = append(f.others, n)
	}
	if owner != "" {
		f.podCgroups = true
	}
}

// pick is the pod's namespace among those found, or why there is none.
func (f *found) pick(uid string, ips []netip.Addr) (Netns, error) {
	candidates := len(f.ours) + len(f.others)
	var best *Netns
	switch {
	case len(f.ours) > 0:
		best = oldest(f.ours)
	case uid == "" && len(f.others) > 0:
		best = oldest(f.others)
	case len(f.others) == 1 && !f.podCgroups:
		best = f.others[0]
	case candidates > 0:
		return Netns{}, fmt.Errorf("%w (%v): %d network namespaces hold them (%d in other pods' cgroups), none in the cgroup of pod %s",
			ErrNotFound, ips, candidates, f.foreign, uid)
	case f.lastErr != nil:
		return Netns{}, fmt.Errorf("%w (%v); last error: %w", ErrNotFound, ips, f.lastErr)
	default:
		return Netns{}, fmt.Errorf("%w (%v)", ErrNotFound, ips)
	}
	best.Candidates = candidates
	return *best, nil
}

func oldest(ns []*Netns) *Netns {
	return slices.MinFunc(ns, func(a, b *Netns) int {
		return cmp.Or(cmp.Compare(a.StartTicks, b.StartTicks), cmp.Compare(a.PID, b.PID))
	})
}

// How a namespace was matched to the pod.
const (
	MatchCgroup  = "pod cgroup" // a process in it is in the pod's cgroup
	MatchAddress = "address"    // the only one holding the IPs; no pod cgroup seen
)

const (
	ownerPod      = "pod"
	ownerOtherPod = "other pod"
)

// cgroupOwner says whether one of pids is in the cgroup of the pod with
// uid (ownerPod), else whether one is in another pod's (ownerOtherPod),
// else "" (no pod cgroup, or nothing readable).
func cgroupOwner(procDir string, pids []int, uid string) string {
	owner := ""
	for _, pid := range pids {
		b, err := readLimited(filepath.Join(procDir, strconv.Itoa(pid), "cgroup"), maxCgroupFile)
		if err != nil {
			continue
		}
		for _, u := range PodUIDsInCgroups(b) {
			if strings.EqualFold(u, uid) {
				return ownerPod
			}
			owner = ownerOtherPod
		}
	}
	return owner
}

// maxCgroupFile bounds what is read of a /proc/PID/cgroup file (one line
// per hierarchy: a few hundred bytes in practice).
const maxCgroupFile = 64 << 10

func readLimited(path string, n int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, n))
}

// podCgroupUID is a pod UID as the kubelet spells it in cgroup names:
// "pod<uid>" with the cgroupfs driver, "…-pod<uid with _ for ->.slice"
// with the systemd one.
var podCgroupUID = regexp.MustCompile(`pod([0-9a-fA-F]{8}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{12})`)

// PodUIDsInCgroups returns the pod UIDs (in their API form, with dashes)
// named by the cgroup paths of a /proc/PID/cgroup file, once each.
func PodUIDsInCgroups(cgroupFile []byte) []string {
	var out []string
	for _, line := range bytes.Split(cgroupFile, []byte("\n")) {
		// hierarchy-ID:controllers:path; the path may hold ':' itself.
		parts := bytes.SplitN(line, []byte(":"), 3)
		if len(parts) != 3 {
			continue
		}
		for _, m := range podCgroupUID.FindAllSubmatch(parts[2], -1) {
			if u := strings.ToLower(strings.ReplaceAll(string(m[1]), "_", "-")); !slices.Contains(out, u) {
				out = append(out, u)
			}
		}
	}
	return out
}

// holdsAny reports whether the namespace at path (still the namespace id)
// has one of want's addresses on any interface.
func holdsAny(path string, id nsID, want map[netip.Addr]bool) (bool, error) {
	n, err := hostns.Open(path)
	if err != nil {
		return false, nil // the process exited since the walk
	}
	defer n.Close()
	if (nsID{dev: n.ID.Dev, ino: n.ID.Ino}) != id {
		return false, nil // PID reused by a process elsewhere
	}
	addrs, err := netnsaddr.ListIn(n, path)
	if err != nil {
		return false, err
	}
	for _, ip := range addrs {
		if want[ip.Unmap()] {
			return true, nil
		}
	}
	return false, nil
}
